"""DePT against Prompt Tuning at equal trainable parameters, and Ray's per-trial overhead.

What it measures
----------------
Part A: the efficiency claim of DePT (METHODS.md, dept.txt §3.3). PT with ``l=100`` soft-prompt
tokens against DePT with ``m=40`` tokens and the rank ``r`` that fits PT's budget
(``DePTConfig(budget_prompt_length=100, prompt_length=40)``), on the pre-trained MiniLM
(``ModelConfig(name="minilm", max_length=256)``: d=384, s=256, so r=(100-40)*384//(256+384)=36
and both train exactly 38,400 prompt parameters; the task head is the same for both and is
counted separately). The backbone sees ``l+s = 356`` positions with PT and ``m+s = 296`` with
DePT. Inputs are padded to exactly s=256 (real tweets from the packaged task by default, or
random token ids with ``--data random``); both methods get the very same batches.

1. Training step time: forward, then ``raypeft.training.optimizer.optimizer_step`` (backward,
   gradient clipping, AdamW step, schedule), exactly as ``raypeft.training.loop.train`` takes it
   (batch 16). Both models are built in this process; after
   ``--warmup`` steps each, the timed steps ALTERNATE between the methods step by step (and the
   order within a pair flips every round), so slow phases of a shared, noisy machine hit both
   alike. Reported: median step time per method, and the median of the per-pair ratios.
2. Inference time per batch: a ``torch.no_grad`` forward in eval mode, interleaved the same way.
3. Peak memory of a training step, from the kernel's high-water mark of the resident set. Each
   method runs in a FRESH subprocess (this module with a hidden flag), so no other model or
   allocator history is in it; the subprocesses alternate PT/DePT over ``--memory-repeats``
   repeats. A subprocess reads the pre-tokenised batches from a file the parent wrote (no CSV
   parsing or tokeniser in it), loads the model and records its RSS, then resets the
   high-water mark (``echo 5 > /proc/self/clear_refs``), runs one no-grad forward and reads the
   high-water mark (``VmHWM`` in ``/proc/self/status``), resets it again and runs
   ``--memory-steps`` training steps and reads it again. Reported: the memory ADDED by a
   training step (peak during the steps minus the RSS before them: activations kept for
   backward, gradients, AdamW state) and by an inference forward, and the total training peak.
   Why not ``resource.getrusage(RUSAGE_SELF).ru_maxrss``: on Linux a child started by
   fork+exec inherits its parent's RSS in ``ru_maxrss`` (the benchmark's parent holds two
   models and their activations, ~1.5 GB, which masked everything), and ``ru_maxrss`` cannot
   be reset between phases. Where ``/proc`` is unavailable the script falls back to
   ``ru_maxrss`` (and says so). The subprocesses run with ``MALLOC_MMAP_THRESHOLD_=65536``:
   glibc's adaptive threshold otherwise keeps freed activation buffers in the heap, so the RSS
   of step 2 would carry step 1's garbage (measured: +185 MB on the training peak of each
   method, which blurs their difference). Timing runs with the default allocator.

Part B: Ray-driven trial throughput against the bare training loop on the same work. A small
configuration (MiniLM, s=64, PT l=20, ``max_steps=40``, ``eval_every=20``, 640 training and 200
validation/test tweets) is trained N times (``--ray-trials``, default 4) by calling
``raypeft.training.loop.train(cfg, task, report=lambda m, c: None)`` directly in this process,
one after another (the "bare loop"), and through ``raypeft.search.run.run_experiment`` (Ray
Tune + Optuna + MLflow; ``search.num_samples=N``, ``search.scheduler.type=none``), once with
``resources.trial_runner=in_process`` and once with ``ray_train``. The searched key is
``method.lr`` (a choice of N distinct values, 0.1, 0.2, ...: the searcher does not run a
discrete configuration twice), which does not change the work. Bare passes and Ray runs
alternate (bare, in_process, bare, ray_train, bare); each search is compared with the mean of
the two bare passes (tokenisation + N trials) run right before and after it, since the load of
a shared machine drifts over minutes (the 1-minute load average is printed with each phase).
Each Ray run starts and shuts down its own local Ray, as one ``raypeft tune`` would, so its
wall time includes ``ray.init``, MLflow's sqlite setup, tokenisation, and the final test-split
evaluation of the best trial. Reported: total wall time of the search against the bare
reference, the ratio, and the overhead per trial in seconds; then the same overhead against a
bare reference that also scores the best trial's checkpoint on the test split once, as the
search's finish phase does (work the user asked for, not overhead:
``raypeft.search.outcome.score_on_test``, timed in every bare pass), and where each search's
time went (its phases as the search reports them, ``SearchSummary.phase_s``: prepare,
open_records with ``ray.init``, fit, analyse, finish). A process that trains several trials
keeps the frozen backbone loaded (``raypeft.modeling.cache``): the bare loop and each reused
Tune actor read it once; a Ray Train trial runs in new worker processes (Ray Train V2 starts a
worker group per ``TorchTrainer.fit``) and reads it again. MLflow writes to a sqlite file (its
artifacts to ./mlruns, so the searches run with the temp dir as working directory) and Ray to a
storage path, all in a temp dir, so nothing lands in the repo. Tune runs trials concurrently
where CPUs allow (2 CPUs: two 1-thread trials), while the bare loop runs one trial at a time
with ``--threads`` threads.

Absolute numbers depend on the (shared, 2-core) machine; read the ratios.

How to run
----------
    .venv/bin/python -m benchmarks.dept_vs_pt                 # Part A and Part B
    .venv/bin/python -m benchmarks.dept_vs_pt --skip-ray      # Part A only (~3-5 min)
    .venv/bin/python -m benchmarks.dept_vs_pt --skip-steps    # Part B only
    .venv/bin/python -m benchmarks.dept_vs_pt --steps 20 --threads 1 --data random

``--help`` lists every flag.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common.machine import load_note
from benchmarks.common.memory import MiB, PeakMeter, rss_bytes
from benchmarks.common.processes import run_module
from benchmarks.common.searches import phases_line, quiet_and_local
from benchmarks.common.tables import print_table, right_aligned_after
from benchmarks.common.timing import interleaved_seconds, median_ratio

METHODS = ("pt", "dept")
LABEL = {"pt": "PT", "dept": "DePT"}
INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


# ----------------------------------------------------------------------------- models, batches


def method_dict(name: str, args: argparse.Namespace) -> dict:
    """PT with ``--pt-length`` tokens, or DePT with ``--dept-length`` within PT's budget."""
    if name == "pt":
        return {"name": "pt", "prompt_length": args.pt_length}
    return {
        "name": "dept",
        "prompt_length": args.dept_length,
        "budget_prompt_length": args.pt_length,
    }


