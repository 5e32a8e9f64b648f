"""What the fidelity benchmark trains, and how each run is named in its results file.

No torch here: planning runs in the parent process, before and between the trainings, and
``--report`` reads the results file with this module and :mod:`benchmarks.fidelity.report` only.

A run is identified by its setting (what every run of one benchmark shares: backbone, length,
budget, data caps, evaluations per run) plus its task, method, learning rate, seed, step count
and variant (config overrides, e.g. DePT's ``m`` on the curve or an ablated fix). The same run
needed by two parts (PT's seed-0 run at the chosen rate is in the main table and on DePT's
curve as m=100; a calibration run at the benchmark's step count is a main-table run) is
trained once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

TASKS = ("mr", "subj", "cr", "mpqa", "sst2", "rte", "mrpc", "stsb")
# the shared data's other tasks: the benchmark runs on them when named (--tasks trec,...)
OTHER_TASKS = ("sst2_sentence", "trec", "cola")
CALIBRATION_TASKS = ("sst2", "mpqa", "mrpc")  # where PT stayed at the majority class at 60 steps

LearningRate = float | tuple[float, float]  # DePT's is (α1, α2)


@dataclass(frozen=True)
class MethodSpec:
    """One compared method: its config section (size knob derived from the budget), its
    learning rates in order of preference (``--lrs n`` tries the first n) and the train
    settings its paper fixes."""

    section: dict
    lrs: tuple[LearningRate, ...]
    train: dict = field(default_factory=dict)


DEPT_M = 60  # DePT's m in the main table: the paper's (l=100 budget: m=60, r derived)
METHODS: dict[str, MethodSpec] = {
    # Lester et al.'s 0.3, then a tenth of it each time (MiniLM's embeddings are ~0.05 wide)
    "PT": MethodSpec({"name": "pt"}, (0.3, 0.03, 3e-3)),
    # (α1, α2): α1 as PT's; α2 from the paper's grid {1e-4, 5e-4, 1e-3, 5e-3}, which carries
    # over with the official lora_alpha/√r scaling (lowrank_init: official, the default)
    "DePT": MethodSpec(
        {"name": "dept", "prompt_length": DEPT_M}, ((0.3, 5e-3), (0.03, 1e-3), (3e-3, 1e-4))
    ),
    # the paper's grid {5e-3, 1e-3, 5e-4, 1e-4} at a constant rate (its Table 4)
    "M-IDPG-PHM": MethodSpec(
        {
            "name": "idpg",
            "layers": "multi",
            "version": "M",
            "generator": "phm",
            "phm_n": 4,
            "prompt_length": 5,
            "generator_input": "previous_layer",
        },
        (5e-3, 1e-3, 5e-4),
        {"schedule": "constant"},
    ),
    # Encoder IPT: an MLP over the frozen table pretrained on BBC News, k=4 prompt vectors
    "IPT": MethodSpec(
        {"name": "ipt", "strategy": "encoder", "encoder": "mlp", "num_prompts": 4},
        (1e-2, 5e-3, 1e-3),
    ),
}


@dataclass(frozen=True)
class Ablation:
    """One fix of issue 14 undone: the old behaviour as config overrides, for some methods."""

    fix: str
    new: str  # the default's value, as the table shows it
    old: str
    methods: tuple[str, ...]
    overrides: tuple[tuple[str, object], ...]  # dotted key -> the old value


ABLATIONS = (
    Ablation("init", "vocab", "vocab_uniform", ("PT", "DePT"), (("method.init", "vocab_uniform"),)),
    Ablation(
        "backbone_dropout",
        "config",
        "0",
        ("PT", "DePT", "M-IDPG-PHM"),
        (("train.backbone_dropout", 0),),
    ),
    Ablation("lowrank_init", "official", "paper", ("DePT",), (("method.lowrank_init", "paper"),)),
    # the head reading the first position (a prompt slot, as transformers' head and peft)
    # instead of the mean of the input's tokens that auto picks for MiniLM
    Ablation("head_pooling", "auto", "first", tuple(METHODS), (("model.head_pooling", "first"),)),
)


@dataclass(frozen=True)
class Setting:
    """What every run of one benchmark shares; its fingerprint keys the results file."""

    model: str
    max_length: int
    budget_length: int  # the budget as a PT length l: l·d trainable parameters
    budget_params: int
    batch_size: int
    head_lr: float
    train_examples: int
    eval_examples: int
    test_examples: int
    evals: int  # evaluations per run (the best checkpoint by validation is kept)
    precision: str
    head_pooling: str = "auto"  # model.head_pooling
    ipt: tuple[tuple[str, object], ...] = ()  # IPT pretraining overrides (--tiny)

    def fingerprint(self) -> str:
        """A short stable hash of every field."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Run:
    """One training run: its best checkpoint by validation is scored once on test."""

    task: str
    method: str  # a label of METHODS
    lr: LearningRate
    seed: int
    steps: int
    variant: tuple[tuple[str, object], ...] = ()  # dotted config key -> value

    def key(self, setting: Setting) -> str:
        """The run's name in the results file."""
        fields = [setting.fingerprint(), self.task, self.method, self.lr, self.seed]
        return json.dumps([*fields, self.steps, [list(kv) for kv in self.variant]])

    def label(self) -> str:
        """How progress lines name the run."""
        variant = "".join(f" {k.split('.')[-1]}={v}" for k, v in self.variant)
        return f"{self.task} {self.method}{variant} lr={format_lr(self.lr)} seed={self.seed}"


