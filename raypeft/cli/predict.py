"""``raypeft predict``: classify new texts with a trained trial, one output line per input.

The trained artefacts come from MLflow only: a trial run's ``model/`` or, for a search's
parent run, ``best_model/``; ``--experiment`` takes the best trial of the experiment's newest
finished search. Heavy imports (torch, transformers, mlflow) stay inside the functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from pathlib import Path
from typing import TextIO

import click

from raypeft.cli.options import (
    download_trained,
    fail,
    first_line,
    one_source,
    quiet_libraries,
    run_options,
    which_model,
)
from raypeft.config.schema import PRECISIONS
from raypeft.errors import ConfigError

Record = tuple[str, str | None]  # (text, pair)


class InputError(Exception):
    """A line of the input cannot be read (one-line message naming the line)."""


def read_records(lines: Iterable[str], *, pair: bool, jsonl: bool, source: str) -> Iterator[Record]:
    """``(text, pair)`` per non-blank input line: ``text`` or ``text<TAB>pair`` lines, or
    JSON objects with ``text`` (and ``text_pair``) fields. Lazy: lines are read as needed."""
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        where = f"{source}:{number}"
        if jsonl:
            yield _json_record(line, pair=pair, where=where)
        elif pair:
            parts = line.split("\t")
            if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
                raise InputError(
                    f"{where}: the model reads text pairs: expected text<TAB>pair "
                    f"(one tab, both sides non-empty), got {len(parts) - 1} tab(s)"
                )
            yield parts[0], parts[1]
        else:
            yield line, None


def _json_record(line: str, *, pair: bool, where: str) -> Record:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise InputError(f'{where}: expected a JSON object with a string "text" field')
    second = record.get("text_pair")
    if pair and not isinstance(second, str):
        raise InputError(
            f'{where}: the model reads text pairs: a string "text_pair" field is needed'
        )
    if not pair and second is not None:
        raise InputError(f'{where}: the model reads single texts, not "text_pair"')
    return record["text"], second if pair else None


def _one_line(text: str) -> str:
    """One output line per input, whatever a (JSON) text holds."""
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def format_prediction(p, predictor, output_format: str, pair: bool) -> str:
    """One prediction as an output line (``text``: tab-separated; ``jsonl``: the input and
    the served model's row for it, :func:`raypeft.serving.predict.prediction_row`)."""
    if output_format == "jsonl":
        from raypeft.serving.predict import prediction_row  # why: torch loads with it

        record = {"text": p.text}
        if pair:
            record["text_pair"] = p.text_pair
        record.update(prediction_row(p, predictor))
        return json.dumps(record, ensure_ascii=False)
    score = "-" if p.score is None else f"{p.score:.4f}"
    text = p.text if not pair else f"{p.text}\t{p.text_pair}"
    return f"{p.label}\t{score}\t{_one_line(text)}"


@click.command("predict")
@run_options
@click.option(
    "--input",
    "input_path",
    default="-",
    show_default=True,
    help="one text per line (text<TAB>pair for pair tasks), a .jsonl file with text "
    "(and text_pair) fields, or - for stdin",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--output-format",
    type=click.Choice(["text", "jsonl"]),
    default="text",
    show_default=True,
    help="text: label<TAB>probability<TAB>text; jsonl: {text, label, label_id, score, "
    "probabilities}, the served model's row with the input",
)
@click.option(
    "--precision",
    type=click.Choice(["trained", *PRECISIONS]),
    default="trained",
    show_default=True,
    help="what the frozen backbone computes in: trained (its train.precision, where this "
    "machine runs it), or a precision; fp32 gives exactly the numbers of the exported peft "
    "adapter, which peft runs in fp32",
)
def command(
    run_id: str | None,
    experiment: str | None,
    model_uri: str | None,
    tracking_uri: str | None,
    input_path: str,
    batch_size: int,
    output_format: str,
    precision: str,
) -> None:
    """Classify texts with a trained trial (from MLflow); one output line per input line.

    The score is the predicted class's probability (the value, for regression; "-" for
    seq2seq models, which write the label; <unmatched> when it names no class).
    """
    quiet_libraries()
    one_source(run_id, experiment, model_uri)
    from_stdin = input_path == "-"
    if not from_stdin:
        check_readable(Path(input_path))
    source = "stdin" if from_stdin else input_path
    jsonl = not from_stdin and input_path.lower().endswith(".jsonl")
    with tempfile.TemporaryDirectory(prefix="raypeft-predict-") as tmp:
        folder, pair, trained_run = _trained(run_id, experiment, model_uri, tracking_uri, Path(tmp))
        with _open_input(input_path) as stream:
            records = read_records(stream, pair=pair, jsonl=jsonl, source=source)
            first = _first_batch(records, batch_size, source)  # bad input fails before the model
            predictor = _load_predictor(folder, precision)
            start = time.perf_counter()
            batches = predictor.predict_batches(chain(first, records), batch_size=batch_size)
            count = _write(batches, predictor, output_format, pair, source)
            elapsed = time.perf_counter() - start
    rate = count / elapsed if elapsed > 0 else float("inf")
    click.echo(f"model: {which_model(run_id, experiment, model_uri)}: run {trained_run}", err=True)
    click.echo(
        f"{count} texts in {elapsed:.2f} s ({rate:.1f} texts/s; "
        f"model load {predictor.load_s:.2f} s)",
        err=True,
    )


def check_readable(path: Path) -> None:
    """``--input`` must be something to read lines from: a file, or a device or pipe
    (``/dev/null``, ``<(...)``); a missing path and a folder are refused in one line."""
    if not path.exists():
        fail(f"--input {path}: file not found")
    if path.is_dir():
        fail(f"--input {path}: is a folder, not a file of texts")
    if not os.access(path, os.R_OK):
        fail(f"--input {path}: cannot be read (permission denied)")


def _trained(
    run_id: str | None,
    experiment: str | None,
    model_uri: str | None,
    tracking_uri: str | None,
    dst: Path,
) -> tuple[Path, bool, str]:
    """The trained model's folder, whether it reads text pairs, and its run's id."""
    from raypeft.serving.predict import read_task_metadata  # why: torch, transformers

    try:
        folder, trained_run = download_trained(run_id, experiment, tracking_uri, dst, model_uri)
        return folder, bool(read_task_metadata(folder).get("text_pair")), trained_run
    except ConfigError as exc:
        fail(str(exc))


@contextlib.contextmanager
def _open_input(input_path: str) -> Iterator[TextIO]:
    """stdin for ``-`` (left open), else the file (closed afterwards)."""
    if input_path == "-":
        yield click.get_text_stream("stdin")
        return
    with open(input_path, encoding="utf-8") as stream:
        yield stream


def _first_batch(records: Iterator[Record], batch_size: int, source: str) -> list[Record]:
    """The first ``batch_size`` records, read before the model loads (fail fast on bad input)."""
    try:
        first = list(islice(records, batch_size))
    except InputError as exc:
        fail(str(exc))
    except UnicodeDecodeError as exc:
        fail(f"{source}: not UTF-8 text ({exc.reason})")
    if not first:
        fail(f"{source}: no input texts (the input is empty or blank)")
    return first


def _load_predictor(folder: Path, precision: str):
    """The trained model on this machine's device, computing in ``precision`` (``trained``:
    what it trained in, where this device runs it; else exactly that, or one line why not)."""
    import torch  # why: torch and transformers are slow to import

    from raypeft.modeling.precision import resolve_precision
    from raypeft.serving.predict import Predictor

    device = "cuda" if torch.cuda.is_available() else "cpu"
    chosen = None
    if precision != "trained":
        try:
            chosen = resolve_precision(precision, device)
        except ConfigError as exc:
            fail(f"--precision {precision}: {str(exc).removeprefix('train.precision: ')}")
    try:
        return Predictor.from_folder(folder, device=device, precision=chosen)
    except (ConfigError, ValueError, OSError) as exc:
        fail(f"cannot load the trained model: {first_line(exc)}")


def _write(batches, predictor, output_format: str, pair: bool, source: str) -> int:
    """Print each batch's predictions as they come; returns how many were printed."""
    count = 0
    try:
        for batch in batches:
            click.echo(
                "\n".join(format_prediction(p, predictor, output_format, pair) for p in batch)
            )
            count += len(batch)
    except InputError as exc:
        fail(str(exc))
    except UnicodeDecodeError as exc:
        fail(f"{source}: not UTF-8 text ({exc.reason})")
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    return count
