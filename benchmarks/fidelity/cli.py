# Over 500 lines: its first 115 are the study's own documentation (what, how, where results go).
"""Fidelity on real tasks: PT vs DePT vs M-IDPG-PHM vs IPT at one trainable-parameter budget.

What it measures
----------------
On the GLUE/SentEval files of ``../shared/data`` (read in place; nothing is copied), with the
pre-trained all-MiniLM-L6-v2 (packaged, d=384, N=6) frozen, every method gets one budget
(``--budget-length`` l=100: l·d = 38,400 trainable parameters, the DePT paper's PT length)
and derives its size knob from it: PT l=100; DePT m=60, r derived; the M-IDPG-PHM generator
width (M version, previous-layer input, t=5, n=4); the Encoder IPT MLP width (k=4, on the
frozen table pretrained on BBC News). The backbone's dropout is on and the frozen backbone
computes in bf16 where the CPU runs it fast (``train.precision: auto``); IDPG trains at a
constant rate (its paper's Table 4), the others with DePT's linear schedule. The task head
reads the mean of the input's own tokens (``model.head_pooling: auto`` on MiniLM, a
mean-pooling sentence encoder; ``--head-pooling first`` reads the first position, a prompt
slot, on which PT never left the majority class: docs/fidelity.md).

Parts, all in one command:

1. **Main table** (8 tasks × 4 methods × 3 seeds). Each method's learning rates (``--lrs``
   of its grid, ``plan.METHODS``) train with seed 0; the best by validation is kept
   per task and trained again with seeds 1 and 2. Each run keeps its best checkpoint by
   validation (``--evals`` evaluations per run) and is scored once on test. Reported: mean ±
   std per task and method, and whether DePT ≥ PT and IDPG ≥ PT hold (mean Δ over tasks,
   tasks won, tasks won by more than two standard errors).
2. **DePT's m against r** at the fixed budget (m ∈ ``--curve-m``, r derived) on
   ``--curve-tasks``, at DePT's chosen rate, with PT as m=100 (the paper's Figure 3).
3. **Ablations** of issue 14's fixes on ``--ablation-tasks`` against the new defaults, at the
   default's chosen rate: prompt init (vocab vs the old vocab_uniform), backbone dropout
   (config vs 0), DePT's low-rank start (official vs paper), and the head reading the mean
   of the input's tokens against the first position (``model.head_pooling``, all four).

``--calibrate`` finds the step count first: PT on SST-2, MPQA and MRPC at increasing counts
(``--calibrate-steps``), seed 0 at each of its rates, its validation accuracy at the chosen
rate against each task's majority-class rate; it stops at the smallest count where PT left
the majority class on all three, and prints the full run's estimated wall time per count.

Results are appended to a JSON-lines file (``--results``) as runs finish; run the same
command again after an interruption and it skips the finished runs. ``--report`` prints the
markdown tables from that file. Before training, a short timing (``--probe-steps`` of each
method, or the finished runs' own timings) gives the estimated wall time and the largest step
count that fits in 2.5 hours; ``--estimate`` prints them (and each method's costs) and exits.
Two workers of one thread beat one of two threads by ~13% here (evaluation and per-run set-up
do not scale with threads; docs/fidelity.md).

Where a task has no labelled test split (SST-2 and RTE as GLUE ships them), validation is split
in half (DePT's rule). Training sets are capped at ``--train-examples`` and validation/test at
``--eval-examples``/``--test-examples`` (random subsets, fixed seed): the numbers compare the
methods at small scale, not the papers' full-data results.

Runs go to ``--jobs`` worker processes with ``--threads`` torch threads each; the tasks are
tokenised and IDPG's encodings computed once, in the parent, and handed to each worker as it
starts. Ray is not used: a process pool does the same without Ray's start-up (seconds for the
cluster and for each worker actor) or its object store.

Usage::

    python -m benchmarks.fidelity --data-dir ../shared/data --calibrate   # first: the steps
    python -m benchmarks.fidelity --data-dir ../shared/data               # the benchmark
    python -m benchmarks.fidelity --data-dir ../shared/data --report      # its tables
    python -m benchmarks.fidelity --data-dir ../shared/data --estimate    # the cost only
    python -m benchmarks.fidelity --data-dir ../shared/data --tasks trec,cola --results X
                                          # the shared data's tasks the benchmark leaves out
    python -m benchmarks.fidelity --tiny --data-dir DIR                   # tests: tiny model
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import shlex
import signal
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from benchmarks.common.paths import RESULTS as RESULTS_FOLDER
from benchmarks.common.results import ResultsFile
from benchmarks.common.tables import markdown_table
from benchmarks.fidelity.plan import (
    CALIBRATION_TASKS,
    DEPT_M,
    METHODS,
    OTHER_TASKS,
    TASKS,
    Plan,
    Records,
    Run,
    Setting,
    benchmark_runs,
    calibration_batch,
    calibration_runs,
    full_benchmark,
    records_of,
)
from benchmarks.fidelity.report import TARGET_HOURS, benchmark_report, calibration_report, fits_line

RESULTS = RESULTS_FOLDER / "fidelity.jsonl"
# --steps: what `--calibrate` found on the quiet 2-core machine at batch 8 (2026-11-24: PT
# left the majority class on SST-2, MPQA and MRPC at 75 steps, not at 50; docs/fidelity.md)
FULL = dict(
    model="minilm", max_length=64, budget_length=100, batch_size=8, head_lr=5e-3,
    train_examples=5000, eval_examples=200, test_examples=500, evals=4, steps=75,
    probe_steps=10, calibrate_steps="50,75,100,150,300",
)  # fmt: skip
TINY = dict(
    model="tiny-bert", max_length=16, budget_length=100, batch_size=4, head_lr=5e-3,
    train_examples=24, eval_examples=12, test_examples=12, evals=2, steps=4,
    probe_steps=2, calibrate_steps="2,4",
)  # fmt: skip
TINY_IPT = (("pretrain_epochs", 1), ("pretrain_width", 4))  # a tiny pretraining of its table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; setting flags left out take FULL's defaults (TINY's with --tiny)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calibrate", action="store_true", help="find the step count (PT)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--report", action="store_true", help="only print the tables of --results")
    mode.add_argument("--estimate", action="store_true", help="time each method, estimate, exit")
    p.add_argument("--data-dir", default=os.environ.get("RAYPEFT_SHARED_DATA"))
    p.add_argument("--results", type=Path, default=RESULTS, help="JSON-lines results file")
    p.add_argument("--markdown", type=Path, help="also write the report here")
    p.add_argument("--tiny", action="store_true", help="tiny random model, a few examples")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--lrs", type=int, default=2, help="learning rates tried per method")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--curve-tasks", default="sst2,mrpc")
    p.add_argument("--curve-m", default="20,40,60,80")
    p.add_argument("--ablation-tasks", default="sst2,mrpc")
    p.add_argument("--calibrate-tasks", default=",".join(CALIBRATION_TASKS))
    p.add_argument("--margin", type=float, default=0.02, help="calibration: accuracy over majority")
    for flag, kind in [
        ("model", str), ("max-length", int), ("budget-length", int), ("batch-size", int),
        ("head-lr", float), ("train-examples", int), ("eval-examples", int),
        ("test-examples", int), ("evals", int), ("steps", int), ("probe-steps", int),
        ("calibrate-steps", str),
    ]:  # fmt: skip
        p.add_argument(f"--{flag}", type=kind, help=f"default {FULL[flag.replace('-', '_')]}")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument(
        "--head-pooling", default="auto", choices=["auto", "first", "mean"],
        help="model.head_pooling (auto: mean on MiniLM, first on the tiny model)",
    )  # fmt: skip
    p.add_argument("--ipt-corpus", help="IPT's pretraining corpus (default: BBC News)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    args = p.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("seeds", "steps", "evals", "jobs", "threads", "probe_steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be at least 1")
    if not 1 <= args.lrs <= min(len(m.lrs) for m in METHODS.values()):
        p.error("--lrs must be between 1 and the grids' length (3)")
    return args


def usage_error(message: str) -> NoReturn:
    """One line on stderr and exit code 2, as argparse does for a bad flag."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _names(text: str, known, flag: str) -> tuple[str, ...]:
    """A comma-separated list checked against the known names."""
    names = tuple(x for x in text.split(",") if x)
    unknown = [x for x in names if x not in known]
    if unknown:
        usage_error(f"{flag}: unknown {unknown}; choose from {list(known)}")
    return names


