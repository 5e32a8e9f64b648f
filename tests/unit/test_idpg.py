"""IDPG: PHM layers, sentence encoders, the generator on tiny-bert, counts of idpg.txt A.1.2."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from raypeft.config.loading import load_experiment
from raypeft.config.schema import ExperimentConfig, ModelConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims, build_method
from raypeft.methods.idpg.method import IDPG, IDPGConfig, idpg_params
from raypeft.methods.idpg.phm import PHMLinear, init_phm_a
from raypeft.methods.idpg.sentence_encoders import (
    BackboneEncoding,
    GloveEncoding,
    auto_pooling,
    glove_width,
    load_glove,
    pool,
)
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling.backbones import frozen_backbone, sentence_pooling
from raypeft.modeling.prompted import PromptedModel
from raypeft.training.optimizer import build_optimizer

# tiny-bert: d=32, N=2. PHM n=4 divides d, m=8 and t·d=96.
SMALL = {"prompt_length": 3, "generator_hidden": 8, "phm_n": 4}
T, D = 3, 32


def sentence_features(batch: int, width: int = D, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"sentence": torch.randn(batch, width, generator=gen)}


# ----------------------------------------------------------------------------- PHM


@pytest.mark.parametrize(("size_in", "size_out", "n"), [(8, 24, 4), (24, 8, 4), (6, 6, 1)])
def test_phm_equals_dense_kronecker_sum(size_in, size_out, n):
    gen = torch.Generator().manual_seed(0)
    layer = PHMLinear(size_in, size_out, n, generator=gen)
    with torch.no_grad():
        layer.bias.normal_(generator=gen)
    dense = sum(torch.kron(layer.phm_a[i], layer.phm_b[i]) for i in range(n))
    assert dense.shape == (size_out, size_in)
    x = torch.randn(5, 2, size_in, generator=gen)  # any leading dimensions
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, dense, layer.bias))
    count = sum(p.numel() for p in layer.parameters())
    assert count == n**3 + size_in * size_out // n + size_out


def test_phm_shared_a_is_used_not_registered():
    shared = torch.nn.Parameter(init_phm_a(4))
    first, second = PHMLinear(8, 4, 4, shared_a=shared), PHMLinear(4, 8, 4, shared_a=shared)
    assert first.phm_a is shared and second.phm_a is shared
    assert [n for n, _ in first.named_parameters()] == ["phm_b", "bias"]
    (first(torch.randn(2, 8)).sum() + second(torch.randn(2, 4)).sum()).backward()
    assert shared.grad is not None and shared.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=r"shape \(4, 4, 4\)"):
        PHMLinear(8, 4, 4, shared_a=torch.nn.Parameter(torch.zeros(2, 2, 2)))


def test_phm_rejects_sizes_n_does_not_divide():
    with pytest.raises(
        ValueError, match=r"n=4 must divide both sizes.*in_features=6, out_features=8"
    ):
        PHMLinear(6, 8, 4)


# ----------------------------------------------------------------------------- counts

ROBERTA_LARGE = BackboneDims(hidden_size=1024, num_layers=24, vocab_size=100, max_length=128)

TABLE = {
    "S-IDPG-PHM": (dict(layers="single", generator="phm", generator_hidden=256), 107_776),
    "S-IDPG-DNN": (dict(layers="single", generator="dnn", generator_hidden=256), 1_578_240),
    "M-IDPG-PHM": (dict(layers="multi", version="M", generator="phm"), 137_232),
    "M-IDPG-DNN": (dict(layers="multi", version="M", generator="dnn"), 221_200),
}


@pytest.fixture(scope="module")
def large_embeddings():
    return torch.nn.Embedding(100, 1024)


@pytest.mark.parametrize("row", list(TABLE))
def test_paper_table_counts(row, large_embeddings):
    settings, expected = TABLE[row]
    cfg = IDPGConfig(prompt_length=5, phm_n=16, **settings)  # m=16 by default
    assert cfg.num_params(ROBERTA_LARGE) == expected
    assert build_method(cfg, ROBERTA_LARGE, large_embeddings).num_trainable() == expected


def test_paper_table_glove_count(tmp_path, large_embeddings):
    # closed form with d_in=300 given explicitly ...
    assert (
        idpg_params(1024, 300, 5, 16, num_layers=24, multi=True, generator="phm", phm_n=4)
        == 144_704
    )
    # ... and a module reading a 300-d GloVe file (M version, each layer reads M(x))
    path = tmp_path / "glove.300d.txt"
    path.write_text("".join(f"w{i} " + " ".join(["0.1"] * 300) + "\n" for i in range(3)))
    cfg = IDPGConfig(
        encoder="glove",
        glove_path=str(path),
        generator_input="sentence",
        prompt_length=5,
        phm_n=4,
    )
    assert cfg.num_params(ROBERTA_LARGE) == 144_704
    assert build_method(cfg, ROBERTA_LARGE, large_embeddings).num_trainable() == 144_704
    # previous-layer input with d_in != d: the input layer keeps its own 300 → 16 layer
    previous = cfg.model_copy(update={"generator_input": "previous_layer"})
    extra = 1024 * 16 // 4 + 16 + 4**3
    assert previous.num_params(ROBERTA_LARGE) == 144_704 + extra
    assert build_method(previous, ROBERTA_LARGE, large_embeddings).num_trainable() == (
        144_704 + extra
    )


VARIANTS = {
    "S-version": dict(layers="multi", version="S"),
    "L-version": dict(layers="multi", version="L"),
    "L-sentence-dnn": dict(
        layers="multi", version="L", generator="dnn", generator_input="sentence"
    ),
    "shared-a-multi": dict(layers="multi", version="M", phm_shared_a=True),
    "own-a-single": dict(layers="single", phm_shared_a=False),
    "layer-norm": dict(layers="single", layer_norm=True),
    "residual-norm-L": dict(layers="multi", version="L", residual=True, layer_norm=True),
    "relu": dict(layers="single", activation="relu", generator="dnn"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_module_count_equals_closed_form(variant, tiny_backbone):
    backbone = tiny_backbone()
    cfg = IDPGConfig(**SMALL, **VARIANTS[variant])
    model = PromptedModel(backbone, cfg)
    assert model.method.num_trainable() == cfg.num_params(backbone.dims)
    groups = model.method.param_groups()
    assert list(groups) == ["generator"] == list(cfg.learning_rates())
    assert sum(p.numel() for p in groups["generator"]) == model.method.num_trainable()


# ----------------------------------------------------------------------------- generator


def test_zero_weight_degenerates_to_prompt_tuning(tiny_backbone, tiny_batch):
    backbone = tiny_backbone()
    cfg = IDPGConfig(layers="single", init_seed=3, **SMALL)
    method: IDPG = PromptedModel(backbone, cfg).method
    # the bias starts at PT's prompt of the same seed
    pt = PromptedModel(tiny_backbone(), PromptTuningConfig(prompt_length=T, init_seed=3)).method
    torch.testing.assert_close(method.prompt_bias[0].view(T, D), pt.prompt)
    with torch.no_grad():
        method.up[0].phm_b.zero_()  # W = Σ A_i ⊗ B_i = 0
    batch = tiny_batch(batch=4)
    embed = backbone.model.get_input_embeddings()
    kwargs = method.prepare_inputs(
        batch["input_ids"], batch["attention_mask"], None, embed, sentence_features(4)
    )
    prompts = kwargs["inputs_embeds"][:, :T]
    for prompt in prompts:  # the same prompt for every example: the bias, reshaped
        torch.testing.assert_close(prompt, method.prompt_bias[0].view(T, D))
    torch.testing.assert_close(kwargs["inputs_embeds"][:, T:], embed(batch["input_ids"]))


def test_prompts_depend_on_the_example(tiny_backbone, tiny_batch):
    model = PromptedModel(tiny_backbone(), IDPGConfig(layers="single", **SMALL))
    batch = tiny_batch(batch=3)
    embed = model.backbone.get_input_embeddings()
    kwargs = model.method.prepare_inputs(
        batch["input_ids"], batch["attention_mask"], None, embed, sentence_features(3)
    )
    prompts = kwargs["inputs_embeds"][:, :T]
    assert not torch.allclose(prompts[0], prompts[1])
    assert kwargs["attention_mask"].shape == (3, T + 16)


def test_missing_features_raise(tiny_backbone, tiny_batch):
    model = PromptedModel(tiny_backbone(), IDPGConfig(**SMALL))
    with pytest.raises(ValueError, match=r"features\['sentence'\]"):
        model(**tiny_batch())
    with pytest.raises(ValueError, match=r"shape \(batch, d_in\)=\(4, 32\)"):
        model(**tiny_batch(), features=sentence_features(4, width=7))


def _step(model, cfg, batch, features):
    exp = ExperimentConfig(
        name="unit", model=ModelConfig(name="tiny-bert", max_length=16), method=cfg
    )
    optimizer = build_optimizer(model, exp)
    model.train()
    loss = model(
        **batch, labels=torch.ones(len(batch["input_ids"]), dtype=torch.long), features=features
    ).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return optimizer


@pytest.mark.parametrize(
    "settings",
    [
        dict(layers="single"),
        dict(layers="multi", version="M"),
        dict(layers="multi", version="L", generator="dnn", generator_input="sentence"),
    ],
    ids=["S-IDPG", "M-IDPG-M", "M-IDPG-L"],
)
def test_forward_backward_trains_only_the_generator(tiny_backbone, tiny_batch, settings):
    cfg = IDPGConfig(**SMALL, **settings)
    model = PromptedModel(tiny_backbone(), cfg)
    assert model.method.uses_layer_prompts == (cfg.layers == "multi")
    batch, features = tiny_batch(batch=5), sentence_features(5)
    logits = model(**batch, features=features).logits
    assert logits.shape == (5, 2) and torch.isfinite(logits).all()
    frozen = {n: p.detach().clone() for n, p in model.backbone.named_parameters()}
    head = {n for n, p in model.backbone.named_parameters() if p.requires_grad}
    assert head == {"classifier.weight", "classifier.bias"}
    before = {n: p.detach().clone() for n, p in model.method.named_parameters()}
    optimizer = _step(model, cfg, batch, features)
    assert {g["name"]: g["lr"] for g in optimizer.param_groups}["generator"] == cfg.lr
    for name, value in model.backbone.named_parameters():
        assert torch.equal(value, frozen[name]) == (name not in head), name
    after = dict(model.method.named_parameters())
    assert set(after) == set(before)
    for name, value in after.items():
        assert not torch.equal(value, before[name]), name


def test_multi_layer_prompts_reach_every_layer(tiny_backbone, tiny_batch):
    cfg = IDPGConfig(layers="multi", version="M", **SMALL)
    model = PromptedModel(tiny_backbone(), cfg)
    model.eval()
    batch, features = tiny_batch(), sentence_features(4)
    before = model(**batch, features=features).logits
    with torch.no_grad():  # only layer 1's task prompt changes
        model.method.prompt_bias[1].add_(1.0)
    assert not torch.allclose(model(**batch, features=features).logits, before)


def test_previous_layer_input(tiny_backbone, tiny_batch):
    cfg = IDPGConfig(
        layers="multi", version="M", generator_input="previous_layer", pooling="mean", **SMALL
    )
    method = PromptedModel(tiny_backbone(), cfg).method
    batch, features = tiny_batch(), sentence_features(4)
    embed = tiny_backbone().model.get_input_embeddings()
    method.prepare_inputs(batch["input_ids"], batch["attention_mask"], None, embed, features)
    hidden = torch.randn(4, T + 16, D, generator=torch.Generator().manual_seed(1))
    mask = batch["attention_mask"].float()
    pooled = (hidden[:, T:] * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # mean
    prompt = method.layer_prompt(1, hidden)
    assert prompt.shape == (4, T, D)
    torch.testing.assert_close(prompt, method.generate(1, pooled))
    # prompt positions and padding do not enter the pooled input
    changed = hidden.clone()
    changed[:, :T] += 5.0
    changed[1, T + 14 :] += 5.0  # tiny_batch: example 1 has 14 real tokens, example 2 has 12
    changed[2, T + 12 :] += 5.0
    torch.testing.assert_close(method.layer_prompt(1, changed), prompt)
    changed[:, T] += 1.0  # a real token does
    assert not torch.allclose(method.layer_prompt(1, changed), prompt)
    # with sentence input every layer reads M(x), whatever the hidden states
    sentence = PromptedModel(
        tiny_backbone(), cfg.model_copy(update={"generator_input": "sentence"})
    ).method
    sentence.prepare_inputs(batch["input_ids"], batch["attention_mask"], None, embed, features)
    torch.testing.assert_close(
        sentence.layer_prompt(1, hidden), sentence.generate(1, features["sentence"])
    )


def test_save_load_round_trip_with_shared_a(tmp_path, tiny_backbone, tiny_batch):
    cfg = IDPGConfig(layers="single", **SMALL)  # S-IDPG: one A set shared by both PHM layers
    model = PromptedModel(tiny_backbone(), cfg)
    assert model.method.phm_a is not None
    _step(model, cfg, tiny_batch(), sentence_features(4))
    model.eval()
    batch, features = tiny_batch(), sentence_features(4, seed=2)
    expected = model(**batch, features=features).logits
    model.save_trainable(tmp_path)
    fresh = PromptedModel(tiny_backbone(), cfg)
    fresh.eval()
    fresh.load_trainable(tmp_path)
    assert torch.equal(fresh(**batch, features=features).logits, expected)


# ----------------------------------------------------------------------------- configs


def test_config_errors(tiny_backbone, tmp_path):
    dims = tiny_backbone().dims
    with pytest.raises(ValueError, match=r"`phm_n` must divide .* but got \(phm_n=5, d_in=32"):
        IDPGConfig(**{**SMALL, "phm_n": 5}).resolve(dims)
    with pytest.raises(ValueError, match=r"phm_n=4, d_in=32, t·d=96, d=32, m=6\)"):
        IDPGConfig(**{**SMALL, "generator_hidden": 6}).resolve(dims)
    with pytest.raises(ValueError, match="`phm_shared_a` applies to PHM generators only"):
        IDPGConfig(generator="dnn", phm_shared_a=True)
    glove = tmp_path / "g.txt"
    glove.write_text("the 0.1 0.2 0.3 0.4\n")
    residual = IDPGConfig(encoder="glove", glove_path=str(glove), residual=True, **SMALL)
    with pytest.raises(ValueError, match=r"`d_in == d` must hold, but got \(d_in=4, d=32\)"):
        residual.check_backbone(dims)


def test_feature_specs_and_keys(tmp_path):
    specs = {
        "first": IDPGConfig(pooling="first").feature_specs()["sentence"],
        "mean": IDPGConfig(pooling="mean").feature_specs()["sentence"],
        "glove": IDPGConfig(encoder="glove").feature_specs()["sentence"],
        "file": IDPGConfig(encoder="glove", glove_path="g.txt").feature_specs()["sentence"],
    }
    assert isinstance(specs["first"], BackboneEncoding)
    assert isinstance(specs["glove"], GloveEncoding) and specs["glove"].path is None
    assert len({s.key for s in specs.values()}) == 4
    assert specs["file"].path.endswith("g.txt") and specs["file"].path.startswith("/")


def test_budget_picks_the_largest_fitting_hidden_size(tiny_backbone):
    dims = tiny_backbone().dims
    for settings in (dict(generator="phm"), dict(generator="dnn", layers="single")):
        cfg = IDPGConfig(**SMALL, **settings)
        per_m = cfg.num_params(dims)  # m=8
        budget = per_m + 1000
        budgeted = cfg.model_copy(update={"budget_params": budget})
        resolved = budgeted.resolve(dims)
        m, step = resolved.generator_hidden, 4 if settings["generator"] == "phm" else 1
        assert m % step == 0 and m > 8
        assert budgeted.num_params(dims) == resolved.num_params(dims) <= budget
        bigger = resolved.model_copy(update={"generator_hidden": m + step, "budget_params": None})
        assert bigger.num_params(dims) > budget
        assert resolved.derived() == {"generator_hidden": m} and cfg.derived() == {}
        assert resolved.resolve(dims) == resolved  # stable once resolved
        options = cfg.budget_options(budget, dims)
        assert options[0].settings == {"generator_hidden": m}
        assert all(0 <= o.slack for o in options)
        sizes = [o.settings["generator_hidden"] for o in options]
        assert sizes == sorted(sizes, reverse=True) and sizes[-1] == step
        model = PromptedModel(tiny_backbone(), budgeted)
        assert model.method.num_trainable() == budgeted.num_params(dims)
    with pytest.raises(ValueError, match="`budget_params >= "):
        IDPGConfig(**SMALL, budget_params=10).resolve(dims)
    assert IDPGConfig(**SMALL).budget_options(10, dims) == []


# ----------------------------------------------------------------------------- encoders


def test_glove_averages_known_lowercased_words(tmp_path):
    lines = ["the 1 0 0", "cat 0 2 0", "dog 0 0 4", "new york 9 9 9"]
    text = "\n".join(lines) + "\n"
    plain = tmp_path / "tiny.txt"
    plain.write_text(text)
    zipped = tmp_path / "tiny.txt.gz"
    with gzip.open(zipped, "wt") as f:
        f.write("4 3\n" + text)  # word2vec-style header line
    npy = tmp_path / "matrix.npy"
    np.save(npy, np.array([[1, 0, 0], [0, 2, 0], [0, 0, 4]], np.float32))
    (tmp_path / "matrix.vocab").write_text("the\ncat\ndog\n")
    texts = ["The CAT, the dog!", "unknown words only", "Cat"]
    expected = np.array([[0.5, 0.5, 1.0], [0, 0, 0], [0, 2, 0]], np.float32)
    for path in (plain, zipped, npy):
        assert glove_width(str(path)) == 3
        out = GloveEncoding(path=str(path)).compute(texts, {}, None)
        assert out.dtype == np.float32 and out.shape == (3, 3)
        np.testing.assert_allclose(out, expected)
    assert load_glove(str(plain))[0]["new york"] == 3


def test_packaged_glove_loads():
    vocab, vectors = load_glove(None)
    assert vectors.shape == (400_000, 50) and vectors.dtype == np.float32
    assert glove_width(None) == 50
    out = GloveEncoding().compute(["the"], {}, None)
    np.testing.assert_allclose(out[0], vectors[vocab["the"]])


def test_glove_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ConfigError, match=rf"method.glove_path: {missing}: file not found"):
        GloveEncoding(path=str(missing)).compute(["a"], {}, None)
    bad = tmp_path / "bad.txt"
    bad.write_text("the x y\n")
    with pytest.raises(ConfigError) as info:
        GloveEncoding(path=str(bad)).compute(["a"], {}, None)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    lonely = tmp_path / "sub" / "m.npy"
    lonely.parent.mkdir()
    np.save(lonely, np.zeros((2, 3), np.float32))
    with pytest.raises(ConfigError, match="no word list beside it"):
        load_glove(str(lonely))


@pytest.mark.parametrize("how", ["first", "mean", "last"])
def test_backbone_encoding_equals_manual_pooled_forward(tiny_model_cfg, tiny_backbone, how):
    arrays = {k: v.numpy() for k, v in _token_arrays().items()}
    backbone = frozen_backbone(tiny_model_cfg)  # what the driver hands to feature specs
    out = BackboneEncoding(pooling=how).compute([], arrays, backbone)
    assert out.dtype == np.float32 and out.shape == (5, D)
    bert = tiny_backbone(seed=0).model.bert  # the same seed-0 backbone, built by hand
    tensors = _token_arrays()
    with torch.no_grad():
        hidden = bert(**tensors).last_hidden_state
    mask = tensors["attention_mask"]
    real = mask.sum(1)
    if how == "first":
        expected = hidden[:, 0]
    elif how == "last":
        expected = hidden[torch.arange(5), real - 1]
    else:
        expected = torch.stack([hidden[i, : real[i]].mean(0) for i in range(5)])
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_a_checkpoints_resolved_pooling_gets_its_features(tiny_model_cfg):
    """A checkpoint saves ``pooling: auto`` as the pooling it resolved to: another feature key
    than the driver computed. ensure_features computes it for the splits asked (the test
    split, to score the chosen trial) and leaves the others alone."""
    from raypeft.training.datasets import ensure_features, split_dataset

    arrays = {k: v.numpy() for k, v in _token_arrays().items()}
    arrays["labels"] = np.zeros(5, dtype=np.int64)
    task = TokenizedTask(
        spec=TaskSpec(name="t", text_column="text", num_labels=2),
        label_names=["a", "b"],
        splits={"train": arrays, "validation": arrays, "test": arrays},
        texts={split: [""] * 5 for split in ("train", "validation", "test")},
    )
    cfg = ExperimentConfig(name="x", model=tiny_model_cfg, method=IDPGConfig(**SMALL))
    ensure_features(task, cfg)  # as the driver: the key of `auto`
    saved = cfg.model_copy(update={"method": cfg.method.model_copy(update={"pooling": "first"})})
    (auto_key,) = task.features
    ensure_features(task, saved, ("test",))
    (first_key,) = set(task.features) - {auto_key}
    assert list(task.features[first_key]) == ["test"]
    np.testing.assert_array_equal(  # `auto` is `first` on this BERT
        split_dataset(task, saved, "test").features["sentence"],
        task.features[auto_key]["test"],
    )


# ----------------------------------------------------------------------------- pooling: auto


def test_auto_pooling_follows_the_backbone():
    """The paper's first token ([CLS], §4.5.1), unless the backbone declares its sentence
    pooling (mean for all-MiniLM-L6-v2); a decoder's last real token."""
    encoder = BackboneDims(hidden_size=32, num_layers=2, vocab_size=100, max_length=16)
    cases = {
        encoder: "first",
        replace(encoder, kind="seq2seq"): "first",
        replace(encoder, kind="decoder"): "last",
        replace(encoder, sentence_pooling="mean"): "mean",
        replace(encoder, kind="decoder", sentence_pooling="mean"): "mean",
        replace(encoder, sentence_pooling="first"): "first",
    }
    assert IDPGConfig().pooling == "auto"
    for dims, expected in cases.items():
        assert auto_pooling(dims) == expected
        assert IDPGConfig(**SMALL).resolve(dims).pooling == expected
        for chosen in ("first", "mean", "last"):  # a chosen pooling is kept
            assert IDPGConfig(**SMALL, pooling=chosen).resolve(dims).pooling == chosen
    resolved = IDPGConfig(**SMALL).resolve(encoder)
    assert resolved.resolve(encoder) == resolved and resolved.derived() == {}


