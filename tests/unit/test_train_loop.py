"""The shared training loop on tiny-bert with a synthetic tokenised task."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

import raypeft.training.loop as train_mod  # its evaluate() is replaced by scripted ones
from raypeft.config.schema import ExperimentConfig, ModelConfig, SearchConfig, TrainConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask
from raypeft.methods.dept import DePTConfig
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling.build import build_model
from raypeft.modeling.prompted import TRAINABLE_FILE
from raypeft.training.checkpoints import CONFIG_FILE, TASK_FILE, load_checkpoint
from raypeft.training.datasets import split_dataset
from raypeft.training.digests import DIGESTS_FILE
from raypeft.training.evaluation import evaluate
from raypeft.training.loop import train
from raypeft.training.optimizer import build_optimizer, build_scheduler
from raypeft.training.phases import phases_of
from raypeft.training.result_keys import (
    EVALUATION_KEY,
    FAILURE_KEY,
    RESTARTED_KEY,
    RESUMED_KEY,
    TRIAL_STEPS_KEY,
    ran_to_end,
)
from raypeft.training.resume import RESUME_DIR
from raypeft.training.sampler import GlobalBatchSampler

S = 16


def synthetic_split(n: int, seed: int) -> dict[str, np.ndarray]:
    """Random tokens; the label is given by the token right after [CLS] (2000 or 3000)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    ids = rng.integers(1000, 5000, (n, S))
    ids[:, 0], ids[:, 1] = 101, np.where(labels == 1, 3000, 2000)
    real = rng.integers(6, S + 1, n)  # ragged lengths, then [SEP] and padding
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
    return TokenizedTask(
        spec=spec,
        label_names=None,
        splits={
            "train": synthetic_split(64, 0),
            "validation": synthetic_split(24, 1),
            "test": synthetic_split(24, 2),
        },
    )


def experiment(method=None, **train_kw) -> ExperimentConfig:
    train_kw = {
        "max_steps": 30,
        "eval_every": 10,
        "batch_size": 8,
        "eval_batch_size": 16,
        "head_lr": 1e-2,
        **train_kw,
    }
    return ExperimentConfig(
        name="unit",
        model=ModelConfig(name="tiny-bert", max_length=S),
        method=method or PromptTuningConfig(prompt_length=4, lr=0.05),
        train=TrainConfig(**train_kw),
    )


def assert_same_tensors(model_file: Path, resume_file: Path) -> None:
    """The checkpoint's model tensors equal the ``trainable.*`` tensors of a resume state."""
    model = load_file(str(model_file))
    state = load_file(str(resume_file))
    current = {k[len("trainable.") :]: v for k, v in state.items() if k.startswith("trainable.")}
    assert model.keys() == current.keys()
    for key, tensor in model.items():
        assert torch.equal(tensor, current[key]), key


class Recorder:
    """A ``report`` callback keeping every metrics dict and a copy of each checkpoint."""

    def __init__(self, root: Path):
        self.root, self.calls = root, []

    def __call__(self, metrics: dict, folder: Path | None) -> None:
        copy = None
        if folder is not None:
            assert folder.is_dir()
            copy = self.root / f"ckpt-{len(self.calls)}"
            shutil.copytree(folder, copy)
        self.calls.append((dict(metrics), copy))

    @property
    def checkpoints(self) -> list[Path]:
        return [c for _, c in self.calls if c is not None]


