"""A pack trains each member exactly as the member trains alone: the contract every registered
method keeps, on every backbone kind it runs on.

Cases come from the registry, as in test_method_contract.py: every ``examples()`` variant of
every method × the tiny encoder (BERT), seq2seq (T5) and decoders (GPT-2; LLaMA with
grouped-query attention and rotary positions). A pack holds K=3 members of the variant with
different learning rates, prompt sizes, initialisations, head learning rates, batch sizes
(so different data orders and row counts), gradient clipping (one member's norm is small
enough to clip) and step counts (one member leaves after one step). In fp32 (the tiny backbones run
in eval mode: no dropout), every member reports at every step (train loss, validation
metrics and loss, best so far) what :func:`raypeft.training.loop.train` reports for it alone,
within rtol 1e-4, and the pack really padded the members' prompts to one length.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch.utils.data import DataLoader

from raypeft.config.schema import ExperimentConfig, ModelConfig, TaskConfig, TrainConfig
from raypeft.methods import METHODS
from raypeft.modeling.backbones import backbone_dims, load_config
from raypeft.modeling.packed import PackEntry, packable
from raypeft.training.datasets import split_dataset
from raypeft.training.loop import train
from raypeft.training.pack import MemberSpec, Pack
from raypeft.training.result_keys import PHASE_PREFIX
from tests.pack_driver import train_pack

BACKBONES = ["tiny-bert", "tiny-t5", "tiny-gpt2", "tiny-llama"]
MAX_LENGTH = 16
CASES = [
    pytest.param(name, variant, backbone, id=f"{name}-{variant}-{backbone}")
    for name, cls in sorted(METHODS.items())
    for variant in cls.config_cls.examples()
    for backbone in BACKBONES
]
FIRST_VARIANTS = [
    pytest.param(name, next(iter(cls.config_cls.examples())), backbone, id=f"{name}-{backbone}")
    for name, cls in sorted(METHODS.items())
    for backbone in BACKBONES
]
WORDS = {0: ["bad", "awful", "sad", "poor", "boring"], 1: ["good", "great", "happy", "fine", "fun"]}
# what differs between the pack's three members
LR_SCALE = (1.0, 2.0, 0.5)
SIZE_STEP = (0, 2, 1)  # added to the variant's prompt size knobs
TRAIN = [
    {"head_lr": 0.01, "batch_size": 8, "max_steps": 2, "max_grad_norm": 1.0},
    {"head_lr": 0.02, "batch_size": 4, "max_steps": 2, "max_grad_norm": 0.01},  # clips
    {"head_lr": 0.005, "batch_size": 6, "max_steps": 1, "max_grad_norm": None},  # leaves early
]
SIZE_KNOBS = ("prompt_length", "num_prompts")  # the prompt sizes examples() set
# timings (a trial's phases too: a pack's members do not time theirs), the pack's keys
NOT_COMPARED = ("samples_per_s", "memory", "wall_time", PHASE_PREFIX, "pack_")


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pack-task")
    rng = random.Random(0)
    files = {}
    for split, n in (("train", 48), ("validation", 12), ("test", 8)):
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


def tokenized(backbone: str, task_cfg: TaskConfig, model: ModelConfig):
    from raypeft.data import prepare_task

    if backbone not in _TASKS:
        _TASKS[backbone] = prepare_task(task_cfg, model)
    return _TASKS[backbone]


def member_method(method, index: int):
    """Member ``index``'s variant: learning rates scaled, prompt sizes and seed moved."""
    values = method.model_dump()
    update = {k: v * LR_SCALE[index] for k, v in values.items() if k.startswith("lr")}
    for knob in SIZE_KNOBS:
        if values.get(knob) is not None:
            update[knob] = values[knob] + SIZE_STEP[index]
    if "init_seed" in values:
        update["init_seed"] = values["init_seed"] + index
    return type(method).model_validate({**values, **update})


def experiments(
    name: str, variant: str, backbone: str, task_files, head_pooling: str = "auto"
) -> list[ExperimentConfig]:
    """The pack's three members; skips where the method does not run on the backbone."""
    model = ModelConfig(name=backbone, max_length=MAX_LENGTH, head_pooling=head_pooling)
    dims = backbone_dims(load_config(model, 2, "classification"), MAX_LENGTH, backbone)
    base = METHODS[name].config_cls.examples()[variant]
    cfgs = []
    for index, train_kw in enumerate(TRAIN):
        method = member_method(base, index)
        try:
            method.resolve(dims).check_backbone(dims)
        except ValueError as exc:
            pytest.skip(f"{name}/{variant} does not run on {backbone} ({dims.kind}): {exc}")
        assert packable(method, dims.kind) is None
        cfgs.append(
            ExperimentConfig(
                name="pack",
                model=model,
                task=TaskConfig(name="files", files=task_files, text_column="text"),
                method=method,
                # dropout off: a fused batch draws its dropout masks as one (issue 15: exact
                # for "fp32, dropout off"); dropout on is statistically the same, not bit-equal
                train=TrainConfig(
                    eval_every=1,
                    eval_batch_size=8,
                    precision="fp32",
                    backbone_dropout=0,
                    **train_kw,
                ),
            )
        )
    return cfgs