def _sentence_transformers_folder(root, pooling_config: dict, modules: bool = True):
    folder = root / "st-model"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    if modules:
        kinds = {"": "Transformer", "1_Pooling": "Pooling"}
        entries = [
            {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
            for i, (path, kind) in enumerate(kinds.items())
        ]
        (folder / "modules.json").write_text(json.dumps(entries))
    return str(folder)


def test_sentence_pooling_is_read_from_the_model_folder(tmp_path):
    flags = {
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False,
        "pooling_mode_lasttoken": False,
    }
    assert sentence_pooling("minilm") == "mean"  # the packaged all-MiniLM-L6-v2
    assert sentence_pooling("tiny-bert") is None and sentence_pooling("tiny-t5") is None
    for i, (flag, expected) in enumerate(
        [
            ("pooling_mode_cls_token", "first"),
            ("pooling_mode_mean_tokens", "mean"),
            ("pooling_mode_lasttoken", "last"),
            ("pooling_mode_max_tokens", None),  # not one raypeft reproduces: the paper's rule
        ]
    ):
        folder = _sentence_transformers_folder(tmp_path / str(i), {**flags, flag: True})
        assert sentence_pooling(folder) == expected
    named = _sentence_transformers_folder(tmp_path / "named", {"pooling_mode": "cls"})
    assert sentence_pooling(named) == "first"
    # a pooling folder that modules.json does not name is not a sentence-transformers model
    loose = _sentence_transformers_folder(
        tmp_path / "loose", {**flags, "pooling_mode_mean_tokens": True}, modules=False
    )
    assert sentence_pooling(loose) is None
    assert sentence_pooling(str(tmp_path / "missing")) is None


def test_minilm_dims_declare_mean_pooling():
    """What the driver's backbone tells IDPG: M(x) of the packaged MiniLM is its mean."""
    dims = frozen_backbone(ModelConfig(name="minilm", max_length=16)).dims  # config only
    assert dims.sentence_pooling == "mean"
    assert IDPGConfig(**{**SMALL, "phm_n": 2}).resolve(dims).pooling == "mean"


def test_auto_previous_layer_input_is_its_first_token(tiny_backbone, tiny_batch):
    cfg = IDPGConfig(layers="multi", version="M", generator_input="previous_layer", **SMALL)
    method = PromptedModel(tiny_backbone(), cfg).method
    assert method.config.pooling == "first"  # resolved on tiny-bert (no declared pooling)
    batch = tiny_batch()
    embed = tiny_backbone().model.get_input_embeddings()
    method.prepare_inputs(
        batch["input_ids"], batch["attention_mask"], None, embed, sentence_features(4)
    )
    hidden = torch.randn(4, T + 16, D, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(method.layer_prompt(1, hidden), method.generate(1, hidden[:, T]))


def test_auto_encoding_is_the_first_token_on_a_plain_encoder(tiny_model_cfg):
    arrays = {k: v.numpy() for k, v in _token_arrays().items()}
    backbone = frozen_backbone(tiny_model_cfg)
    assert backbone.dims.sentence_pooling is None
    auto = BackboneEncoding(pooling="auto").compute([], arrays, backbone)
    np.testing.assert_array_equal(
        auto, BackboneEncoding(pooling="first").compute([], arrays, backbone)
    )
    assert IDPGConfig().feature_specs()["sentence"].pooling == "auto"


def test_shipped_idpg_space_trains_as_the_paper():
    """search_spaces/idpg.yaml: a constant learning rate (Table 4); M(x) pooled by auto."""
    cfg = load_experiment(Path(__file__).parents[2] / "search_spaces" / "idpg.yaml")
    assert cfg.train.schedule == "constant"
    assert cfg.method.pooling == "auto"


def _token_arrays() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(1000, 5000, (5, 16), generator=gen)
    mask = torch.ones(5, 16, dtype=torch.long)
    for i, real in enumerate((16, 9, 4, 12, 1)):
        ids[i, real:], mask[i, real:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def test_pool_handles_left_padding():
    hidden = torch.arange(12.0).view(1, 4, 3).repeat(2, 1, 1)
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])
    torch.testing.assert_close(pool(hidden, mask, "first"), hidden[[0, 1], [2, 0]])
    torch.testing.assert_close(pool(hidden, mask, "last"), hidden[[0, 1], [3, 2]])
    torch.testing.assert_close(pool(hidden, mask, "mean")[0], hidden[0, 2:].mean(0))


# ----------------------------------------------------------------------------- driver


def _split(n: int, seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    ids = rng.integers(1000, 5000, (n, 16))
    ids[:, 0], ids[:, 1] = 101, np.where(labels == 1, 3000, 2000)
    real = rng.integers(6, 17, n)
    mask = (np.arange(16)[None, :] < real[:, None]).astype(np.int64)
    arrays = {
        "input_ids": np.where(mask == 1, ids, 0).astype(np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((n, 16), np.int64),
        "labels": labels.astype(np.int64),
    }
    texts = ["good fun" if y else "bad film" for y in labels]
    return arrays, texts


def test_driver_precomputes_features_once_and_training_reuses_them(tmp_path, monkeypatch):
    import raypeft.methods.idpg.sentence_encoders as encoders
    from raypeft.search.run import precompute_features
    from raypeft.training.loop import train

    glove = tmp_path / "glove.txt"
    glove.write_text("good 1 0 0 0\nbad 0 1 0 0\nfilm 0 0 1 0\n")
    splits = {
        name: _split(n, seed)
        for seed, (name, n) in enumerate([("train", 32), ("validation", 16), ("test", 16)])
    }
    task = TokenizedTask(
        spec=TaskSpec("synthetic", "text", num_labels=2, metrics=("accuracy",)),
        label_names=None,
        splits={k: v[0] for k, v in splits.items()},
        texts={k: v[1] for k, v in splits.items()},
    )
    cfg = ExperimentConfig.model_validate(
        {
            "name": "unit",
            "model": {"name": "tiny-bert", "max_length": 16},
            "method": {"name": "idpg", **SMALL, "glove_path": str(glove)},
            "train": {"max_steps": 4, "eval_every": 2, "batch_size": 8, "head_lr": 1e-2},
            # 3 versions × 2 encoders = 6 trial methods, but only 2 distinct encodings
            "space": {
                "method.version": {"choice": ["S", "M", "L"]},
                "method.encoder": {"choice": ["backbone", "glove"]},
            },
        }
    )
    calls = []
    for cls in (encoders.BackboneEncoding, encoders.GloveEncoding):
        original = cls.compute

        def counted(self, texts, arrays, model_cfg, _original=original):
            calls.append(type(self).__name__)
            return _original(self, texts, arrays, model_cfg)

        monkeypatch.setattr(cls, "compute", counted)
    precompute_features(cfg, task, say=lambda *_: None)
    assert sorted(calls) == ["BackboneEncoding"] * 3 + ["GloveEncoding"] * 3  # once per split
    assert len(task.features) == 2
    backbone_key = BackboneEncoding().key
    assert task.features[backbone_key]["train"].shape == (32, D)
    glove_out = task.features[GloveEncoding(path=str(glove)).key]
    assert glove_out["validation"].shape == (16, 4)

    def forbidden(*_args, **_kwargs):
        raise AssertionError("a trial computed a sentence encoding")

    for cls in (encoders.BackboneEncoding, encoders.GloveEncoding):
        monkeypatch.setattr(cls, "compute", forbidden)
    for encoder in ("backbone", "glove"):
        method = cfg.method.model_copy(update={"encoder": encoder})
        reports: list[dict] = []

        def report(metrics, folder, _reports=reports):
            _reports.append(metrics)

        best = train(cfg.model_copy(update={"method": method}), task, report)
        assert [r["step"] for r in reports] == [2, 4] and "val_accuracy" in best