def format_lr(lr: LearningRate) -> str:
    """``0.3`` or ``(0.3, 0.005)``."""
    return f"({lr[0]:g}, {lr[1]:g})" if isinstance(lr, tuple) else f"{lr:g}"


def as_lr(value) -> LearningRate:
    """A learning rate read back from JSON (DePT's pair comes back as a list)."""
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class Plan:
    """What one benchmark (or calibration) runs, beside its shared setting."""

    tasks: tuple[str, ...]
    methods: tuple[str, ...]
    lrs: int  # learning rates tried per method (the first of each grid)
    seeds: int
    steps: int
    curve_tasks: tuple[str, ...]
    curve_m: tuple[int, ...]
    ablation_tasks: tuple[str, ...]
    calibrate_tasks: tuple[str, ...] = CALIBRATION_TASKS
    calibrate_steps: tuple[int, ...] = (75, 150, 300, 600, 1200)
    margin: float = 0.02  # "left the majority class": val accuracy >= majority + margin

    def grid(self, method: str) -> tuple[LearningRate, ...]:
        """The learning rates tried for ``method``."""
        return METHODS[method].lrs[: self.lrs]


Records = dict[str, dict]  # run key -> its result record
Chooser = Callable[[str, str], LearningRate | None]  # (task, method) -> chosen rate


def grid_runs(plan: Plan) -> list[Run]:
    """Seed 0 of every method's learning rates on every task (PT first: the slowest)."""
    return [
        Run(task, method, lr, 0, plan.steps)
        for task in plan.tasks
        for method in plan.methods
        for lr in plan.grid(method)
    ]


def chosen_lr(
    plan: Plan, setting: Setting, records: Records, task: str, method: str
) -> LearningRate | None:
    """The rate whose seed-0 run has the best validation metric (the first on a tie; a
    diverged run never wins unless all did); None until every one has finished."""
    grid = plan.grid(method)
    found = [records.get(Run(task, method, lr, 0, plan.steps).key(setting)) for lr in grid]
    if any(r is None for r in found):
        return None
    scored = [(r["val"], -i) for i, r in enumerate(found) if r.get("val") is not None]
    return grid[-max(scored)[1]] if scored else grid[0]


def followup_runs(plan: Plan, choose: Chooser) -> list[Run]:
    """What follows a (task, method)'s rate choice: its other seeds, DePT's m-vs-r curve and
    the ablations, each at the chosen rate."""
    runs = []
    for task in plan.tasks:
        for method in plan.methods:
            lr = choose(task, method)
            if lr is not None:
                runs += [Run(task, method, lr, s, plan.steps) for s in range(1, plan.seeds)]
    for task in plan.curve_tasks:
        lr = choose(task, "DePT") if "DePT" in plan.methods else None
        for m in (m for m in plan.curve_m if lr is not None and m != DEPT_M):
            variant = (("method.prompt_length", m),)
            runs += [Run(task, "DePT", lr, s, plan.steps, variant) for s in range(plan.seeds)]
    for ablation in ABLATIONS:
        for method in (m for m in ablation.methods if m in plan.methods):
            for task in plan.ablation_tasks:
                lr = choose(task, method)
                if lr is not None:
                    variant = ablation.overrides
                    runs += [
                        Run(task, method, lr, s, plan.steps, variant) for s in range(plan.seeds)
                    ]
    return runs


