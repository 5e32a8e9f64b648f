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
   ``raypeft.train.train`` does it (batch 16). Both models are built in this process; after
   ``--warmup`` steps each, the timed steps ALTERNATE between the methods step by step (and the
   order within a pair flips every round), so slow phases of a shared, noisy machine hit both
   alike. Reported: median step time per method, and the median of the per-pair ratios.
2. Inference time per batch: a ``torch.no_grad`` forward in eval mode, interleaved the same way.
3. Peak memory of a training step, measured with the kernel's high-water mark of the process's
   resident set. Each method runs in a FRESH subprocess (this script with a hidden flag), so no
   other model or allocator history is in it; the subprocesses alternate PT/DePT over
   ``--memory-repeats`` repeats. A subprocess reads the pre-tokenised batches from a file
   written by the parent (so no CSV parsing or tokeniser is in its peak), loads the model,
   records its current RSS (``/proc/self/statm``) and ``ru_maxrss``, runs one no-grad forward
   (``ru_maxrss`` again), then ``--memory-steps`` training steps (``ru_maxrss`` again). Reported:
   the total peak RSS after training, and the memory ADDED by training (peak after the steps
   minus the RSS right after loading: activations kept for backward, gradients, AdamW state)
   and by inference (peak after the no-grad forward minus the same RSS). The peak is a
   high-water mark: if loading the model itself peaked higher than inference does, the
   inference figure shows the load peak instead (the table marks the load peak too).

Part B: Ray-driven trial throughput against the bare training loop on the same work. A small
configuration (MiniLM, s=64, PT l=20, ``max_steps=40``, ``eval_every=20``, 640 training and 200
validation tweets) is trained N times (``--ray-trials``, default 4) by calling
``raypeft.train.train`` directly in this process, one after another, and then through
``raypeft.tune.run_experiment`` (Ray Tune + Optuna + MLflow; ``search.num_samples=N``,
``search.scheduler.type=none``) once with ``resources.trial_runner=in_process`` and once with
``ray_train``. The searched key is ``method.lr`` (choice of 0.1/0.3), which does not change the
work. Reported: total wall time of the search vs N bare trials (+ the one tokenisation the
search also does), the ratio, and the overhead per trial in seconds. MLflow writes to a sqlite
file and Ray to a storage path, both in a temp dir, so nothing lands in the repo. Note that Tune
may run trials concurrently (2 CPUs: two 1-thread trials), while the bare loop runs one trial at
a time with ``--threads`` threads.

Absolute numbers depend on the (shared, 2-core) machine; read the ratios.

How to run
----------
    .venv/bin/python benchmarks/dept_vs_pt.py                 # Part A and Part B
    .venv/bin/python benchmarks/dept_vs_pt.py --skip-ray      # Part A only (~2-5 min)
    .venv/bin/python benchmarks/dept_vs_pt.py --skip-steps    # Part B only
    .venv/bin/python benchmarks/dept_vs_pt.py --steps 20 --threads 1 --data random

``--help`` lists every flag.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Quiet and local: no usage stats, no telemetry, no Ray token file for a benchmark.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MiB = 1024 * 1024
METHODS = ("pt", "dept")
LABEL = {"pt": "PT", "dept": "DePT"}


# ----------------------------------------------------------------------------- helpers


def method_dict(name: str, args: argparse.Namespace) -> dict:
    if name == "pt":
        return {"name": "pt", "prompt_length": args.pt_length}
    return {"name": "dept", "prompt_length": args.dept_length, "budget_prompt_length": args.pt_length}


def step_config(name: str, args: argparse.Namespace):
    from raypeft.config import validate_experiment

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
    from raypeft.backbones import load_backbone
    from raypeft.model import PromptedModel
    from raypeft.train import build_optimizer

    cfg = step_config(name, args)
    backbone = load_backbone(cfg.model, num_labels, "classification", seed=cfg.train.seed)
    model = PromptedModel(backbone, cfg.method)
    return cfg, model, build_optimizer(model, cfg)