@pytest.mark.parametrize(
    "method",
    [
        PromptTuningConfig(prompt_length=4, lr=0.05),
        DePTConfig(prompt_length=4, budget_prompt_length=10, lr_prompt=0.05, lr_lowrank=0.01),
    ],
    ids=["pt", "dept-budget"],
)
def test_train_reports_and_checkpoints_best(tmp_path, task, method):
    cfg = experiment(method)
    rec = Recorder(tmp_path)
    best = train(cfg, task, rec)

    assert [m["step"] for m, _ in rec.calls] == [10, 20, 30]
    for metrics, _ in rec.calls:
        for key in (
            "val_accuracy",
            "val_macro_f1",
            "val_loss",
            "val_samples_per_s",
            "train_loss",
            "train_samples_per_s",
            "epoch",
            "best_val_accuracy",
            "best_step",
        ):
            assert key in metrics, key
        assert np.isfinite(metrics["train_loss"]) and metrics["train_samples_per_s"] > 0
    # 64 examples / batch 8 = 8 steps per epoch
    assert [m["epoch"] for m, _ in rec.calls] == [1, 2, 3]

    # every evaluation reports a checkpoint; its model is the best so far (strictly better
    # counts), i.e. the training state of the evaluation that set the best
    assert all(ckpt is not None for _, ckpt in rec.calls)
    running, best_at = -np.inf, None
    for metrics, ckpt in rec.calls:
        if metrics["val_accuracy"] > running:
            running, best_at = metrics["val_accuracy"], ckpt
        assert metrics["best_val_accuracy"] == running
        assert_same_tensors(ckpt / TRAINABLE_FILE, best_at / RESUME_DIR / "state.safetensors")
    last_best = rec.calls[-1][0]
    assert best == {k[len("best_") :]: v for k, v in last_best.items() if k.startswith("best_")}

    ckpt = rec.checkpoints[-1]
    files = sorted(p.name for p in ckpt.iterdir())
    assert files == sorted([CONFIG_FILE, DIGESTS_FILE, TASK_FILE, TRAINABLE_FILE, RESUME_DIR])
    saved = yaml.safe_load((ckpt / CONFIG_FILE).read_text())
    assert saved["method"]["name"] == method.name and saved["train"]["max_steps"] == 30
    if isinstance(method, DePTConfig):
        assert saved["method"]["rank"] == 4  # the derived rank is recorded

    # the checkpoint rebuilds a model scoring exactly the best validation metrics
    cfg2, model = load_checkpoint(ckpt, task)
    assert cfg2.method.resolve(model.dims) == cfg.method.resolve(model.dims)
    val_set = split_dataset(task, cfg2, "validation")
    val = evaluate(model, val_set, task.spec.metrics, 16, torch.device("cpu"))
    assert val["accuracy"] == best["val_accuracy"]
    assert val["macro_f1"] == best["val_macro_f1"]
    assert val["loss"] == pytest.approx(best["val_loss"], rel=1e-6)


def test_train_is_deterministic(tmp_path, task):
    cfg = experiment(max_steps=10, eval_every=10)
    a, b = Recorder(tmp_path / "a"), Recorder(tmp_path / "b")
    train(cfg, task, a)
    train(cfg, task, b)
    keys = ["val_loss", "val_accuracy", "train_loss"]
    assert [[m[k] for k in keys] for m, _ in a.calls] == [[m[k] for k in keys] for m, _ in b.calls]


def test_backbone_dropout_trains_and_never_evaluates(tmp_path, task):
    """The loop trains with the backbone's dropout (the default, as the papers; seeded, so the
    runs above repeat exactly and a resumed trial continues exactly) and evaluates without:
    0 changes the training loss, not how a given model is evaluated."""
    on, off = Recorder(tmp_path / "on"), Recorder(tmp_path / "off")
    train(experiment(max_steps=10, eval_every=10), task, on)
    train(experiment(max_steps=10, eval_every=10, backbone_dropout=0), task, off)
    assert on.calls[0][0]["train_loss"] != off.calls[0][0]["train_loss"]
    for rec, dropout in ((on, "config"), (off, 0.0)):
        cfg, model = load_checkpoint(rec.checkpoints[-1], task)
        assert cfg.train.backbone_dropout == dropout
        val = evaluate(model, split_dataset(task, cfg, "validation"), ("accuracy",), 16, "cpu")
        assert val["loss"] == pytest.approx(rec.calls[-1][0]["val_loss"], rel=1e-6)


def test_final_step_is_evaluated_when_not_a_multiple(tmp_path, task):
    rec = Recorder(tmp_path)
    train(experiment(max_steps=12, eval_every=5), task, rec)
    assert [m["step"] for m, _ in rec.calls] == [5, 10, 12]
    # the short last one is an evaluation of its own: the 3rd (ceil(12 / 5), most_evaluations)
    assert [m[EVALUATION_KEY] for m, _ in rec.calls] == [1, 2, 3]


