"""The contract every registered method keeps, on every backbone kind it supports.

Cases are generated from the registry: each method's ``examples()`` (one small config per
variant) × the tiny encoder (BERT), seq2seq (T5) and decoders (GPT-2, LLaMA with grouped-query
attention). A new method is covered by registering it; nothing here names a method.

The task is a small synthetic sentiment set tokenised by the real pipeline (right padding for
encoder and seq2seq, left padding and no segment ids for decoders, labels as text for T5), and
per-example features (IDPG's sentence encodings) come from the real driver-side computation.

Training, gradients and the save/load round trip are checked in fp32 and in bf16 (autocast
over fp32 frozen weights, as on a CPU), and bf16 also with the frozen weights cast to bf16 (as
on a GPU: :func:`raypeft.modeling.precision.backbone_dtype`), so that layout is tested on a
machine without one.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from raypeft.config.schema import ExperimentConfig, ModelConfig, TaskConfig, TrainConfig
from raypeft.methods import METHODS
from raypeft.modeling.build import build_model
from raypeft.modeling.precision import cast_frozen
from raypeft.modeling.prompted import TRAINABLE_FILE
from raypeft.training.datasets import ensure_features, split_dataset
from raypeft.training.optimizer import build_optimizer, build_scheduler, optimizer_step

BACKBONES = ["tiny-bert", "tiny-t5", "tiny-gpt2", "tiny-llama"]
MAX_LENGTH = 16
CASES = [
    pytest.param(name, variant, backbone, id=f"{name}-{variant}-{backbone}")
    for name, cls in sorted(METHODS.items())
    for variant in cls.config_cls.examples()
    for backbone in BACKBONES
]
# "bf16-weights": bf16 with the frozen weights themselves in bf16, the layout GPUs use
PRECISIONS = ["fp32", "bf16"]
LOW_PRECISIONS = ["bf16", "bf16-weights"]

WORDS = {0: ["bad", "awful", "sad", "poor", "boring"], 1: ["good", "great", "happy", "fine", "fun"]}


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contract-task")
    rng = random.Random(0)
    files = {}
    for split, n in (("train", 48), ("validation", 16), ("test", 16)):
        rows = []
        for _ in range(n):
            label = rng.randint(0, 1)
            text = " ".join(rng.choices(WORDS[label], k=rng.randint(2, 8)))
            rows.append({"text": text, "label": ["negative", "positive"][label]})
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = str(path)
    return files


_TASKS: dict = {}


def make_case(name: str, variant: str, backbone: str, task_files, precision: str = "fp32"):
    """(cfg, task, model, batch) for one case; skips where the method does not apply."""
    from raypeft.data import prepare_task
    from raypeft.modeling.backbones import backbone_dims, load_config

    method = METHODS[name].config_cls.examples()[variant]
    cfg = ExperimentConfig(
        name="contract",
        model=ModelConfig(name=backbone, max_length=MAX_LENGTH),
        task=TaskConfig(name="files", files=task_files, text_column="text"),
        method=method,
        train=TrainConfig(max_steps=20, eval_every=20, batch_size=8, head_lr=1e-2, seed=0),
    )
    dims = backbone_dims(load_config(cfg.model, 2, "classification"), MAX_LENGTH, backbone)
    try:
        method.resolve(dims).check_backbone(dims)
    except ValueError as exc:
        pytest.skip(f"{name}/{variant} does not apply to {backbone} ({dims.kind}): {exc}")
    if backbone not in _TASKS:
        _TASKS[backbone] = prepare_task(cfg.task, cfg.model)
    task = _TASKS[backbone]
    ensure_features(task, cfg)
    torch.manual_seed(0)
    model = build_precision_model(cfg, task, precision)
    loader = DataLoader(split_dataset(task, cfg, "train"), batch_size=8)
    return cfg, task, model, next(iter(loader))


def build_precision_model(cfg, task, precision: str):
    """The case's model in ``precision`` (a resolved one, or "bf16-weights")."""
    model = build_model(cfg, task, precision=precision.removesuffix("-weights"))
    if precision.endswith("-weights"):
        cast_frozen(model.backbone, torch.bfloat16)
    return model


def method_tensors(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.method.named_parameters() if p.requires_grad}


def train_steps(model, cfg, batch, steps: int) -> list[float]:
    optimizer = build_optimizer(model, cfg)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
def test_shapes_and_predictions(name, variant, backbone, task_files):
    cfg, task, model, batch = make_case(name, variant, backbone, task_files)
    model.eval()
    out = model(**batch)
    assert torch.isfinite(out.loss)
    preds = model.predict(**batch)
    if model.kind == "seq2seq":
        target_len = batch["target_ids"].shape[1]
        assert out.logits.shape == (8, target_len, model.backbone.config.vocab_size)
        assert preds.shape == (8,) and set(preds.tolist()) <= {-1, 0, 1}
    else:
        assert out.logits.shape == (8, 2)
        assert preds.shape == (8, 2) and np.isfinite(preds).all()