def train_step(model, optimizer, batch, max_grad_norm) -> None:
    import torch

    from raypeft.train import loss_fn

    inputs, labels = batch
    loss = loss_fn(model(**inputs), labels)
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
        from raypeft.backbones import load_tokenizer

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
        from raypeft.config import ModelConfig, TaskConfig
        from raypeft.data import prepare_task

        task = prepare_task(
            TaskConfig(max_train_examples=n, max_eval_examples=8),
            ModelConfig(name=args.model, max_length=args.max_length),
        )
        arrays = dict(task.splits["train"])
        num_labels = task.num_labels
    out = {
        k: np.asarray(v, dtype=np.int64).reshape(args.num_batches, args.batch_size, *v.shape[1:])
        for k, v in arrays.items()
    }
    assert out["input_ids"].shape[-1] == args.max_length, "inputs must be padded to exactly s"
    return out, num_labels


def torch_batches(arrays: dict) -> list[tuple[dict, object]]:
    import torch

    batches = []
    for i in range(arrays["input_ids"].shape[0]):
        inputs = {k: torch.from_numpy(arrays[k][i]) for k in ("input_ids", "attention_mask", "token_type_ids") if k in arrays}
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


def rss_peak() -> int:
    """High-water mark of the resident set in bytes (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(num, den))


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    header = ("metric", "PT", "DePT", "ratio DePT/PT")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    line = "  ".join("-" * w for w in widths)
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    print(fmt(header))
    print(line)
    for r in rows:
        print(fmt(r))


# ----------------------------------------------------------------------------- Part A


def memory_worker(args: argparse.Namespace) -> None:
    """Hidden entry point: one method's memory in a fresh process; prints one JSON line."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    with np.load(args._batches) as data:
        arrays = {k: data[k] for k in data.files}
    batches = torch_batches(arrays)
    num_labels = int(args._num_labels)
    cfg, model, optimizer = build(args._memory_worker, args, num_labels)
    import gc

    gc.collect()
    rss_loaded, peak_loaded = rss_now(), rss_peak()
    model.eval()
    with torch.no_grad():
        model(**batches[0][0])
    peak_infer = rss_peak()
    model.train()
    for i in range(args.memory_steps):
        train_step(model, optimizer, batches[i % len(batches)], cfg.train.max_grad_norm)
    peak_train = rss_peak()
    print(json.dumps({
        "rss_loaded": rss_loaded, "peak_loaded": peak_loaded,
        "peak_infer": peak_infer, "peak_train": peak_train,
    }))


