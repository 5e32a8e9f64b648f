"""The torch side of the fidelity benchmark: each task prepared once in the parent (tokenised,
IDPG's sentence encodings, IPT's pretrained table, the majority-class scores), then one run
trained and scored per call in a worker process, through raypeft's own training loop."""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from benchmarks.fidelity.plan import METHODS, Run, Setting, run_config
from raypeft.config.loading import validate_experiment
from raypeft.config.schema import ModelConfig
from raypeft.data import TokenizedTask, prepare_task
from raypeft.data.metrics import compute_metrics
from raypeft.modeling.backbones import frozen_backbone, load_config
from raypeft.modeling.build import build_model
from raypeft.modeling.precision import resolve_precision
from raypeft.modeling.prompted import TRAINABLE_FILE
from raypeft.training.datasets import ensure_features, split_dataset
from raypeft.training.evaluation import evaluate
from raypeft.training.loop import train
from raypeft.training.result_keys import FAILURE_KEY, PRECISION_KEY

# filled in the parent, then handed to each worker once as it starts
TASKS: dict[str, TokenizedTask] = {}
MAJORITY: dict[str, dict[str, dict[str, float]]] = {}
PROBE_EXAMPLES = 64  # validation/test examples a timing probe evaluates
CPU = torch.device("cpu")


def hidden_size(model: str) -> int:
    """d of the backbone (the budget is l·d)."""
    return load_config(ModelConfig(name=model), 2, "classification").hidden_size


def prepare_tasks(setting: Setting, data_dir: Path, tasks, methods, say=print) -> None:
    """Tokenise each task once, compute what the methods read per example (IDPG's M(x)),
    build IPT's pretrained table, and the majority-class scores of validation and test."""
    for task in tasks:
        if task in TASKS:
            continue
        start = time.perf_counter()
        configs = [
            validate_experiment(
                run_config(setting, Run(task, m, METHODS[m].lrs[0], 0, setting.evals), data_dir),
                f"fidelity:{task}:{m}",
            )
            for m in methods
        ]
        data = prepare_task(configs[0].task, configs[0].model)
        for cfg in configs:
            cfg.method.warm_up(frozen_backbone(cfg.model))
            ensure_features(data, cfg)
        TASKS[task], MAJORITY[task] = data, majority_scores(data)
        sizes = "/".join(str(data.size(s)) for s in ("train", "validation", "test"))
        say(f"  {task}: {sizes} examples, prepared in {time.perf_counter() - start:.1f} s")


def majority_scores(data: TokenizedTask) -> dict[str, dict[str, float]]:
    """Each metric of always answering the training set's most frequent class, per split
    (empty for regression)."""
    if data.spec.problem == "regression":
        return {"validation": {}, "test": {}}
    majority = Counter(data.splits["train"]["labels"].tolist()).most_common(1)[0][0]
    out = {}
    for split in ("validation", "test"):
        labels = data.splits[split]["labels"]
        preds = np.full(len(labels), majority, dtype=labels.dtype)
        out[split] = compute_metrics(data.spec.metrics, preds, labels)
    return out


def init_worker(threads: int, tasks: dict, majority: dict) -> None:
    """A worker's torch threads and the prepared tasks; the parent alone handles Ctrl-C and
    termination."""
    torch.set_num_threads(threads)
    TASKS.update(tasks)
    MAJORITY.update(majority)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def train_run(run: Run, setting: Setting, data_dir: Path, probe: bool = False) -> dict:
    """Train one run and score its best checkpoint on test: the record the results file
    keeps; or ``{"key", "error"}`` when it raised (the parent reports it, nothing is kept)."""
    try:
        return _train_and_score(run, setting, data_dir, probe)
    except Exception as exc:  # one broken run must not stop the others
        return {
            "key": run.key(setting),
            "label": run.label(),
            "error": f"{type(exc).__name__}: {exc}",
        }


def probe_run(run: Run, setting: Setting, data_dir: Path) -> dict:
    """A short run timed after a 1-step one of the same method in the same process, so
    that the timing leaves out what only a worker's first run of a shape pays (kernel
    set-up, lazy imports), as the benchmark's many runs per worker do."""
    train_run(replace(run, steps=1), setting, data_dir, probe=True)
    return train_run(run, setting, data_dir, probe=True)