def step_config(name: str, args: argparse.Namespace):
    from raypeft.config.loading import validate_experiment  # why: --help starts fast

    return validate_experiment(
        {
            "name": f"bench_{name}",
            "model": {"name": args.model, "max_length": args.max_length},
            "method": method_dict(name, args),
            "train": {"batch_size": args.batch_size, "num_threads": args.threads},
        },
        "benchmark",
    )


def build(name: str, args: argparse.Namespace, num_labels: int):
    """One method's model and what trains it (a :class:`~benchmarks.common.training.Trainee`),
    through the same code path as a trial."""
    from benchmarks.common.training import Trainee
    from raypeft.modeling.backbones import load_backbone
    from raypeft.modeling.prompted import PromptedModel

    cfg = step_config(name, args)
    backbone = load_backbone(cfg.model, num_labels, "classification", seed=cfg.train.seed)
    return Trainee.of(PromptedModel(backbone, cfg.method), cfg)


def make_batches(args: argparse.Namespace) -> tuple[dict, int]:
    """numpy arrays of shape (n_batches, batch, s) per input, and the number of labels."""
    import numpy as np

    n = args.num_batches * args.batch_size
    arrays, num_labels = random_arrays(args, n) if args.data == "random" else tweets(args, n)
    shape = (args.num_batches, args.batch_size)
    out = {
        k: np.asarray(v, dtype=np.int64).reshape(*shape, *v.shape[1:]) for k, v in arrays.items()
    }
    if out["input_ids"].shape[-1] != args.max_length:
        raise AssertionError("inputs must be padded to exactly s")
    return out, num_labels