def model_changed(rec: Recorder, i: int) -> bool:
    """Whether checkpoint ``i`` holds another model than checkpoint ``i - 1`` (a new best)."""
    if i == 0:
        return True
    before = load_file(str(rec.calls[i - 1][1] / TRAINABLE_FILE))
    after = load_file(str(rec.calls[i][1] / TRAINABLE_FILE))
    return any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "mode,values,expected",
    [
        ("max", [0.5, 0.4, 0.7], [True, False, True]),
        ("max", [0.5, 0.5, 0.5], [True, False, False]),  # ties do not count as improvement
        ("min", [0.5, 0.4, 0.7], [True, True, False]),
    ],
)
def test_checkpoint_only_on_improvement_scripted(
    tmp_path, task, monkeypatch, mode, values, expected
):
    scripted = iter(values)

    def fake_evaluate(model, arrays, metric_names, batch_size, device):
        return {"accuracy": next(scripted), "macro_f1": 0.0, "loss": 1.0, "samples_per_s": 1.0}

    monkeypatch.setattr(train_mod, "evaluate", fake_evaluate)
    cfg = experiment().model_copy(update={"search": SearchConfig(mode=mode)})
    rec = Recorder(tmp_path)
    best = train(cfg, task, rec)
    assert [model_changed(rec, i) for i in range(len(rec.calls))] == expected
    want = max(values) if mode == "max" else min(values)
    assert best["val_accuracy"] == want
    assert best["step"] == 10 * (values.index(want) + 1)
    assert [m["best_val_accuracy"] for m, _ in rec.calls][-1] == want


def test_search_metric_selects_what_improves(tmp_path, task, monkeypatch):
    scripted = iter([(0.5, 0.2), (0.6, 0.1), (0.4, 0.3)])  # (accuracy, macro_f1)

    def fake_evaluate(model, arrays, metric_names, batch_size, device):
        acc, f1 = next(scripted)
        return {"accuracy": acc, "macro_f1": f1, "loss": 1.0, "samples_per_s": 1.0}

    monkeypatch.setattr(train_mod, "evaluate", fake_evaluate)
    cfg = experiment().model_copy(update={"search": SearchConfig(metric="macro_f1")})
    rec = Recorder(tmp_path)
    best = train(cfg, task, rec)
    assert [model_changed(rec, i) for i in range(len(rec.calls))] == [True, False, True]
    assert best["val_macro_f1"] == 0.3 and best["val_accuracy"] == 0.4


def scripted_evaluations(monkeypatch, rows: list[tuple[float, float]]) -> None:
    """Evaluations that return ``(accuracy, loss)`` from ``rows``, in turn."""
    scripted = iter(rows)

    def fake_evaluate(model, arrays, metric_names, batch_size, device):
        acc, loss = next(scripted)
        return {"accuracy": acc, "macro_f1": 0.0, "loss": loss, "samples_per_s": 1.0}

    monkeypatch.setattr(train_mod, "evaluate", fake_evaluate)


def test_under_objectives_the_primary_objective_keeps_the_checkpoint(tmp_path, task, monkeypatch):
    """search.objectives [loss, trainable_params]: the checkpoint is kept by the lowest loss
    (not by accuracy, the task's primary metric), so best_val_loss is the best loss."""
    scripted_evaluations(monkeypatch, [(0.5, 0.9), (0.8, 0.7), (0.6, 0.4)])
    search = SearchConfig(objectives=[{"metric": "loss"}, {"metric": "trainable_params"}])
    rec = Recorder(tmp_path)
    best = train(experiment().model_copy(update={"search": search}), task, rec)
    assert [model_changed(rec, i) for i in range(len(rec.calls))] == [True, True, True]
    assert best["val_loss"] == 0.4 and best["step"] == 30
    assert [m["best_val_loss"] for m, _ in rec.calls] == [0.9, 0.7, 0.4]


def test_an_efficiency_metric_searched_keeps_the_checkpoint_by_the_tasks_metric(
    tmp_path, task, monkeypatch
):
    """search.metric: train_samples_per_s is no validation metric: the checkpoint is kept by
    the task's primary metric, and the trial reports (it used to fail at its first
    evaluation, looking the throughput up among the validation metrics)."""
    scripted_evaluations(monkeypatch, [(0.5, 0.9), (0.4, 0.7), (0.6, 0.8)])
    search = SearchConfig(metric="train_samples_per_s")
    rec = Recorder(tmp_path)
    best = train(experiment().model_copy(update={"search": search}), task, rec)
    assert best["val_accuracy"] == 0.6
    assert all(m["train_samples_per_s"] > 0 for m, _ in rec.calls)
    # kept by accuracy: the best accuracy so far, not the accuracy of the lowest loss
    assert [m["best_val_accuracy"] for m, _ in rec.calls] == [0.5, 0.5, 0.6]


