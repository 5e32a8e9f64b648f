"""Building bad-input cases and checking what the CLI answers (shared by the theme modules).

A :class:`Case` is an experiment (a dict written as YAML, a raw string, or a builder that
writes data files into the working directory and returns either), the command-line arguments
and the parts its one error line must contain. :func:`check_result` holds the rules every case
obeys: exit code 2, exactly one ``error: ...`` line naming the key or file and what must hold,
and nothing created in the working directory.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RAYPEFT = Path(sys.executable).parent / "raypeft"
CPUS = os.cpu_count() or 1

# A valid experiment: tiny model, tiny search. Each case breaks one thing.
BASE: dict[str, Any] = {
    "name": "bad-input",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "train": {"max_steps": 20, "eval_every": 10, "batch_size": 4},
    "search": {"num_samples": 2},
    "run": {"storage_path": "ray_results"},  # in the working directory, where it is watched
}


def exp(**sections: Any) -> dict[str, Any]:
    """BASE with sections replaced (``method={...}``) or one key set (``train__eval_every=3``)."""
    data = copy.deepcopy(BASE)
    for key, value in sections.items():
        if "__" in key:
            section, leaf = key.split("__", 1)
            data.setdefault(section, {})[leaf] = value
        else:
            data[key] = value
    return data


# ----------------------------------------------------------------------------- data files


def rows(n: int, labels: list, text: str = "text", prefix: str = "t") -> list[dict]:
    return [
        {text: f"{prefix} example {i} is here", "label": labels[i % len(labels)]} for i in range(n)
    ]


def write_jsonl(path: Path, data: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in data))


def files_task(
    tmp: Path,
    train: list[dict] | None = None,
    validation: list[dict] | None = None,
    **task: Any,
) -> dict[str, Any]:
    """A ``files`` task (train.jsonl, val.jsonl in the working directory); pass a list to
    write it, or leave the default valid rows."""
    write_jsonl(tmp / "train.jsonl", rows(8, ["pos", "neg"]) if train is None else train)
    write_jsonl(
        tmp / "val.jsonl", rows(4, ["neg", "pos"], prefix="v") if validation is None else validation
    )
    return {
        "name": "files",
        "files": {"train": "train.jsonl", "validation": "val.jsonl"},
        "text_column": "text",
        "label_column": "label",
        **task,
    }


# ----------------------------------------------------------------------------- cases


Builder = Callable[[Path], "dict | str | None"]


@dataclass
class Case:
    id: str
    experiment: dict | str | Builder | None  # None: no file is written
    expect: tuple[str, ...]  # substrings of the error line: the key or file, and the rule
    args: tuple[str, ...] = ()
    tune_only: bool = False  # a command line only `tune` takes
    in_process: bool = False  # also run as a real `raypeft tune` process
    needs_no_gpu: bool = False
    needs_non_root: bool = False
    file: str = "exp.yaml"


def ids(cases: list[Case]) -> list[str]:
    return [c.id for c in cases]


def build(case: Case, tmp: Path) -> Path:
    """Write the case's files into ``tmp`` (the working directory); return the experiment
    file's path (relative, as a user types it)."""
    experiment = case.experiment
    if callable(experiment):
        experiment = experiment(tmp)
    if isinstance(experiment, dict):
        (tmp / case.file).write_text(yaml.safe_dump(experiment, sort_keys=False))
    elif isinstance(experiment, str):
        (tmp / case.file).write_text(experiment)
    return Path(case.file)


def listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


class Reached(AssertionError):
    """A guarded function was called: the bad input got too far."""


def check_result(result, case: Case, before: set[str], tmp: Path, hits: list[str]) -> str:
    """A CliRunner result obeys the rules; returns its error line."""
    assert not hits, f"{case.id}: reached {hits}"
    assert isinstance(result.exception, SystemExit), (
        f"{case.id}: {result.exception!r}\n{result.output}"
    )
    assert result.exit_code == 2, f"{case.id}: exit {result.exit_code}\n{result.output}"
    errors = result.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), (
        f"{case.id}: stderr is not one error line:\n{result.stderr}"
    )
    line = errors[0]
    # stdout may hold tune's progress (its resources line, "Preparing task ..."), nothing else
    progress = ("Preparing task", "resources: use_gpu auto")
    others = [x for x in result.stdout.splitlines() if x.strip() and not x.startswith(progress)]
    assert not others, f"{case.id}: unexpected output {others}"
    assert "Traceback" not in result.output
    for part in case.expect:
        assert part in line, f"{case.id}: {part!r} not in {line!r}"
    assert listing(tmp) == before, f"{case.id}: created {listing(tmp) - before}"
    return line


def run_in_process(case: Case, tmp_path: Path) -> None:
    """The case through a real ``raypeft tune`` process, with ``RAY_TMPDIR`` pointing at a
    folder that must never appear (no Ray session)."""
    work = tmp_path / "work"
    work.mkdir()
    ray_tmp = tmp_path / "raytmp"
    old = Path.cwd()
    os.chdir(work)  # builders write relative to the working directory
    try:
        space = build(case, work)
    finally:
        os.chdir(old)
    before = listing(work)
    env = dict(
        os.environ,
        RAY_TMPDIR=str(ray_tmp),
        RAY_USAGE_STATS_ENABLED="0",
        MLFLOW_DISABLE_TELEMETRY="true",
        HF_HUB_OFFLINE="1",
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [str(RAYPEFT), "tune", "--space", str(space), *case.args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = proc.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr[-3000:]
    for part in case.expect:
        assert part in errors[0]
    assert not ray_tmp.exists(), "a Ray session was started"
    assert listing(work) == before