def compared(metrics: dict) -> dict:
    return {
        k: v
        for k, v in metrics.items()
        if isinstance(v, int | float) and not any(part in k for part in NOT_COMPARED)
    }


def assert_same_reports(alone: list[dict], packed: list[dict], what: str) -> None:
    assert len(packed) == len(alone), what
    for step, (a, p) in enumerate(zip(alone, packed, strict=True), start=1):
        a, p = compared(a), compared(p)
        assert a.keys() == p.keys(), what
        for key in a:
            assert p[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7, nan_ok=True), (
                f"{what}: {key} at report {step}: alone {a[key]}, packed {p[key]}"
            )


def alone_reports(cfg, task) -> list[dict]:
    reports: list[dict] = []
    train(cfg, task, lambda metrics, folder: reports.append(dict(metrics)))
    return reports


@pytest.mark.parametrize(("name", "variant", "backbone"), CASES)
@pytest.mark.slow
def test_a_pack_trains_each_member_as_alone(name, variant, backbone, task_files):
    cfgs = experiments(name, variant, backbone, task_files)
    task = tokenized(backbone, cfgs[0].task, cfgs[0].model)
    alone = [alone_reports(cfg, task) for cfg in cfgs]
    packed: dict[str, list[dict]] = {}

    def report(key, metrics, folder):
        packed.setdefault(key, []).append(dict(metrics))

    specs = [MemberSpec(f"m{i}", cfg) for i, cfg in enumerate(cfgs)]
    train_pack(task, specs, report, capacity=len(specs))
    for i, reports in enumerate(alone):
        assert_same_reports(reports, packed[f"m{i}"], f"member {i}")
    # member 2 left after its one step (and a member that diverged left as it diverged)
    assert packed["m0"][0]["pack_size"] == 3 and packed["m0"][-1]["pack_size"] < 3
    # the members' prompts differ in length: the pack padded them
    assert packed["m0"][-1]["pack_padding_waste"] > 0


MEAN_HEAD_VARIANTS = [  # model.head_pooling: mean (encoders only)
    pytest.param(
        name, next(iter(cls.config_cls.examples())), "tiny-bert", "mean", id=f"{name}-mean"
    )
    for name, cls in sorted(METHODS.items())
]


@pytest.mark.parametrize(
    ("name", "variant", "backbone", "head_pooling"),
    [pytest.param(*p.values, "auto", id=p.id) for p in FIRST_VARIANTS] + MEAN_HEAD_VARIANTS,
)
def test_a_member_gets_its_own_gradients(name, variant, backbone, head_pooling, task_files):
    """The sum of the members' losses, back-propagated once, gives each member the gradients
    its own loss gives it alone (checked tensor by tensor), whatever its rows' count; with a
    mean head too (each member pools its own input tokens, between its prompt and padding)."""
    cfgs = experiments(name, variant, backbone, task_files, head_pooling)
    task = tokenized(backbone, cfgs[0].task, cfgs[0].model)
    pack = Pack(task, capacity=3)
    members = [pack.add(MemberSpec(f"m{i}", cfg)) for i, cfg in enumerate(cfgs)]
    batches = [_batch(task, m.cfg, rows=2 + i) for i, m in enumerate(members)]
    entries = [PackEntry(m.model, b) for m, b in zip(members, batches, strict=True)]
    outputs, shape = pack.backbone(entries)
    sum(out.loss for out in outputs).backward()
    packed = [{n: p.grad.clone() for n, p in _trainable(m.model)} for m in members]
    assert shape.padded > 0
    for m, batch, grads in zip(members, batches, packed, strict=True):
        m.model.zero_grad(set_to_none=True)
        m.model(**batch).loss.backward()
        for n, p in _trainable(m.model):
            assert torch.allclose(grads[n], p.grad, rtol=1e-4, atol=1e-7), n


def _batch(task, cfg, rows: int) -> dict:
    return next(iter(DataLoader(split_dataset(task, cfg, "train"), batch_size=rows)))


def _trainable(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@pytest.mark.parametrize(
    ("backbone", "head_pooling"), [(b, "auto") for b in BACKBONES] + [("tiny-bert", "mean")]
)
def test_members_of_different_methods_pack_together(backbone, head_pooling, task_files):
    """One member per registered method (its first variant that runs on the backbone) in one
    pack: prompts, key/value prefixes and layer prompts of every kind side by side (and, with
    a mean head, of every length before each member's input tokens)."""
    cfgs = []
    for name, cls in sorted(METHODS.items()):
        for variant in cls.config_cls.examples():
            try:
                cfg = experiments(name, variant, backbone, task_files, head_pooling)[0]
            except pytest.skip.Exception:
                continue
            cfgs.append(
                cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_steps": 2})})
            )
            break
    task = tokenized(backbone, cfgs[0].task, cfgs[0].model)
    alone = [alone_reports(cfg, task) for cfg in cfgs]
    packed: dict[str, list[dict]] = {}
    specs = [MemberSpec(cfg.method.name, cfg) for cfg in cfgs]
    train_pack(task, specs, lambda k, m, f: packed.setdefault(k, []).append(m), capacity=len(specs))
    for spec, reports in zip(specs, alone, strict=True):
        assert_same_reports(reports, packed[spec.key], spec.key)