def run_memory_subprocess(name: str, args: argparse.Namespace, batches_file: Path, num_labels: int) -> dict:
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "--_memory-worker", name,
        "--_batches", str(batches_file), "--_num-labels", str(num_labels),
        "--threads", str(args.threads), "--memory-steps", str(args.memory_steps),
        "--model", args.model, "--max-length", str(args.max_length),
        "--batch-size", str(args.batch_size), "--pt-length", str(args.pt_length),
        "--dept-length", str(args.dept_length),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"memory worker for {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def part_a(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from raypeft.budget import prompt_tuning_params

    torch.set_num_threads(args.threads)
    print(f"== Part A: PT l={args.pt_length} vs DePT m={args.dept_length} (same budget), "
          f"model={args.model}, s={args.max_length}, batch={args.batch_size}, "
          f"threads={args.threads}, data={args.data}")
    t0 = time.perf_counter()
    arrays, num_labels = make_batches(args)
    batches = torch_batches(arrays)

    built = {name: build(name, args, num_labels) for name in METHODS}
    dims = built["pt"][1].dims
    counts = {name: built[name][1].method.num_trainable() for name in METHODS}
    heads = {name: sum(p.numel() for p in built[name][1].param_groups()["head"]) for name in METHODS}
    dept_cfg = built["dept"][1].method.config.resolve(dims)
    budget = prompt_tuning_params(args.pt_length, dims.hidden_size)
    seq = {"pt": args.pt_length + dims.max_length, "dept": args.dept_length + dims.max_length}
    print(f"d={dims.hidden_size}, s={dims.max_length}, DePT rank r={dept_cfg.rank}; "
          f"trainable prompt params: PT {counts['pt']:,}, DePT {counts['dept']:,} "
          f"(budget l*d = {budget:,}, DePT floor slack = {budget - counts['dept']:,}); "
          f"task head {heads['pt']:,} / {heads['dept']:,} (not counted)")
    assert counts["pt"] == budget and 0 <= budget - counts["dept"] < dims.max_length + dims.hidden_size

    # -- 1. training steps, interleaved step by step
    for _, model, _ in built.values():
        model.train()
    for i in range(args.warmup):
        for name in METHODS:
            cfg, model, opt = built[name]
            train_step(model, opt, batches[i % len(batches)], cfg.train.max_grad_norm)
    step_times = {name: [] for name in METHODS}
    for i in range(args.steps):
        order = METHODS if i % 2 == 0 else METHODS[::-1]
        batch = batches[(args.warmup + i) % len(batches)]
        for name in order:
            cfg, model, opt = built[name]
            start = time.perf_counter()
            train_step(model, opt, batch, cfg.train.max_grad_norm)
            step_times[name].append(time.perf_counter() - start)
    print(f"  training steps done ({time.perf_counter() - t0:.0f} s so far)")

    # -- 2. inference, interleaved batch by batch
    infer_times = {name: [] for name in METHODS}
    for _, model, _ in built.values():
        model.eval()
    with torch.no_grad():
        for name in METHODS:  # one warm-up forward each
            built[name][1](**batches[0][0])
        for i in range(args.infer_batches):
            order = METHODS if i % 2 == 0 else METHODS[::-1]
            inputs = batches[i % len(batches)][0]
            for name in order:
                start = time.perf_counter()
                built[name][1](**inputs)
                infer_times[name].append(time.perf_counter() - start)
    print(f"  inference done ({time.perf_counter() - t0:.0f} s so far)")
    del built

    # -- 3. memory, one fresh subprocess per method and repeat, alternating
    mem = {name: [] for name in METHODS}
    if args.memory_repeats:
        with tempfile.TemporaryDirectory() as tmp:
            batches_file = Path(tmp) / "batches.npz"
            np.savez(batches_file, **arrays)
            for rep in range(args.memory_repeats):
                for name in (METHODS if rep % 2 == 0 else METHODS[::-1]):
                    mem[name].append(run_memory_subprocess(name, args, batches_file, num_labels))
        print(f"  memory done ({time.perf_counter() - t0:.0f} s so far)")

    # -- table
    med = {name: statistics.median(step_times[name]) for name in METHODS}
    inf = {name: statistics.median(infer_times[name]) for name in METHODS}
    rows = [
        ("trainable prompt params", f"{counts['pt']:,}", f"{counts['dept']:,}",
         f"{counts['dept'] / counts['pt']:.4f}"),
        ("backbone sequence length", str(seq["pt"]), str(seq["dept"]), f"{seq['dept'] / seq['pt']:.3f}"),
        (f"train step, median of {args.steps} (s)", f"{med['pt']:.3f}", f"{med['dept']:.3f}",
         f"{med['dept'] / med['pt']:.3f}"),
        ("train step, median per-pair ratio", "", "", f"{median_ratio(step_times['dept'], step_times['pt']):.3f}"),
        ("train step, min (s)", f"{min(step_times['pt']):.3f}", f"{min(step_times['dept']):.3f}",
         f"{min(step_times['dept']) / min(step_times['pt']):.3f}"),
        (f"inference/batch, median of {args.infer_batches} (s)", f"{inf['pt']:.3f}", f"{inf['dept']:.3f}",
         f"{inf['dept'] / inf['pt']:.3f}"),
        ("inference/batch, median per-pair ratio", "", "",
         f"{median_ratio(infer_times['dept'], infer_times['pt']):.3f}"),
    ]
    if args.memory_repeats:
        def mib(name, f):
            return statistics.median(f(r) for r in mem[name]) / MiB

        memrows = [
            ("peak RSS, training (MiB)", lambda r: r["peak_train"]),
            ("added by training step (MiB)", lambda r: r["peak_train"] - r["rss_loaded"]),
            ("added by inference forward (MiB)", lambda r: r["peak_infer"] - r["rss_loaded"]),
            ("RSS after load (MiB)", lambda r: r["rss_loaded"]),
            ("peak RSS while loading (MiB)", lambda r: r["peak_loaded"]),
        ]
        for label, f in memrows:
            a, b = mib("pt", f), mib("dept", f)
            rows.append((label, f"{a:.0f}", f"{b:.0f}", f"{b / a:.3f}"))
    print()
    print_table(rows)
    print()
    print("raw train step times (s):")
    for name in METHODS:
        print(f"  {LABEL[name]:5s}", " ".join(f"{t:.3f}" for t in step_times[name]))
    print("raw inference times (s):")
    for name in METHODS:
        print(f"  {LABEL[name]:5s}", " ".join(f"{t:.3f}" for t in infer_times[name]))
    if args.memory_repeats:
        print("raw memory (MiB: rss_loaded / peak_loaded / peak_infer / peak_train):")
        for name in METHODS:
            for r in mem[name]:
                print(f"  {LABEL[name]:5s}", " / ".join(f"{r[k] / MiB:.0f}" for k in
                                                    ("rss_loaded", "peak_loaded", "peak_infer", "peak_train")))
    print(f"Part A took {time.perf_counter() - t0:.0f} s")