@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
def test_prompt_positions_and_prefix_are_what_the_method_prepends(
    name, variant, backbone, task_files
):
    """What preflight checks against the position embeddings and what a pack registry seats
    trials by (their prompt shape) is what the method's inputs hold."""
    _, _, model, batch = make_case(name, variant, backbone, task_files)
    resolved = model.method.config.resolve(model.method.dims)
    kwargs = model.backbone_inputs(
        batch["input_ids"],
        batch["attention_mask"],
        batch.get("token_type_ids"),
        batch.get("features"),
    )
    cache = kwargs.get("past_key_values")
    positions = kwargs["inputs_embeds"].shape[1] - batch["input_ids"].shape[1]
    assert positions == resolved.prompt_positions()
    assert (0 if cache is None else cache.get_seq_length()) == resolved.prefix_length()


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
def test_only_the_method_and_head_train(name, variant, backbone, precision, task_files):
    cfg, task, model, batch = make_case(name, variant, backbone, task_files, precision)
    head = {id(p) for p in model.param_groups()["head"]}
    frozen = {
        n: p.detach().clone() for n, p in model.backbone.named_parameters() if id(p) not in head
    }
    # the backbone is frozen (its head aside), and every trainable tensor is in a group
    assert not any(p.requires_grad for n, p in model.backbone.named_parameters() if n in frozen)
    grouped = {id(p) for params in model.param_groups().values() for p in params}
    assert grouped == {id(p) for p in model.parameters() if p.requires_grad}
    assert set(model.method.param_groups()) == set(cfg.method.learning_rates())
    before = method_tensors(model)
    assert before, "the method has no trainable tensors"
    train_steps(model, cfg, batch, steps=3)
    after = method_tensors(model)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"method tensors that did not train: {unchanged}"
    moved = [n for n, p in model.backbone.named_parameters() if n in frozen]
    assert all(torch.equal(frozen[n], dict(model.backbone.named_parameters())[n]) for n in moved)


@pytest.mark.parametrize("precision", [*PRECISIONS, "bf16-weights"])
@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
def test_loss_falls_on_a_fixed_batch(name, variant, backbone, precision, task_files):
    cfg, task, model, batch = make_case(name, variant, backbone, task_files, precision)
    model.eval()
    with torch.no_grad():
        first = model(**batch).loss.item()
    train_steps(model, cfg, batch, steps=15)
    model.eval()
    with torch.no_grad():
        last = model(**batch).loss.item()
    assert last < first, f"loss went {first:.4f} -> {last:.4f}"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
def test_save_load_round_trip(name, variant, backbone, precision, task_files, tmp_path):
    cfg, task, model, batch = make_case(name, variant, backbone, task_files, precision)
    train_steps(model, cfg, batch, steps=2)  # move every tensor away from its initial value
    model.eval()
    with torch.no_grad():
        expected = model(**batch).logits
    model.save_trainable(tmp_path)
    torch.manual_seed(123)  # a fresh model with a different head initialisation
    fresh = build_precision_model(cfg, task, precision)
    fresh.eval()
    fresh.load_trainable(tmp_path)
    with torch.no_grad():
        assert torch.allclose(fresh(**batch).logits, expected, atol=1e-6)
    saved = load_file(str(tmp_path / TRAINABLE_FILE))
    assert {v.dtype for v in saved.values() if v.is_floating_point()} <= {torch.float32}


@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
def test_count_equals_closed_form(name, variant, backbone, task_files):
    cfg, task, model, batch = make_case(name, variant, backbone, task_files)
    assert model.method.num_trainable() == cfg.method.num_params(model.dims)
    if cfg.method.budget_params is not None:
        assert cfg.method.num_params(model.dims) <= cfg.method.budget_params


@pytest.mark.parametrize("precision", LOW_PRECISIONS)
@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
def test_low_precision_keeps_what_trains_in_fp32(name, variant, backbone, precision, task_files):
    cfg, task, model, batch = make_case(name, variant, backbone, task_files, precision)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg.train)
    model.train()
    for _ in range(2):
        loss = model(**batch).loss
        assert loss.dtype == torch.float32 and torch.isfinite(loss)
        optimizer_step(loss, model, optimizer, scheduler, cfg.train.max_grad_norm)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32}
    assert {p.grad.dtype for p in trainable if p.grad is not None} <= {torch.float32}
    states = [t for state in optimizer.state.values() for t in state.values() if t.ndim > 0]
    assert states and {t.dtype for t in states} == {torch.float32}  # AdamW's moments
    frozen = {p.dtype for p in model.backbone.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16 if precision == "bf16-weights" else torch.float32}
    no_grad = [n for n, p in model.method.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f"method tensors without a gradient: {no_grad}"