def test_every_evaluation_reports_the_trials_own_length(tmp_path, task):
    """train.max_steps may be searched: each trial says how long it is."""
    rec = Recorder(tmp_path)
    train(experiment(max_steps=20), task, rec)
    assert [m[TRIAL_STEPS_KEY] for m, _ in rec.calls] == [20, 20]
    assert [ran_to_end(m) for m, _ in rec.calls] == [False, True]
    assert [m[EVALUATION_KEY] for m, _ in rec.calls] == [1, 2]  # the schedulers' clock


def test_huge_learning_rate_ends_the_trial_as_failed(task):
    # lr 1e30 on the prompt: the embeddings overflow in the first update -> NaN loss at step 2.
    # The trial reports why and returns (an exception would make Ray retry it in vain).
    cfg = experiment(PromptTuningConfig(prompt_length=4, lr=1e30), warmup_ratio=0.0)
    calls = []
    best = train(cfg, task, lambda m, c: calls.append((m, c)))
    assert best == {}
    ((metrics, checkpoint),) = calls
    assert checkpoint is None and metrics["step"] == 1
    assert "training loss became nan at step 2" in metrics[FAILURE_KEY]


def test_non_finite_loss_injected(task, monkeypatch):
    import raypeft.modeling.prompted as model_mod

    real_loss = model_mod.head_loss
    count = {"n": 0}

    def head_loss(logits, labels):
        count["n"] += 1
        loss = real_loss(logits, labels)
        return loss * float("inf") if count["n"] == 4 else loss

    monkeypatch.setattr(model_mod, "head_loss", head_loss)
    calls = []
    train(experiment(), task, lambda m, c: calls.append(m))
    assert "training loss became inf at step 4" in calls[-1][FAILURE_KEY]
    assert len(calls) == 1  # no evaluation before step 10


class Interrupt(Exception):
    """Stands for the process dying right after a report."""


def killed_after_step_20(cfg, task, root) -> Recorder:
    """A trial that dies right after its report at step 20: what it reported and saved."""
    first = Recorder(root)

    def dies_after_step_20(metrics, folder):
        first(metrics, folder)
        if metrics["step"] == 20:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(cfg, task, dies_after_step_20)
    return first


def test_resumed_trial_continues_exactly_where_it_stopped(tmp_path, task):
    """Killed after its 2nd evaluation and restarted from that checkpoint, a trial reports
    exactly what an uninterrupted one reports, ends with the same tensors, and its wall time
    goes on from where it stopped."""
    cfg = experiment(
        DePTConfig(prompt_length=4, budget_prompt_length=10, lr_prompt=0.05, lr_lowrank=0.01),
        max_steps=50,
    )
    whole = Recorder(tmp_path / "whole")
    train(cfg, task, whole)
    first = killed_after_step_20(cfg, task, tmp_path / "first")
    second = Recorder(tmp_path / "second")
    train(cfg, task, second, resume_from=first.checkpoints[-1])

    assert [m["step"] for m, _ in second.calls] == [30, 40, 50]
    assert [m[EVALUATION_KEY] for m, _ in second.calls] == [3, 4, 5]  # counted from step 0
    assert all(m[RESUMED_KEY] == 20 for m, _ in second.calls)
    keys = ["train_loss", "val_loss", "val_accuracy", "best_val_accuracy", "best_step", "epoch"]
    resumed = [[m[k] for k in keys] for m, _ in first.calls + second.calls]
    assert resumed == [[m[k] for k in keys] for m, _ in whole.calls]
    # the trial's clock goes on from its checkpoint's (learning-curve tables pace replays by it)
    walls = [m["wall_time_s"] for m, _ in first.calls + second.calls]
    assert walls == sorted(walls) and second.calls[0][0]["wall_time_s"] > walls[1]
    for name in (TRAINABLE_FILE, f"{RESUME_DIR}/state.safetensors"):
        a = load_file(str(whole.checkpoints[-1] / name))
        b = load_file(str(second.checkpoints[-1] / name))
        assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == [], name