KNOWN_TASKS = TASKS + OTHER_TASKS


def plan_of(args: argparse.Namespace) -> Plan:
    """What this command trains."""
    return Plan(
        tasks=_names(args.tasks, KNOWN_TASKS, "--tasks"),
        methods=_names(args.methods, METHODS, "--methods"),
        lrs=args.lrs,
        seeds=args.seeds,
        steps=args.steps,
        curve_tasks=_names(args.curve_tasks, KNOWN_TASKS, "--curve-tasks"),
        curve_m=tuple(int(m) for m in args.curve_m.split(",") if m),
        ablation_tasks=_names(args.ablation_tasks, KNOWN_TASKS, "--ablation-tasks"),
        calibrate_tasks=_names(args.calibrate_tasks, KNOWN_TASKS, "--calibrate-tasks"),
        calibrate_steps=tuple(sorted(int(s) for s in args.calibrate_steps.split(","))),
        margin=args.margin,
    )


def setting_of(args: argparse.Namespace, hidden_size: int) -> Setting:
    """What every run shares; the budget is ``--budget-length`` prompt tokens of width d."""
    ipt = TINY_IPT if args.tiny else ()
    if args.ipt_corpus:
        ipt += (("corpus", str(Path(args.ipt_corpus).resolve())),)
    return Setting(
        model=args.model,
        max_length=args.max_length,
        budget_length=args.budget_length,
        budget_params=args.budget_length * hidden_size,
        batch_size=args.batch_size,
        head_lr=args.head_lr,
        train_examples=args.train_examples,
        eval_examples=args.eval_examples,
        test_examples=args.test_examples,
        evals=args.evals,
        precision=args.precision,
        head_pooling=args.head_pooling,
        ipt=ipt,
    )


