"""A task's local files checked cheaply, before anything loads (``raypeft validate``): each
exists, is readable and not empty, has a known format and a header with the task's columns;
and why a file that did not load failed, in one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from raypeft.config.schema import TaskConfig
from raypeft.data.tasks.specs import CUSTOM_TASKS, SPLIT_NAMES, TaskSpec, resolve_task_spec
from raypeft.errors import ConfigError

# a data file's ending -> the `datasets` builder that reads it
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_FORMAT_NAMES = {"json": "JSON lines", "csv": "CSV", "parquet": "Parquet"}


def data_format(path: Path, key: str) -> str:
    """The builder that reads ``path`` (:data:`FORMATS`), or the one-line refusal."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(f"{key}: {path}: unsupported format (use .jsonl, .csv or .parquet)")
    return fmt


def check_data_dir(folder: Path) -> None:
    """``task.data_dir`` is a folder (what it must hold is checked by its readers)."""
    if not folder.is_dir():
        raise ConfigError(
            f"task.data_dir: {folder}: no such folder; it must be a folder holding train.jsonl "
            "and validation.jsonl"
        )


def check_readable(path: Path, key: str) -> None:
    """The file exists, can be opened and is not empty (cheap: before anything loads)."""
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a folder; it must be a data file")
    if not path.is_file():
        raise ConfigError(f"{key}: {path}: file not found")
    try:
        with path.open("rb") as fh:
            first = fh.read(1)
    except OSError as exc:
        raise ConfigError(
            f"{key}: {path}: cannot read ({exc.strerror or exc.__class__.__name__}); the file "
            "must be readable"
        ) from None
    if not first:
        raise ConfigError(f"{key}: {path}: the file is empty; it must hold at least one example")


def check_columns(columns: list[str], split: str, spec: TaskSpec, where: str) -> None:
    """The columns the task names are among a split's ``columns`` (a test split may lack
    its labels); ``where`` is the split's source as errors name it."""
    for key, col in (
        ("task.text_column", spec.text_column),
        ("task.text_pair_column", spec.text_pair_column),
        ("task.label_column", None if split == "test" else spec.label_column),
    ):
        if col and col not in columns:
            key = key if spec.name in CUSTOM_TASKS else "task.name"
            raise ConfigError(
                f"{key}: column {col!r} not in the {split} split of {spec.name!r} "
                f"({where}; columns: {columns}); it must name a column of every split"
            )


def check_task_files(cfg: TaskConfig) -> None:
    """Cheap checks of a task's local files before anything heavy (``raypeft validate``):
    each exists, is readable and not empty, and its header has the columns the task names.
    The full checks (every row) run when the task is loaded."""
    if cfg.name == "files":
        files = {s: (Path(p), f"task.files.{s}") for s, p in (cfg.files or {}).items()}
    elif cfg.data_dir is not None:
        folder = Path(cfg.data_dir)
        check_data_dir(folder)
        files = {
            s: (folder / f"{s}.jsonl", "task.data_dir")
            for s in SPLIT_NAMES
            if s != "test" or (folder / "test.jsonl").is_file()
        }
    else:
        return
    spec = resolve_task_spec(cfg)
    for split, (path, key) in files.items():
        data_format(path, key)
        check_readable(path, key)
        header = _header(path, path.suffix.lower())
        if header is None:
            continue
        if isinstance(header, str):
            raise ConfigError(f"{key}: {path}: {header}")
        check_columns(header, split, spec, f"{path} ({key})")


def json_line_problem(number: int, line: str) -> str | None:
    """Why line ``number`` of a JSON lines file is not one JSON object (None: it is one)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        return f"line {number} is not valid JSON ({err.msg}); each line must be one JSON object"
    if not isinstance(row, dict):
        return f"line {number} is not a JSON object; each line must be one JSON object"
    return None


def _header(path: Path, suffix: str) -> list[str] | str | None:
    """The column names a file starts with (None: cannot tell cheaply; a string: why the
    file is malformed)."""
    try:
        if suffix == ".parquet":
            # why: pyarrow only for parquet task files
            import pyarrow.parquet as pq

            return list(pq.read_schema(path).names)
        with path.open(encoding="utf-8-sig", newline="") as fh:
            if suffix == ".csv":
                return next(csv.reader(fh), None)
            if suffix == ".jsonl":
                for number, line in enumerate(fh, 1):
                    if line.strip():
                        return json_line_problem(number, line) or list(json.loads(line))
                return "holds no examples; every split must hold at least one"
    except UnicodeDecodeError:
        return "not UTF-8 text; the file must be UTF-8"
    except Exception as exc:  # a broken parquet footer, an unreadable file
        return f"cannot read ({' '.join(str(exc).split())[:200] or exc.__class__.__name__})"
    return None


def why_unreadable(path: Path, fmt: str, exc: BaseException) -> str:
    """One line on why a data file did not load: the first bad JSON line, else the
    innermost error of the chain."""
    if fmt == "json":
        try:
            with path.open(encoding="utf-8") as fh:
                for number, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    if number == 1 and line.lstrip().startswith("["):
                        break  # a JSON array file, not JSON lines
                    if problem := json_line_problem(number, line):
                        return problem
        except UnicodeDecodeError:
            return "not UTF-8 text; the file must be UTF-8"
        except OSError:
            pass
    inner = exc
    while inner.__cause__ is not None or inner.__context__ is not None:
        inner = inner.__cause__ or inner.__context__
    text = " ".join(str(inner).split()) or inner.__class__.__name__
    if "corresponds to no data" in text or isinstance(inner, StopIteration):
        return "holds no examples; every split must hold at least one"
    return f"cannot read as {_FORMAT_NAMES[fmt]} ({text[:200]})"