@pytest.mark.parametrize(
    "fault",
    ["resume state truncated", "best tensors deleted", "digests missing (save cut off)"],
)
@pytest.mark.slow
def test_a_trial_restarted_from_an_unusable_checkpoint_starts_over_and_says_why(
    tmp_path, task, fault
):
    """Its checkpoint damaged or incomplete, a restarted trial trains from step 0 exactly as
    a fresh one does, and every report says why it started over (tagged on its MLflow run)."""
    cfg = experiment(max_steps=30)
    whole = Recorder(tmp_path / "whole")
    train(cfg, task, whole)
    first = killed_after_step_20(cfg, task, tmp_path / "first")
    folder = first.checkpoints[-1]
    if fault == "resume state truncated":
        state = folder / RESUME_DIR / "state.safetensors"
        state.write_bytes(state.read_bytes()[:100])
    elif fault == "best tensors deleted":
        (folder / TRAINABLE_FILE).unlink()
    else:
        (folder / DIGESTS_FILE).unlink()
    again = Recorder(tmp_path / "again")
    train(cfg, task, again, resume_from=folder)

    assert [m["step"] for m, _ in again.calls] == [10, 20, 30]
    assert [m[EVALUATION_KEY] for m, _ in again.calls] == [1, 2, 3]  # started over: from 1
    reason = again.calls[0][0][RESTARTED_KEY]
    assert reason.startswith("checkpoint unusable, started over: ") and str(folder) in reason
    assert all(m[RESTARTED_KEY] == reason and RESUMED_KEY not in m for m, _ in again.calls)
    keys = ["train_loss", "val_loss", "val_accuracy", "best_val_accuracy", "best_step"]
    assert [[m[k] for k in keys] for m, _ in again.calls] == [
        [m[k] for k in keys] for m, _ in whole.calls
    ]


