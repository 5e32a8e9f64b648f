"""The papers' parameter counts, at the papers' shapes taken from real transformers configs.

IDPG Table 2 (RoBERTa-large: d=1024, N=24) and DePT's 76,800 (T5-base: d=768, s=256, its
12 encoder layers). Each count is checked twice: the closed form (``num_params``) and the
module the method builds (``num_trainable``). Only the shapes come from the configs: no
24-layer model is built, and the word embedding handed to the methods is a small stand-in.
"""

from __future__ import annotations

import pytest
import torch
from transformers import RobertaConfig, T5Config

from raypeft.methods import build_method
from raypeft.methods.deep_prompts import DeepPromptConfig
from raypeft.methods.dept import DePTConfig
from raypeft.methods.idpg.method import IDPGConfig
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling.backbones import backbone_dims

ROBERTA_LARGE = backbone_dims(
    RobertaConfig(
        vocab_size=50265,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
    ),
    max_length=128,
)
T5_BASE = backbone_dims(
    T5Config(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12),
    max_length=256,
)


def both_counts(cfg, dims) -> tuple[int, int]:
    embeddings = torch.nn.Embedding(100, dims.hidden_size)  # only its width matters here
    return cfg.num_params(dims), build_method(cfg.resolve(dims), dims, embeddings).num_trainable()


@pytest.fixture(scope="module")
def glove_300d(tmp_path_factory):
    """A GloVe text file of width 300 (the paper's d_in); two words suffice for the shapes."""
    path = tmp_path_factory.mktemp("glove") / "glove.300d.txt"
    path.write_text("".join(f"{w} " + " ".join(["0.1"] * 300) + "\n" for w in ("good", "bad")))
    return str(path)


def test_shapes_come_from_the_configs():
    assert (ROBERTA_LARGE.hidden_size, ROBERTA_LARGE.num_layers) == (1024, 24)
    assert ROBERTA_LARGE.kind == "encoder"
    assert (T5_BASE.hidden_size, T5_BASE.num_layers, T5_BASE.kind) == (768, 12, "seq2seq")


S_IDPG = dict(layers="single", generator_hidden=256)
M_IDPG = dict(layers="multi", version="M", generator_hidden=16)


@pytest.mark.parametrize(
    ("label", "settings", "expected"),
    [
        ("S-IDPG-PHM", dict(S_IDPG, generator="phm", phm_n=16), 107_776),
        ("S-IDPG-DNN", dict(S_IDPG, generator="dnn"), 1_578_240),
        ("M-IDPG-PHM", dict(M_IDPG, generator="phm", phm_n=16), 137_232),
        ("M-IDPG-DNN", dict(M_IDPG, generator="dnn"), 221_200),
    ],
)
def test_idpg_table_2(label, settings, expected):
    cfg = IDPGConfig(prompt_length=5, generator_input="sentence", **settings)
    assert both_counts(cfg, ROBERTA_LARGE) == (expected, expected), label


def test_m_idpg_phm_glove(glove_300d):
    cfg = IDPGConfig(
        layers="multi",
        version="M",
        generator="phm",
        generator_hidden=16,
        prompt_length=5,
        phm_n=4,
        encoder="glove",
        glove_path=glove_300d,
        generator_input="sentence",
    )
    assert both_counts(cfg, ROBERTA_LARGE) == (144_704, 144_704)


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (PromptTuningConfig(prompt_length=5), 5_120),  # PT (t=5)
        (PromptTuningConfig(prompt_length=134), 137_216),  # PT-134, matched to M-IDPG-PHM
        (DeepPromptConfig(style="hidden", prompt_length=5), 122_880),  # P-tuning v2 (t=5)
    ],
    ids=["PT-5", "PT-134", "P-tuning-v2-hidden-5"],
)
def test_idpg_table_2_baselines(cfg, expected):
    assert both_counts(cfg, ROBERTA_LARGE) == (expected, expected)


def test_prefix_kv_style_doubles_the_hidden_style():
    cfg = DeepPromptConfig(style="kv", prompt_length=5)
    assert both_counts(cfg, ROBERTA_LARGE) == (2 * 122_880, 2 * 122_880)


@pytest.mark.parametrize(("m", "r"), [(20, 60), (40, 45), (60, 30), (80, 15)])
def test_dept_at_t5_base_equals_pt_100(m, r):
    cfg = DePTConfig(prompt_length=m, budget_prompt_length=100)
    assert cfg.resolve(T5_BASE).rank == r
    assert both_counts(cfg, T5_BASE) == (76_800, 76_800)
    assert both_counts(PromptTuningConfig(prompt_length=100), T5_BASE) == (76_800, 76_800)