def command_line(args: argparse.Namespace, mode: str = "") -> str:
    """The command that reproduces this benchmark, every setting spelled out."""
    words = ["python", "-m", "benchmarks.fidelity", "--data-dir", args.data_dir or "DIR"]
    words += ["--tiny"] if args.tiny else []
    for key in [
        "tasks", "methods", "lrs", "seeds", "steps", "curve_tasks", "curve_m", "ablation_tasks",
        "model", "max_length", "budget_length", "batch_size", "head_lr", "train_examples",
        "eval_examples", "test_examples", "evals", "precision", "head_pooling", "ipt_corpus",
        "jobs", "threads",
    ]:  # fmt: skip
        if getattr(args, key) is not None:
            words += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    if mode == "calibrate":
        words += ["--calibrate", "--calibrate-tasks", args.calibrate_tasks]
        words += ["--calibrate-steps", args.calibrate_steps, "--margin", str(args.margin)]
    return shlex.join(words)


class ResultStore(ResultsFile):
    """The JSON-lines results file: read once, then one line appended per finished run."""

    def records(self, setting: Setting) -> Records:
        """The records of ``setting``, by run key."""
        return records_of(self.rows(), setting)


@dataclass(frozen=True)
class Timing:
    """One method's measured costs: a training step, one evaluated example, the rest."""

    step_s: float
    eval_example_s: float
    fixed_s: float


