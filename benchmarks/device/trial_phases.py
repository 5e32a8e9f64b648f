"""Where a trial's seconds go (issue 56, item 1): each trial's wall time split into phases
read from the trial itself, the first trial on an actor against the later ones.

Two searches run through ``raypeft tune``'s own code (:func:`raypeft.search.run.run_experiment`:
in-process trial runner, reused actors, one trial at a time so that every trial after the
first reuses the first's actor):

- ``tiny``: the tests' tiny random BERT on the packaged tweets, where a step is nearly free;
- ``dept``: ``search_spaces/dept.yaml``'s model (MiniLM) and method (DePT) and space, cut to
  ``--trials`` trials of ``--steps`` steps, no scheduler (every trial runs to its end) and no
  repeats of the best.

What each phase is, and who measures it (:mod:`raypeft.training.phases`):

- the trial's process (every result carries ``phase_s/<name>``, cumulative; the last one is
  read): ``process_start`` (the first trial of a process only: from the process's creation
  to the trial's function; Ray's worker start and imports, a worker Ray started ahead also
  its wait), ``trial_setup`` (config, the task from Ray's object store, the device),
  ``data`` (features, splits, loader, the batches between steps), ``model_build`` (the
  backbone built or taken from the process's cache, moved to the device), ``train_setup``
  (optimizer, schedule, resume), ``steps``, ``evaluation``, ``checkpoint_write`` and
  ``report`` (``tune.report``: the checkpoint copied to the run's storage, the hand-over to
  Tune; the last report's is not in the last result);
- the driver, per trial (:attr:`SearchSummary.trial_driver_phases`): the MLflow callbacks'
  seconds at the trial's start, results and end, the records callback's (dataset inputs,
  system metrics, models), Optuna's ask, reports and tell; and from their clocks, the
  trial's wall time (the MLflow callback's start to the end of its on_trial_complete), the
  time from the trial's start to its function's entry, and the gap to the next trial's start.

The test split is scored once per search, by the driver (``test split``, under the table).

    python -m benchmarks.device.trial_phases              # tiny and dept, 4 trials each (minutes)
    python -m benchmarks.device.trial_phases --smoke      # tiny, 2 short trials: the structure

Runs on a CPU here and on a GPU machine unchanged where Ray, MLflow and Optuna are installed
(``resources.use_gpu: auto``). A shared machine makes the times indicative.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from benchmarks.common.machine import cpu_name, load_note
from benchmarks.common.paths import SHIPPED_SEARCH
from benchmarks.common.searches import experiment_in, phases_line, quiet_and_local, timed_search
from benchmarks.common.tables import print_table, right_aligned_after
from benchmarks.common.tiny_search import TINY_SEARCH

# the trial's own phases, in the order a trial passes through them
TRIAL_PHASES = (
    "process_start",
    "trial_setup",
    "data",
    "model_build",
    "train_setup",
    "steps",
    "evaluation",
    "checkpoint_write",
    "report",
)
# the driver's, per trial (raypeft.training.phases.timed_phase's names)
DRIVER_PHASES = (
    "optuna_ask",
    "mlflow_start",
    "mlflow_inputs",
    "mlflow_result",
    "mlflow_system",
    "optuna_report",
    "mlflow_end",
    "mlflow_model",
    "optuna_tell",
)
# from the driver's and the trial's clocks
START_TO_ENTRY = "trial start -> function entered"
WALL = "trial wall (start -> complete)"
GAP = "gap to the next trial's start"
WORK = "steps + evaluation"
FIXED = "fixed cost beyond steps and evaluations"
UNSEEN = "in the wall, in no trial phase"
SUMMARY_ROWS = (START_TO_ENTRY, WALL, GAP, WORK, FIXED, UNSEEN)

SIZES = {  # trials, steps, eval_every
    "smoke": {"tiny": (2, 4, 2)},
    "default": {"tiny": (4, 12, 4), "dept": (4, 20, 10)},
}

TINY = {  # the tiny search, its space searched (steps and evaluations set per size below)
    **TINY_SEARCH,
    "space": {"method.lr_prompt": {"choice": [0.1, 0.2, 0.3, 0.4]}},
    "search": {"sampler": "random"},
}


@dataclass
class Trial:
    """One trial's phases (seconds) and which trial of its process it was."""

    trial_id: str
    in_process: int
    seconds: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- searching


def experiment_file(case: str, folder: Path) -> Path:
    """The experiment a case starts from: the shipped dept.yaml, or the tiny one written."""
    if case == "dept":
        return SHIPPED_SEARCH
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", **TINY}))
    return path


def overrides(trials: int, steps: int, eval_every: int) -> list[str]:
    """Short trials, one at a time (each after the first on the first's actor), each to its
    end, no repeats: what differs from the experiment file (as ``raypeft tune --set``)."""
    return [
        f"search.num_samples={trials}",
        f"train.max_steps={steps}",
        f"train.eval_every={eval_every}",
        "search.max_concurrent=1",
        "search.scheduler.type=none",
        "search.repeat_best=null",
        "resources.trial_runner=in_process",
    ]