def random_arrays(args: argparse.Namespace, n: int) -> tuple[dict, int]:
    """``n`` examples of random token ids (3 labels)."""
    import numpy as np

    from raypeft.modeling.backbones import load_tokenizer

    vocab = len(load_tokenizer(args.model))
    rng = np.random.default_rng(0)
    arrays = {
        "input_ids": rng.integers(1000, vocab, (n, args.max_length)),
        "attention_mask": np.ones((n, args.max_length), np.int64),
        "token_type_ids": np.zeros((n, args.max_length), np.int64),
        "labels": rng.integers(0, 3, n),
    }
    return arrays, 3


def tweets(args: argparse.Namespace, n: int) -> tuple[dict, int]:
    """``n`` tweets of the packaged task, tokenised as a trial reads them."""
    from raypeft.config.schema import ModelConfig, TaskConfig
    from raypeft.data import prepare_task

    task = prepare_task(
        TaskConfig(max_train_examples=n, max_eval_examples=8),
        ModelConfig(name=args.model, max_length=args.max_length),
    )
    return dict(task.splits["train"]), task.num_labels


def torch_batches(arrays: dict) -> list[dict]:
    """One dict of tensors per batch (inputs and labels), as the training loop feeds them."""
    import torch

    keys = [k for k in (*INPUT_KEYS, "labels") if k in arrays]
    return [
        {k: torch.from_numpy(arrays[k][i]) for k in keys}
        for i in range(arrays["input_ids"].shape[0])
    ]


def inputs_of(batch: dict) -> dict:
    """A batch without its labels: what an inference forward reads."""
    return {k: v for k, v in batch.items() if k != "labels"}


# ----------------------------------------------------------------------------- Part A: memory


def memory_worker(args: argparse.Namespace) -> None:
    """Hidden entry point: one method's memory in a fresh process; prints one JSON line."""
    import gc

    import numpy as np
    import torch

    from benchmarks.common.training import training_step

    torch.set_num_threads(args.threads)
    with np.load(args._batches) as data:
        batches = torch_batches({k: data[k] for k in data.files})
    trainee = build(args._memory_worker, args, int(args._num_labels))
    meter = PeakMeter()  # its first reset happens here
    gc.collect()
    out = {"source": meter.source, "peak_loaded": meter.peak()}
    meter.reset()
    out["rss_loaded"] = rss_bytes()
    trainee.model.eval()
    with torch.no_grad():
        trainee.model(**inputs_of(batches[0]))
    out["peak_infer"] = meter.peak()
    trainee.model.train()
    gc.collect()
    meter.reset()
    out["rss_before_train"] = rss_bytes()
    for i in range(args.memory_steps):
        training_step(trainee, batches[i % len(batches)])
    out["peak_train"] = meter.peak()
    print(json.dumps(out))


def memory_in_fresh_process(
    name: str, args: argparse.Namespace, batches_file: Path, num_labels: int
) -> dict:
    """:func:`memory_worker` for ``name`` in a new interpreter (this module, hidden flags)."""
    flags = {
        "--_memory-worker": name,
        "--_batches": batches_file,
        "--_num-labels": num_labels,
        "--threads": args.threads,
        "--memory-steps": args.memory_steps,
        "--model": args.model,
        "--max-length": args.max_length,
        "--batch-size": args.batch_size,
        "--pt-length": args.pt_length,
        "--dept-length": args.dept_length,
    }
    # A fixed mmap threshold turns off glibc's adaptive one, so freed tensors go back to the
    # OS and RSS follows the live tensors instead of the heap's history.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
    words = [str(w) for pair in flags.items() for w in pair]
    return json.loads(run_module(__spec__.name, words, env).strip().splitlines()[-1])