@pytest.mark.parametrize("named, intact, step", [(1, 0, 10), (0, 1, 20)])
def test_a_trial_goes_back_to_its_newest_intact_checkpoint_beside_the_damaged_one(
    tmp_path, task, named, intact, step
):
    """Tune names one checkpoint of the trial's folder; damaged, the trial resumes from the
    newest intact one beside it (older, or newer than Tune's last snapshot knew of) and ends
    exactly as an uninterrupted trial."""
    cfg = experiment(max_steps=30)
    whole = Recorder(tmp_path / "whole")
    train(cfg, task, whole)
    trial = tmp_path / "trial"
    for index, checkpoint in enumerate(whole.checkpoints[:2]):  # steps 10 and 20
        shutil.copytree(checkpoint, trial / f"checkpoint_{index:06d}")
    tune_named = trial / f"checkpoint_{named:06d}"
    (tune_named / CONFIG_FILE).unlink()  # a deletion cut short by a lost node
    again = Recorder(tmp_path / "again")
    train(cfg, task, again, resume_from=tune_named)

    assert [m["step"] for m, _ in again.calls] == list(range(step + 10, 31, 10))
    reason = again.calls[0][0][RESTARTED_KEY]
    assert f"resumed from checkpoint_{intact:06d}" in reason and "config.yaml: missing" in reason
    assert all(m[RESUMED_KEY] == step for m, _ in again.calls)
    keys = ["train_loss", "val_loss", "val_accuracy", "best_val_accuracy", "best_step"]
    assert [[m[k] for k in keys] for m, _ in again.calls] == [
        [m[k] for k in keys] for m, _ in whole.calls[step // 10 :]
    ]


def test_global_batches_split_evenly_across_workers():
    one = GlobalBatchSampler(50, 8, seed=3)
    two = [GlobalBatchSampler(50, 8, seed=3, rank=r, world_size=2) for r in range(2)]
    for step in (0, 5, 6, 13):  # 6 batches per epoch: the 2nd and 3rd epochs too
        one.at_step(step)
        for s in two:
            s.at_step(step)
        shards = [list(s) for s in two]
        assert [a + b for a, b in zip(*shards, strict=True)] == list(one)
        assert all(len(batch) == 4 for shard in shards for batch in shard)
    one.at_step(0)
    first_epoch = [i for batch in one for i in batch]
    assert len(set(first_epoch)) == 48  # drop_last: no example twice within an epoch
    with pytest.raises(ValueError, match="not divisible"):
        GlobalBatchSampler(50, 9, seed=0, world_size=2)


def test_batch_larger_than_training_set(task):
    cfg = experiment(batch_size=128, max_steps=10, eval_every=10)
    with pytest.raises(ValueError, match="batch_size=128 exceeds the training set"):
        train(cfg, task, lambda m, c: None)


def test_regression_task(tmp_path):
    def split(n, seed):
        return {
            **synthetic_split(n, seed),
            "labels": np.random.default_rng(seed).normal(size=n).astype(np.float32),
        }

    spec = TaskSpec(
        "synthetic-reg",
        "text",
        problem="regression",
        num_labels=1,
        metrics=("pearson", "spearmanr"),
    )
    reg = TokenizedTask(
        spec, None, {"train": split(32, 0), "validation": split(16, 1), "test": split(16, 2)}
    )
    rec = Recorder(tmp_path)
    best = train(experiment(max_steps=8, eval_every=4), reg, rec)
    assert [m["step"] for m, _ in rec.calls] == [4, 8]
    assert {"val_pearson", "val_spearmanr", "val_loss"} <= set(best)
    assert all(np.isfinite(m["val_loss"]) for m, _ in rec.calls)


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_learning_rate_schedule(task, schedule):
    """linear: warm-up over warmup_ratio, then linear decay to zero (DePT); constant: every
    group at its set rate at every step, warmup_ratio unused (IDPG's Table 4)."""
    method = DePTConfig(prompt_length=4, budget_prompt_length=10, lr_prompt=0.3, lr_lowrank=0.01)
    cfg = experiment(method, max_steps=50, schedule=schedule, warmup_ratio=0.1)
    assert experiment(method).train.schedule == "linear"  # the default
    model = build_model(cfg, task)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg.train)
    set_rates = {"prompt": 0.3, "lowrank": 0.01, "head": 1e-2}
    steps = []  # the rate of each group at each optimizer step
    for _ in range(cfg.train.max_steps):
        steps.append({g["name"]: g["lr"] for g in optimizer.param_groups})
        optimizer.step()
        scheduler.step()
    assert set(steps[0]) == set(set_rates)
    for name, rate in set_rates.items():
        got = np.array([s[name] for s in steps])
        if schedule == "constant":
            assert (got == rate).all(), name
        else:  # 5 warm-up steps from 0, the set rate at step 5, then down to 1/45 of it
            np.testing.assert_allclose(got[:6], rate * np.arange(6) / 5)
            assert np.all(np.diff(got[5:]) < 0)
            assert got[-1] == pytest.approx(rate / 45)


def test_a_gpu_trials_memory_meter_initialises_cuda_before_resetting_its_peak(monkeypatch):
    """CUDA's allocator statistics exist only once CUDA is initialised, and
    ``reset_peak_memory_stats`` does not initialise it: a fresh trial process whose meter
    started before its model moved to the GPU failed "Invalid device argument" on an H200
    (2026-11-28). No CUDA here, so the order of the calls is what is checked."""
    from raypeft.training.efficiency import PeakMemory

    calls = []
    monkeypatch.setattr(torch.cuda, "init", lambda: calls.append("init"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 3 * 2**20)
    meter = PeakMemory(torch.device("cuda:0"))
    assert calls == ["init", ("reset", torch.device("cuda:0"))]
    assert meter.peak_mb() == 3.0  # the trial's own device's peak, not the current device's


def test_every_report_carries_the_trials_phases_cumulatively(tmp_path, task):
    """Each report holds the seconds of the trial's phases so far (``phase_s/<name>``):
    every phase the loop passes through, none negative, none shrinking from one report to
    the next; the report's own time counts from the next report on."""
    rec = Recorder(tmp_path)
    train(experiment(), task, rec)
    phases = [phases_of(metrics) for metrics, _ in rec.calls]
    loop_phases = {"data", "model_build", "train_setup", "steps", "evaluation", "checkpoint_write"}
    assert set(phases[0]) == loop_phases
    assert set(phases[1]) == loop_phases | {"report"}
    for before, after in zip(phases, phases[1:], strict=False):
        assert all(0 <= before[name] <= after[name] for name in before)