# ----------------------------------------------------------------------------- Part B


def ray_config(args: argparse.Namespace, runner: str, tmp: Path):
    from raypeft.config import validate_experiment

    return validate_experiment(
        {
            "name": f"bench_ray_{runner}",
            "model": {"name": args.ray_model, "max_length": args.ray_max_length},
            "task": {"name": "tweet_sentiment", "max_train_examples": args.ray_train_examples,
                     "max_eval_examples": args.ray_eval_examples},
            "method": {"name": "pt", "prompt_length": 20},
            "train": {"max_steps": args.ray_steps, "eval_every": args.ray_eval_every,
                      "batch_size": 16},
            "search": {"num_samples": args.ray_trials, "scheduler": {"type": "none"},
                       "max_concurrent": args.ray_max_concurrent},
            "space": {"method.lr": {"choice": [0.1, 0.3]}},
            "resources": {"trial_runner": runner},
            "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": f"bench_ray_{runner}"},
            "run": {"storage_path": str(tmp / "ray_results")},
        },
        "benchmark",
    )


def part_b(args: argparse.Namespace) -> None:
    import torch

    try:
        from raypeft.tune import run_experiment
    except ImportError as exc:
        print(f"== Part B skipped: raypeft.tune.run_experiment is not available ({exc})")
        return
    from raypeft.config import apply_trial_params
    from raypeft.data import prepare_task
    from raypeft.train import train

    torch.set_num_threads(args.threads)
    n = args.ray_trials
    runners = [r.strip() for r in args.ray_runners.split(",") if r.strip()]
    print(f"== Part B: {n} trials of {args.ray_model} s={args.ray_max_length} PT l=20, "
          f"max_steps={args.ray_steps}, eval_every={args.ray_eval_every}; runners {runners}")
    with tempfile.TemporaryDirectory(prefix="raypeft_bench_") as tmpdir:
        tmp = Path(tmpdir)
        # bare loop: tokenise once (the search does too), then N trials one after another
        base = ray_config(args, "in_process", tmp)
        start = time.perf_counter()
        task = prepare_task(base.task, base.model)
        prep = time.perf_counter() - start
        bare = []
        for i in range(n):
            cfg = apply_trial_params(base, {"method.lr": [0.1, 0.3][i % 2]})
            start = time.perf_counter()
            train(cfg, task, report=lambda m, c: None)
            bare.append(time.perf_counter() - start)
        bare_total = prep + sum(bare)
        print(f"  bare loop: tokenise {prep:.1f} s, trials " + " ".join(f"{t:.1f}" for t in bare)
              + f" s; total {bare_total:.1f} s")
        results = {}
        for runner in runners:
            cfg = ray_config(args, runner, tmp)
            start = time.perf_counter()
            summary = run_experiment(cfg, quiet=True)
            results[runner] = time.perf_counter() - start
            text = repr(summary)
            print(f"  ray {runner}: {results[runner]:.1f} s; summary: "
                  f"{text[:300] + ('...' if len(text) > 300 else '')}")
    print()
    header = ("runner", "N", "bare total (s)", "ray total (s)", "ratio ray/bare", "overhead/trial (s)")
    rows = [(r, str(n), f"{bare_total:.1f}", f"{t:.1f}", f"{t / bare_total:.2f}",
             f"{(t - bare_total) / n:+.1f}") for r, t in results.items()]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print(f"(median bare trial {statistics.median(bare):.1f} s; bare total = tokenise + sum of trials)")


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--skip-steps", action="store_true", help="skip Part A (PT vs DePT steps/memory)")
    p.add_argument("--skip-ray", action="store_true", help="skip Part B (Ray vs bare loop)")
    a = p.add_argument_group("Part A")
    a.add_argument("--model", default="minilm")
    a.add_argument("--max-length", type=int, default=256, help="s")
    a.add_argument("--pt-length", type=int, default=100, help="PT l (also DePT's budget)")
    a.add_argument("--dept-length", type=int, default=40, help="DePT m")
    a.add_argument("--batch-size", type=int, default=16)
    a.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    a.add_argument("--data", choices=["tweets", "random"], default="tweets")
    a.add_argument("--num-batches", type=int, default=4, help="distinct batches cycled through")
    a.add_argument("--warmup", type=int, default=2, help="untimed training steps per method")
    a.add_argument("--steps", type=int, default=10, help="timed training steps per method")
    a.add_argument("--infer-batches", type=int, default=10, help="timed no-grad forwards per method")
    a.add_argument("--memory-repeats", type=int, default=2,
                   help="fresh subprocesses per method for peak memory (0: skip memory)")
    a.add_argument("--memory-steps", type=int, default=2, help="training steps per memory subprocess")
    b = p.add_argument_group("Part B")
    b.add_argument("--ray-trials", type=int, default=4)
    b.add_argument("--ray-model", default="minilm")
    b.add_argument("--ray-max-length", type=int, default=64)
    b.add_argument("--ray-steps", type=int, default=40)
    b.add_argument("--ray-eval-every", type=int, default=20)
    b.add_argument("--ray-train-examples", type=int, default=640)
    b.add_argument("--ray-eval-examples", type=int, default=200)
    b.add_argument("--ray-max-concurrent", type=int, default=None, help="default: the tool's")
    b.add_argument("--ray-runners", default="in_process,ray_train",
                   help="comma-separated resources.trial_runner values")
    # hidden: the memory subprocess
    p.add_argument("--_memory-worker", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--_batches", help=argparse.SUPPRESS)
    p.add_argument("--_num-labels", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._memory_worker:
        memory_worker(args)
        return
    if not args.skip_steps:
        part_a(args)
    if not args.skip_ray:
        print()
        part_b(args)


if __name__ == "__main__":
    main()