def fit_timings(records: list[dict]) -> dict[str, Timing]:
    """Each method's timing, averaged over its finished records."""
    out = {}
    for method in METHODS:
        mine = [r for r in records if r["method"] == method and "evaluated" in r and "step_s" in r]
        if not mine:
            continue
        step = statistics.mean(r["step_s"] for r in mine)
        per_example = statistics.mean(r["eval_example_s"] for r in mine)
        fixed = statistics.mean(
            max(0.0, r["seconds"] - r["steps"] * step - r["evaluated"] * per_example) for r in mine
        )
        out[method] = Timing(step, per_example, fixed)
    return out


def predict_seconds(run: Run, timing: Timing, setting: Setting) -> float:
    """A run's expected seconds: its steps and evaluations at the measured costs, scaled by
    its sequence length where a DePT variant changes m."""
    m = dict(run.variant).get("method.prompt_length")
    scale = (m + setting.max_length) / (DEPT_M + setting.max_length) if m else 1.0
    every = max(1, run.steps // setting.evals)
    evals = -(-run.steps // every)
    examples = evals * setting.eval_examples + setting.test_examples
    return timing.fixed_s + scale * (run.steps * timing.step_s + examples * timing.eval_example_s)


def estimate_wall(
    runs: list[Run], timings: dict[str, Timing], setting: Setting, jobs: int
) -> float:
    """Seconds to train ``runs`` on ``jobs`` workers (their summed time shared evenly)."""
    return sum(predict_seconds(r, timings[r.method], setting) for r in runs) / max(1, jobs)


def timing_table(timings: dict[str, Timing]) -> list[str]:
    """The measured costs per method (``--estimate``)."""
    header = ("method", "s / training step", "ms / evaluated example", "s / run besides")
    rows = [
        (method, f"{t.step_s:.3f}", f"{1000 * t.eval_example_s:.1f}", f"{t.fixed_s:.1f}")
        for method, t in timings.items()
    ]
    return markdown_table(header, rows).splitlines()


def hours(seconds: float) -> str:
    """``1 h 05 min`` or ``12 min``."""
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


class Runner:
    """The worker pool and the results file: runs what a plan releases, as it releases it."""

    def __init__(self, args, setting: Setting, store: ResultStore, pool, probe_task: str):
        self.args, self.setting, self.store, self.pool = args, setting, store, pool
        self.data_dir = args.data_path
        self.probe_task = probe_task  # prepared for every method
        self.probed: dict[str, Timing] = {}

    def records(self) -> Records:
        """The finished runs of this setting."""
        return self.store.records(self.setting)

    def timings(self) -> dict[str, Timing]:
        """Measured timings: finished runs' where there are some, else the probe's."""
        return self.probed | fit_timings(list(self.records().values()))

    def probe(self, plan: Plan) -> None:
        """Time ``--probe-steps`` of each method not timed yet (not kept in the results)."""
        missing = [m for m in plan.methods if m not in self.timings()]
        if not missing:
            return
        from benchmarks.fidelity.worker import probe_run  # why: --report runs without torch

        steps = self.args.probe_steps
        runs = [Run(self.probe_task, m, plan.grid(m)[0], 0, steps) for m in missing]
        print(f"Timing {self.args.probe_steps} steps of {', '.join(missing)} ...", flush=True)
        work = [(r, self.setting, self.data_dir) for r in runs]
        done = self.pool.starmap(probe_run, work, chunksize=1)
        self.probed |= fit_timings([r for r in done if "error" not in r])
        for r in (r for r in done if "error" in r):
            print(f"  probe of {r['label']} failed: {r['error']}")

    def full_wall(self, plan: Plan, steps: int) -> float:
        """Estimated seconds of the whole benchmark at ``steps``, finished runs included."""
        timings = self.timings()
        runs = full_benchmark(replace(plan, steps=steps), self.setting)
        runs = [r for r in runs if r.method in timings]
        return estimate_wall(runs, timings, self.setting, self.args.jobs)

    def execute(self, release, everything) -> int:
        """Run what ``release(records)`` returns, again after each result, until nothing is
        left; append each record as it arrives (``everything(records)``: all the runs, for
        the progress line). Returns the number of runs that raised."""
        from benchmarks.fidelity.worker import train_run  # why: --report runs without torch

        results: queue.SimpleQueue = queue.SimpleQueue()
        submitted, in_flight, errors, start = set(), 0, 0, time.time()
        while True:
            for run in release(self.records()):
                key = run.key(self.setting)
                if key in submitted or key in self.records():
                    continue
                submitted.add(key)
                in_flight += 1
                args = (run, self.setting, self.data_dir)
                self.pool.apply_async(train_run, args, callback=results.put)
            if not in_flight:
                return errors
            record = results.get()
            in_flight -= 1
            if "error" in record:
                errors += 1
                print(f"  FAILED {record['label']}: {record['error']}", flush=True)
                continue
            self.store.append(record | {"session": start})
            self._progress(record, everything)

    def _progress(self, record: dict, everything) -> None:
        """One line per finished run, with the time still to go."""
        records = self.records()
        everything = everything(records)
        left = [r for r in everything if r.key(self.setting) not in records]
        done = len(everything) - len(left)
        timings = self.timings()
        eta = estimate_wall(
            [r for r in left if r.method in timings], timings, self.setting, self.args.jobs
        )
        if record.get("failed"):
            score = f"failed: {record['failed']}"
        else:
            score = f"val {100 * record['val']:.1f} test {100 * record['test']:.1f}"
        print(
            f"[{done}/{len(everything)}] {record['label']}, {record['steps']} steps: {score} "
            f"({record['seconds']:.0f} s); about {hours(eta)} to go",
            flush=True,
        )


def run_benchmark(args, plan: Plan, runner: Runner) -> list[str]:
    """The three parts, run as their inputs become known; then the report."""
    everything = full_benchmark(plan, runner.setting, runner.records())
    left = [r for r in everything if r.key(runner.setting) not in runner.records()]
    runner.probe(plan)
    timings = runner.timings()
    wall = estimate_wall(
        [r for r in left if r.method in timings], timings, runner.setting, args.jobs
    )
    print(
        f"{len(everything)} runs, {len(everything) - len(left)} finished before; estimated wall "
        f"time for the {len(left)} left: {hours(wall)} ({args.jobs} workers × {args.threads} "
        f"thread{'s' * (args.threads > 1)})",
        flush=True,
    )
    print(fits_line(lambda steps: runner.full_wall(plan, steps), TARGET_HOURS), flush=True)
    if args.estimate:
        return timing_table(timings)
    errors = runner.execute(
        lambda records: benchmark_runs(plan, runner.setting, records),
        lambda records: full_benchmark(plan, runner.setting, records),
    )
    if errors:
        print(f"{errors} runs raised (not kept): run the same command again to retry them")
    return benchmark_report(plan, runner.setting, runner.records(), command_line(args))


def run_calibration(args, plan: Plan, runner: Runner) -> list[str]:
    """PT at increasing step counts until it leaves the majority class on every task."""
    runner.probe(plan)  # every method: the full run's estimate per count

    def full_wall(steps: int) -> float:
        return runner.full_wall(plan, steps)

    timings, spent = runner.timings(), 0.0
    print(fits_line(full_wall, TARGET_HOURS), flush=True)
    for steps in plan.calibrate_steps:
        spent += estimate_wall(calibration_batch(plan, steps), timings, runner.setting, args.jobs)
        print(
            f"  {steps} steps: calibration up to here about {hours(spent)}; the full benchmark "
            f"at {steps} steps about {hours(full_wall(steps))} ({args.jobs} workers)",
            flush=True,
        )
    if args.estimate:
        return timing_table(timings)
    everything = [r for s in plan.calibrate_steps for r in calibration_batch(plan, s)]
    release = lambda records: calibration_runs(plan, runner.setting, records)  # noqa: E731
    runner.execute(release, lambda records: everything)
    return calibration_report(
        plan, runner.setting, runner.records(), full_wall, command_line(args, "calibrate")
    )


def train_and_report(args, plan: Plan, store: ResultStore) -> list[str]:
    """Prepare the tasks in this process, start the workers, run the mode."""
    from benchmarks.fidelity import worker as fidelity_worker  # why: --report: no torch

    setting = setting_of(args, fidelity_worker.hidden_size(args.model))
    data_dir = args.data_path
    tasks = plan.calibrate_tasks if args.calibrate else _needed_tasks(plan)
    tasks = tasks[:1] if args.estimate else tasks  # the probe's task only
    print(f"Preparing {len(tasks)} tasks ({args.model}, s={args.max_length}) ...", flush=True)
    # every method on the first task (the timing probe's), what the mode trains on the rest
    fidelity_worker.prepare_tasks(setting, data_dir, tasks[:1], plan.methods)
    rest = ("PT",) if args.calibrate else plan.methods
    fidelity_worker.prepare_tasks(setting, data_dir, tasks[1:], rest)
    # spawned, not forked: a child forked after the parent's torch ran multi-threaded (IDPG's
    # encodings) hangs in its first multi-threaded step (GNU OpenMP is not fork-safe)
    init = fidelity_worker.init_worker
    work = (args.threads, fidelity_worker.TASKS, fidelity_worker.MAJORITY)
    with mp.get_context("spawn").Pool(args.jobs, initializer=init, initargs=work) as pool:
        runner = Runner(args, setting, store, pool, tasks[0])
        if args.calibrate:
            return run_calibration(args, plan, runner)
        return run_benchmark(args, plan, runner)


def _needed_tasks(plan: Plan) -> tuple[str, ...]:
    """The main tasks, then the curve's and ablations' not among them."""
    extra = [t for t in plan.curve_tasks + plan.ablation_tasks if t not in plan.tasks]
    return plan.tasks + tuple(dict.fromkeys(extra))


def stored_setting(args, store: ResultStore) -> Setting | None:
    """The setting of these flags as the results file holds it (d read from a record's
    budget, so that --report needs no model)."""
    for line in store.rows():
        hidden = line.get("setting", {}).get("budget_params", 0) // args.budget_length
        setting = setting_of(args, hidden)
        if setting.fingerprint() == line.get("fingerprint"):
            return setting
    return None


def report_only(args, plan: Plan, store: ResultStore) -> list[str]:
    """The tables from the results file alone."""
    setting = stored_setting(args, store)
    if setting is None:
        usage_error(f"{args.results} holds no run of this setting (give the run's flags)")
    records = store.records(setting)
    if not args.calibrate:
        return benchmark_report(plan, setting, records, command_line(args))
    timings = fit_timings(list(records.values()))

    def wall(steps: int) -> float:
        runs = full_benchmark(replace(plan, steps=steps), setting)
        return estimate_wall(runs, timings, setting, args.jobs)

    timed = all(m in timings for m in plan.methods)
    command = command_line(args, "calibrate")
    return calibration_report(plan, setting, records, wall if timed else None, command)


def main(argv: list[str] | None = None) -> None:
    """Run the mode the command line names; print (and with --markdown write) its tables."""
    args = parse_args(argv)
    plan = plan_of(args)
    store = ResultStore(args.results.resolve())
    if args.report:
        lines = report_only(args, plan, store)
    else:
        if not args.data_dir or not Path(args.data_dir).is_dir():
            usage_error("--data-dir: name the shared data folder (or set RAYPEFT_SHARED_DATA)")
        args.data_path = Path(args.data_dir).resolve()  # the command line shows it as given
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the pool is terminated on exit
        lines = train_and_report(args, plan, store)
    if lines:
        print("\n" + "\n".join(lines))
    if lines and args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