def benchmark_runs(plan: Plan, setting: Setting, records: Records) -> list[Run]:
    """Every run whose inputs are known now: the grid, then what each finished choice
    releases. Called again after each result."""
    return grid_runs(plan) + followup_runs(
        plan, lambda task, method: chosen_lr(plan, setting, records, task, method)
    )


def full_benchmark(plan: Plan, setting: Setting, records: Records | None = None) -> list[Run]:
    """Every run of the benchmark: at the chosen rate where ``records`` tell it, else at a
    stand-in (the grid's first), for counting and the wall-time estimate."""

    def choose(task: str, method: str) -> LearningRate:
        known = chosen_lr(plan, setting, records, task, method) if records else None
        return plan.grid(method)[0] if known is None else known

    return grid_runs(plan) + followup_runs(plan, choose)


def calibration_runs(plan: Plan, setting: Setting, records: Records) -> list[Run]:
    """PT's rates on the calibration tasks, one step count after the other; a count runs
    only while every smaller one has finished without PT leaving the majority class on all
    the tasks (the smallest count that does is the answer)."""
    runs: list[Run] = []
    for steps in plan.calibrate_steps:
        batch = calibration_batch(plan, steps)
        runs += batch
        done = [records.get(run.key(setting)) for run in batch]
        if any(r is None for r in done) or calibration_passes(plan, setting, records, steps):
            break
    return runs


def calibration_batch(plan: Plan, steps: int) -> list[Run]:
    """PT at each of its rates, seed 0, on each calibration task, for ``steps`` steps."""
    return [Run(t, "PT", lr, 0, steps) for t in plan.calibrate_tasks for lr in plan.grid("PT")]


def calibration_verdict(
    plan: Plan, setting: Setting, records: Records, task: str, steps: int
) -> dict | None:
    """PT's validation accuracy at the rate the benchmark would choose (by the task's own
    metric), the majority-class rate, and whether it left the majority class."""
    lr = chosen_lr(replace(plan, steps=steps), setting, records, task, "PT")
    if lr is None:
        return None
    record = records[Run(task, "PT", lr, 0, steps).key(setting)]
    accuracy = (record.get("val_metrics") or {}).get("accuracy")
    majority = record["majority"]["validation"].get("accuracy")
    left = accuracy is not None and majority is not None and accuracy >= majority + plan.margin
    return {"lr": lr, "accuracy": accuracy, "majority": majority, "left": left}


def calibration_passes(plan: Plan, setting: Setting, records: Records, steps: int) -> bool:
    """Whether PT left the majority class on every calibration task at ``steps``."""
    verdicts = [calibration_verdict(plan, setting, records, t, steps) for t in plan.calibrate_tasks]
    return all(v is not None and v["left"] for v in verdicts)


def run_config(setting: Setting, run: Run, data_dir: Path) -> dict:
    """The experiment config (a dict for ``validate_experiment``) of one run."""
    spec = METHODS[run.method]
    method = dict(spec.section)
    if isinstance(run.lr, tuple):
        method.update(lr_prompt=run.lr[0], lr_lowrank=run.lr[1])
    else:
        method["lr"] = run.lr
    if method["name"] == "ipt":
        method.update(dict(setting.ipt))
    cfg = {
        "name": f"fidelity-{run.task}",
        "model": {
            "name": setting.model,
            "max_length": setting.max_length,
            "head_pooling": setting.head_pooling,
        },
        "task": {
            "name": run.task,
            "data_dir": str(data_dir / run.task),
            "max_train_examples": setting.train_examples,
            "max_eval_examples": setting.eval_examples,
            "max_test_examples": setting.test_examples,
        },
        "budget_params": setting.budget_params,
        "method": method,
        "train": {
            "max_steps": run.steps,
            "eval_every": max(1, run.steps // setting.evals),
            "batch_size": setting.batch_size,
            "head_lr": setting.head_lr,
            "seed": run.seed,
            "precision": setting.precision,
            **spec.train,
        },
    }
    for dotted, value in run.variant:
        section, key = dotted.split(".")
        cfg[section] = {**cfg[section], key: value}
    return cfg


def records_of(records: Iterable[dict], setting: Setting) -> Records:
    """The records of one setting, by run key."""
    fingerprint = setting.fingerprint()
    return {r["key"]: r for r in records if r.get("fingerprint") == fingerprint}