def measure_memory(args: argparse.Namespace, arrays: dict, num_labels: int) -> dict:
    """Each method's memory, one fresh subprocess per method and repeat, alternating."""
    import numpy as np

    mem: dict[str, list[dict]] = {name: [] for name in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        batches_file = Path(tmp) / "batches.npz"
        np.savez(batches_file, **arrays)
        for rep in range(args.memory_repeats):
            for name in METHODS if rep % 2 == 0 else METHODS[::-1]:
                mem[name].append(memory_in_fresh_process(name, args, batches_file, num_labels))
    return mem


# ----------------------------------------------------------------------------- Part A: time


def check_equal_budget(built: dict, args: argparse.Namespace) -> dict:
    """Print the two methods' sizes; fail unless both train PT's budget. Returns the facts
    the table reports (trainable counts, backbone sequence lengths)."""
    from raypeft.methods.sizing import soft_prompt_params

    dims = built["pt"].model.dims
    counts = {name: built[name].model.method.num_trainable() for name in METHODS}
    head = sum(p.numel() for p in built["pt"].model.param_groups()["head"])
    rank = built["dept"].model.method.config.resolve(dims).rank
    budget = soft_prompt_params(args.pt_length, dims.hidden_size)
    slack = budget - counts["dept"]
    print(
        f"d={dims.hidden_size}, s={dims.max_length}, DePT rank r={rank}; trainable prompt "
        f"params: PT {counts['pt']:,}, DePT {counts['dept']:,} (budget l*d = {budget:,}, "
        f"DePT floor slack = {slack:,}); task head {head:,} each (not counted)",
        flush=True,
    )
    if counts["pt"] != budget or not 0 <= slack < dims.max_length + dims.hidden_size:
        raise AssertionError("PT and DePT are not at equal trainable parameters")
    lengths = {"pt": args.pt_length, "dept": args.dept_length}
    return {"counts": counts, "seq": {n: lengths[n] + dims.max_length for n in METHODS}}


def time_training_steps(built: dict, batches: list[dict], args) -> dict[str, list[float]]:
    """Training steps of both methods, alternating step by step after ``--warmup`` each."""
    from benchmarks.common.training import training_step

    for trainee in built.values():
        trainee.model.train()

    def stepper(name: str):
        return lambda i: training_step(built[name], batches[i % len(batches)])

    actions = {name: stepper(name) for name in METHODS}
    return interleaved_seconds(actions, args.steps, args.warmup)


def time_inference(built: dict, batches: list[dict], args) -> dict[str, list[float]]:
    """No-grad forwards in eval mode, alternating batch by batch after one warm-up each."""
    import torch

    for trainee in built.values():
        trainee.model.eval()

    def forward(name: str):
        return lambda i: built[name].model(**inputs_of(batches[i % len(batches)]))

    with torch.no_grad():
        return interleaved_seconds({n: forward(n) for n in METHODS}, args.infer_batches, 1)


def part_a(args: argparse.Namespace) -> None:
    """PT against DePT at equal budget: step time, inference time, memory; then the table."""
    import torch

    torch.set_num_threads(args.threads)
    print(
        f"== Part A: PT l={args.pt_length} vs DePT m={args.dept_length} (same budget), "
        f"model={args.model}, s={args.max_length}, batch={args.batch_size}, "
        f"threads={args.threads}, data={args.data}{load_note()}",
        flush=True,
    )
    t0 = time.perf_counter()
    arrays, num_labels = make_batches(args)
    batches = torch_batches(arrays)
    built = {name: build(name, args, num_labels) for name in METHODS}
    facts = check_equal_budget(built, args)
    steps = time_training_steps(built, batches, args)
    so_far = f"({time.perf_counter() - t0:.0f} s so far){load_note()}"
    print(f"  training steps done {so_far}", flush=True)
    infer = time_inference(built, batches, args)
    print(f"  inference done ({time.perf_counter() - t0:.0f} s so far){load_note()}", flush=True)
    del built
    mem = {}
    if args.memory_repeats:
        mem = measure_memory(args, arrays, num_labels)
        source = mem["pt"][0]["source"]
        print(f"  memory done ({time.perf_counter() - t0:.0f} s so far; peak source: {source})")
    print()
    header = ("metric", "PT", "DePT", "ratio DePT/PT")
    rows = time_rows(facts, steps, infer, args) + memory_rows(mem)
    print_table(header, rows, right_aligned_after(1, len(header)))
    print()
    print_raw(steps, infer, mem)
    print(f"Part A took {time.perf_counter() - t0:.0f} s", flush=True)


def ratio_row(label: str, pt: float, dept: float, fmt: str) -> tuple[str, ...]:
    return (label, format(pt, fmt), format(dept, fmt), f"{dept / pt:.3f}")


def time_rows(facts: dict, steps: dict, infer: dict, args) -> list[tuple[str, ...]]:
    """Part A's rows of sizes and times."""
    median = statistics.median
    counts, seq = facts["counts"], facts["seq"]
    return [
        ratio_row("trainable prompt params", counts["pt"], counts["dept"], ","),
        ratio_row("backbone sequence length (l or m, + s)", seq["pt"], seq["dept"], "d"),
        ratio_row(
            f"train step, median of {args.steps} (s)",
            median(steps["pt"]),
            median(steps["dept"]),
            ".3f",
        ),
        (
            "train step, median of per-pair ratios",
            "",
            "",
            f"{median_ratio(steps['dept'], steps['pt']):.3f}",
        ),
        ratio_row("train step, fastest (s)", min(steps["pt"]), min(steps["dept"]), ".3f"),
        ratio_row(
            f"inference/batch, median of {args.infer_batches} (s)",
            median(infer["pt"]),
            median(infer["dept"]),
            ".3f",
        ),
        (
            "inference/batch, median of per-pair ratios",
            "",
            "",
            f"{median_ratio(infer['dept'], infer['pt']):.3f}",
        ),
        ratio_row("inference/batch, fastest (s)", min(infer["pt"]), min(infer["dept"]), ".3f"),
    ]


MEMORY_ROWS = (
    ("train step: memory added (MiB)", lambda r: r["peak_train"] - r["rss_before_train"]),
    ("train step: peak RSS, total (MiB)", lambda r: r["peak_train"]),
    ("inference: memory added (MiB)", lambda r: r["peak_infer"] - r["rss_loaded"]),
    ("RSS after loading (MiB)", lambda r: r["rss_loaded"]),
)


def memory_rows(mem: dict) -> list[tuple[str, ...]]:
    """Part A's memory rows: the median over the fresh subprocesses (none without them)."""
    if not mem:
        return []

    def mib(name, of):
        return statistics.median(of(r) for r in mem[name]) / MiB

    return [ratio_row(label, mib("pt", of), mib("dept", of), ".0f") for label, of in MEMORY_ROWS]


def print_raw(steps: dict, infer: dict, mem: dict) -> None:
    """Every measurement behind the medians."""
    print("raw train step times (s):")
    for name in METHODS:
        print(f"  {LABEL[name]:5s}", " ".join(f"{t:.3f}" for t in steps[name]))
    print("raw inference times (s):")
    for name in METHODS:
        print(f"  {LABEL[name]:5s}", " ".join(f"{t:.3f}" for t in infer[name]))
    if mem:
        keys = ("peak_loaded", "rss_loaded", "peak_infer", "rss_before_train", "peak_train")
        print("raw memory per subprocess (MiB: " + " / ".join(keys) + "):")
        for name in METHODS:
            for r in mem[name]:
                print(f"  {LABEL[name]:5s}", " / ".join(f"{r[k] / MiB:.0f}" for k in keys))


# ----------------------------------------------------------------------------- Part B


def searched_lrs(n: int) -> list[float]:
    """N distinct values of ``method.lr`` (0.1, 0.2, ...): the searcher runs each discrete
    configuration once, so N trials need N values; the learning rate does not change the work."""
    return [round(0.1 * (i + 1), 1) for i in range(n)]


def ray_config(args: argparse.Namespace, runner: str, tmp: Path):
    from raypeft.config.loading import validate_experiment

    return validate_experiment(
        {
            "name": f"bench_ray_{runner}",
            "model": {"name": args.ray_model, "max_length": args.ray_max_length},
            "task": {
                "name": "tweet_sentiment",
                "max_train_examples": args.ray_train_examples,
                "max_eval_examples": args.ray_eval_examples,
            },
            "method": {"name": "pt", "prompt_length": 20},
            "train": {
                "max_steps": args.ray_steps,
                "eval_every": args.ray_eval_every,
                "batch_size": 16,
            },
            "search": {
                "num_samples": args.ray_trials,
                "scheduler": {"type": "none"},
                "max_concurrent": args.ray_max_concurrent,
            },
            "space": {"method.lr": {"choice": searched_lrs(args.ray_trials)}},
            "resources": {"trial_runner": runner},
            "tracking": {
                "uri": f"sqlite:///{tmp / 'mlflow.db'}",
                "experiment": f"bench_ray_{runner}",
            },
            "run": {"storage_path": str(tmp / "ray_results")},
        },
        "benchmark",
    )


@dataclass
class BarePasses:
    """The bare loop's passes so far: every trial's seconds, each pass's total (tokenise + N
    trials) and its test evaluation of the best trial."""

    trials: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    tests: list[float] = field(default_factory=list)


class BestCheckpoint:
    """A bare trial's reporter that keeps its latest checkpoint (the loop's best model so far)
    in ``root/<index>``, for the test evaluation the search's finish phase does."""

    def __init__(self, root: Path, index: int):
        self.folder = root / str(index)

    def __call__(self, metrics: dict, folder: Path | None) -> None:
        import shutil

        if folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            shutil.copytree(folder, self.folder)


def bare_pass(base, args: argparse.Namespace, tmp: Path, passes: BarePasses) -> None:
    """Tokenise, train the N trials one after another in this process, score the best one's
    checkpoint on test: the search's work without Ray, MLflow or Optuna."""
    import torch

    from raypeft.config.schema import apply_trial_params
    from raypeft.data import prepare_task
    from raypeft.search.outcome import score_on_test
    from raypeft.training.evaluation import TargetMetric
    from raypeft.training.loop import train

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    task = prepare_task(base.task, base.model)
    prep = time.perf_counter() - start
    times, best = [], (float("-inf"), None)
    target = TargetMetric.of(base, task)  # higher is better for this task's metric
    for i, lr in enumerate(searched_lrs(args.ray_trials)):
        keep = BestCheckpoint(tmp / "bare_best", i)
        start = time.perf_counter()
        score = train(apply_trial_params(base, {"method.lr": lr}), task, report=keep)
        times.append(time.perf_counter() - start)
        best = max(best, (score[f"val_{target.name}"], keep.folder), key=lambda x: x[0])
    start = time.perf_counter()
    score_on_test(base, task, best[1])
    passes.tests.append(time.perf_counter() - start)
    passes.trials.extend(times)
    passes.totals.append(prep + sum(times))
    print(
        f"  bare pass: tokenise {prep:.1f} s, trials {' '.join(f'{t:.1f}' for t in times)} s; "
        f"total {passes.totals[-1]:.1f} s; test evaluation of the best {passes.tests[-1]:.1f} s"
        + load_note(),
        flush=True,
    )


def ray_search(args: argparse.Namespace, runner: str, tmp: Path) -> float:
    """One search through raypeft with ``runner``: its wall time (``ray.init`` to shutdown)."""
    from benchmarks.common.searches import timed_search

    summary, wall = timed_search(ray_config(args, runner, tmp), tmp)
    print(
        f"  ray {runner}: {wall:.1f} s wall (summary.wall_s {summary.wall_s:.1f}); trials "
        f"{summary.num_trials}, errors {summary.num_errors}{load_note()}; phases "
        + phases_line(summary),
        flush=True,
    )
    return wall


def part_b(args: argparse.Namespace) -> None:
    """Ray's searches against bare passes of the same work, alternating; then the table."""
    runners = [r.strip() for r in args.ray_runners.split(",") if r.strip()]
    print(
        f"== Part B: {args.ray_trials} trials of {args.ray_model} s={args.ray_max_length} PT "
        f"l=20, max_steps={args.ray_steps}, eval_every={args.ray_eval_every}, "
        f"{args.ray_train_examples} train / {args.ray_eval_examples} eval examples; "
        f"runners {runners}; bare loop with {args.threads} threads",
        flush=True,
    )
    t0 = time.perf_counter()
    passes, walls = BarePasses(), {}
    with tempfile.TemporaryDirectory(prefix="raypeft_bench_") as tmpdir:
        tmp = Path(tmpdir)
        base = ray_config(args, "in_process", tmp)
        bare_pass(base, args, tmp, passes)
        for runner in runners:
            walls[runner] = ray_search(args, runner, tmp)
            if args.bare_between:
                bare_pass(base, args, tmp, passes)
    print()
    print_table(OVERHEAD_HEADER, overhead_rows(walls, passes, args), right_aligned_after(1, 8))
    print(
        f"(bare loop = mean of the bare passes run just before and after that search; "
        f"median bare trial {statistics.median(passes.trials):.1f} s over "
        f"{len(passes.trials)}; Part B took {time.perf_counter() - t0:.0f} s)",
        flush=True,
    )


OVERHEAD_HEADER = (
    "trial runner",
    "N",
    "bare loop (s)",
    "through Ray (s)",
    "ratio Ray/bare",
    "overhead per trial (s)",
    "bare + test eval (s)",
    "overhead per trial, test eval in both (s)",
)


def overhead_rows(walls: dict, passes: BarePasses, args) -> list[tuple[str, ...]]:
    """Each search against the bare passes run right before and after it (the load of a
    shared machine drifts over minutes)."""
    n, rows = args.ray_trials, []
    for i, (runner, t) in enumerate(walls.items()):
        near = slice(i, i + 2) if args.bare_between else slice(None)
        ref = statistics.mean(passes.totals[near])
        with_test = ref + statistics.mean(passes.tests[near])
        rows.append(
            (
                runner,
                str(n),
                f"{ref:.1f}",
                f"{t:.1f}",
                f"{t / ref:.2f}",
                f"{(t - ref) / n:+.1f}",
                f"{with_test:.1f}",
                f"{(t - with_test) / n:+.1f}",
            )
        )
    return rows


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--skip-steps",
        action="store_true",
        help="skip Part A (PT vs DePT step time, inference, memory)",
    )
    p.add_argument("--skip-ray", action="store_true", help="skip Part B (Ray vs the bare loop)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (A and bare B)")
    a = p.add_argument_group("Part A")
    a.add_argument("--model", default="minilm")
    a.add_argument("--max-length", type=int, default=256, help="s")
    a.add_argument("--pt-length", type=int, default=100, help="PT l (also DePT's budget)")
    a.add_argument("--dept-length", type=int, default=40, help="DePT m")
    a.add_argument("--batch-size", type=int, default=16)
    a.add_argument("--data", choices=["tweets", "random"], default="tweets")
    a.add_argument("--num-batches", type=int, default=4, help="distinct batches cycled through")
    a.add_argument("--warmup", type=int, default=2, help="untimed training steps per method")
    a.add_argument("--steps", type=int, default=10, help="timed training steps per method")
    a.add_argument(
        "--infer-batches", type=int, default=10, help="timed no-grad forwards per method"
    )
    a.add_argument(
        "--memory-repeats",
        type=int,
        default=2,
        help="fresh subprocesses per method for peak memory (0: skip memory)",
    )
    a.add_argument(
        "--memory-steps", type=int, default=2, help="training steps per memory subprocess"
    )
    b = p.add_argument_group("Part B")
    b.add_argument("--ray-trials", type=int, default=4, help="N: search.num_samples")
    b.add_argument("--ray-model", default="minilm")
    b.add_argument("--ray-max-length", type=int, default=64)
    b.add_argument("--ray-steps", type=int, default=40, help="train.max_steps")
    b.add_argument("--ray-eval-every", type=int, default=20, help="train.eval_every")
    b.add_argument("--ray-train-examples", type=int, default=640)
    b.add_argument("--ray-eval-examples", type=int, default=200)
    b.add_argument(
        "--ray-max-concurrent",
        type=int,
        default=None,
        help="search.max_concurrent (default: the tool's, CPUs per trial)",
    )
    b.add_argument(
        "--ray-runners",
        default="in_process,ray_train",
        help="comma-separated resources.trial_runner values",
    )
    b.add_argument(
        "--no-bare-between",
        dest="bare_between",
        action="store_false",
        help="one bare pass before the Ray runs instead of one around each",
    )
    # hidden: the memory subprocess
    p.add_argument("--_memory-worker", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--_batches", help=argparse.SUPPRESS)
    p.add_argument("--_num-labels", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Part A and Part B, as the flags ask (or the hidden memory worker)."""
    quiet_and_local()
    args = parse_args(argv)
    if args._memory_worker:
        memory_worker(args)
        return 0
    if not args.skip_steps:
        part_a(args)
    if not args.skip_ray:
        print()
        part_b(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