def run_case(case: str, size: tuple[int, int, int], folder: Path):
    """Run the case's search in ``folder``; its summary and wall seconds."""
    cfg = experiment_in(experiment_file(case, folder), f"phases-{case}", overrides(*size), folder)
    return timed_search(cfg, folder)


# ----------------------------------------------------------------------------- reading


def last_results(experiment_path: str) -> dict[str, dict]:
    """Each trial's last result, from the Tune experiment's folder (Tune's public reader)."""
    from ray.tune import ExperimentAnalysis

    return ExperimentAnalysis(experiment_path).results


def trials_of(summary) -> list[Trial]:
    """The search's trials in the order they started, each with its own phases, the
    driver's and those measured between the two clocks (:data:`SUMMARY_ROWS`)."""
    from raypeft.training.phases import phases_of
    from raypeft.training.result_keys import ENTERED_KEY, TRIAL_IN_PROCESS_KEY

    results, driver = last_results(summary.storage_path), summary.trial_driver_phases
    started = sorted(
        (t for t in results if t in driver), key=lambda t: driver[t].marks["mlflow_start"]
    )
    trials = []
    for i, trial_id in enumerate(started):
        result, timer = results[trial_id], driver[trial_id]
        own = {name: 0.0 for name in TRIAL_PHASES} | phases_of(result)
        theirs = {name: timer.seconds.get(name, 0.0) for name in DRIVER_PHASES}
        begin = timer.marks["mlflow_start"]
        end = timer.marks["mlflow_end"] + timer.seconds["mlflow_end"]
        after = driver[started[i + 1]].marks["mlflow_start"] if i + 1 < len(started) else None
        entry = result[ENTERED_KEY] - begin
        work = own["steps"] + own["evaluation"]
        between = {
            START_TO_ENTRY: entry,
            WALL: end - begin,
            GAP: None if after is None else after - end,
            WORK: work,
            FIXED: end - begin - work,
            UNSEEN: end - begin - entry - sum(own.values()) + own["process_start"],
        }
        trials.append(Trial(trial_id, int(result[TRIAL_IN_PROCESS_KEY]), own | theirs | between))
    return trials


# ----------------------------------------------------------------------------- the table


def cell(values: list[float | None]) -> str:
    """The mean of the values measured, in seconds; ``-`` where none was."""
    values = [v for v in values if v is not None]
    return f"{statistics.mean(values):.3f}" if values else "-"


def table_rows(trials: list[Trial]) -> list[tuple[str, str, str, str]]:
    """Per phase: who measures it, the first trial of a process, the later trials' mean."""
    first = [t for t in trials if t.in_process == 1]
    later = [t for t in trials if t.in_process > 1]
    sides = [("trial", TRIAL_PHASES), ("driver", DRIVER_PHASES), ("both", SUMMARY_ROWS)]
    return [
        (name, side, cell([t.seconds[name] for t in first]), cell([t.seconds[name] for t in later]))
        for side, names in sides
        for name in names
    ]


def print_case(case: str, size: tuple[int, int, int], summary, wall: float) -> None:
    """The case's table, then what the search did once (test split, its phases)."""
    trials = trials_of(summary)
    later = sum(1 for t in trials if t.in_process > 1)
    n, steps, every = size
    print(
        f"\n== {case}: {n} trials of {steps} steps (evaluating every {every}), one at a time; "
        f"{len(trials)} trials read, {later} on a reused actor{load_note()}",
        flush=True,
    )
    header = ("phase (s)", "measured by", "first trial", f"later trials (mean of {later})")
    print_table(header, table_rows(trials), right_aligned_after(2, 4))
    print(
        "the first trial's process_start is not in its wall: Tune starts a trial (and the "
        "driver's clock) once its actor is up",
        flush=True,
    )
    print(
        f"once per search: test split {summary.test_split_s:.3f} s (driver, in finish); "
        f"search {wall:.1f} s: {phases_line(summary)}",
        flush=True,
    )


def machine_line() -> str:
    """What the trials trained on: the GPU Ray would give them, else this CPU."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return f"Machine: {props.name}, torch {torch.__version__}, CPU {cpu_name()}"
    return f"Machine: CPU {cpu_name()}, torch {torch.__version__}"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny, 2 short trials")
    parser.add_argument("--cases", default=None, help="tiny,dept (default: the size's)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    quiet_and_local()
    sizes = SIZES["smoke" if args.smoke else "default"]
    cases = args.cases.split(",") if args.cases else list(sizes)
    given = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"Command: python -m benchmarks.device.trial_phases {given}".rstrip(), flush=True)
    print(machine_line(), flush=True)
    for case in cases:
        with tempfile.TemporaryDirectory(prefix=f"phases-{case}-") as tmp:
            summary, wall = run_case(case, sizes[case], Path(tmp))
            print_case(case, sizes[case], summary, wall)


if __name__ == "__main__":
    main()