def _train_and_score(run: Run, setting: Setting, data_dir: Path, probe: bool) -> dict:
    start = time.perf_counter()
    cfg = validate_experiment(run_config(setting, run, data_dir), f"fidelity:{run.label()}")
    data = _trimmed(TASKS[run.task], PROBE_EXAMPLES) if probe else TASKS[run.task]
    kept: dict = {"evals": 0, "curve": []}
    metric = data.spec.primary_metric
    # the learning curve, in accuracy where the task has it (when a method leaves the majority
    # class), else in the task's own metric
    curve_key = "val_accuracy" if "accuracy" in data.spec.metrics else f"val_{metric}"

    def report(metrics: dict, folder: Path | None) -> None:
        kept["metrics"] = metrics
        kept["evals"] += FAILURE_KEY not in metrics
        if curve_key in metrics:
            kept["curve"].append([metrics["step"], metrics[curve_key]])
        if folder is not None:  # the folder holds the best model so far
            kept["tensors"] = load_file(str(folder / TRAINABLE_FILE))

    best = train(cfg, data, report)
    record = _record(run, setting, data, kept["metrics"])
    failure = kept["metrics"].get(FAILURE_KEY)
    if failure or "tensors" not in kept:
        record["failed"] = failure or "no evaluation reported"
        return record | {"seconds": time.perf_counter() - start}
    test, model = _score_test(cfg, data, kept["tensors"])
    record.update(
        metric=metric,
        val=best[f"val_{metric}"],
        val_curve=kept["curve"],
        val_metrics={k[4:]: v for k, v in best.items() if k.startswith("val_")},
        best_step=best["step"],
        test=test[metric],
        test_metrics={k: v for k, v in test.items() if k in data.spec.metrics},
        params=model.method.num_trainable(),
        derived=model.method.config.derived(),
        evaluated=kept["evals"] * data.size("validation") + data.size("test"),
        seconds=time.perf_counter() - start,
    )
    return record


def _record(run: Run, setting: Setting, data: TokenizedTask, metrics: dict) -> dict:
    """What every record holds, finished or failed: the run, its setting and its speed."""
    record = {
        "key": run.key(setting),
        "fingerprint": setting.fingerprint(),
        "setting": asdict(setting),
        "task": run.task,
        "method": run.method,
        "lr": run.lr,
        "seed": run.seed,
        "steps": run.steps,
        "variant": [list(kv) for kv in run.variant],
        "label": run.label(),
        "majority": MAJORITY[run.task],
        "failed": None,
        "finished_at": time.time(),
    }
    record["precision"] = metrics.get(PRECISION_KEY)  # what auto resolved to
    if "train_samples_per_s" in metrics:
        record["step_s"] = setting.batch_size / metrics["train_samples_per_s"]
        record["eval_example_s"] = 1 / metrics["eval_samples_per_s"]
    return record


def _score_test(cfg, data: TokenizedTask, tensors: dict) -> tuple[dict, object]:
    """The test metrics of the best checkpoint, in the precision it trained in."""
    precision = resolve_precision(cfg.train.precision, CPU)
    model = build_model(cfg, data, precision=precision)
    model.load_trainable_state_dict(tensors)
    test = split_dataset(data, cfg, "test")
    return evaluate(model, test, data.spec.metrics, cfg.train.eval_batch_size, CPU), model


def _trimmed(data: TokenizedTask, n: int) -> TokenizedTask:
    """The task with validation and test cut to ``n`` examples (a timing probe's)."""

    def cut(split: str, values):
        return values if split == "train" else values[:n]

    return replace(
        data,
        splits={s: {k: cut(s, v) for k, v in a.items()} for s, a in data.splits.items()},
        texts={s: cut(s, t) for s, t in data.texts.items()},
        features={
            key: {s: cut(s, v) for s, v in by_split.items()}
            for key, by_split in data.features.items()
        },
    )
