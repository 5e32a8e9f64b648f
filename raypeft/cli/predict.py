"""``raypeft predict`` (classify new texts with a trained trial) and ``raypeft export``
(write a trained trial as a Hugging Face peft adapter).

Both read the trained artefacts from MLflow only: a trial run's ``model/`` or, for a search's
parent run, ``best_model/``; ``--experiment`` takes the best trial of the experiment's newest
finished search. Heavy imports (torch, transformers, mlflow, peft) stay inside the functions.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from itertools import chain, islice
from pathlib import Path

import click

from raypeft.cli.options import TRACKING_URI

RUN_OPTIONS = [
    click.option("--run", "run_id", default=None, help="MLflow run id of a trial (or of a search)"),
    click.option(
        "--experiment",
        default=None,
        help="experiment name: the best trial of its newest finished search",
    ),
    click.option(  # issue 16
        "--model",
        "model_uri",
        default=None,
        help="a registered or logged model: models:/NAME@champion, models:/NAME/VERSION "
        "or models:/<logged model id>",
    ),
    TRACKING_URI,
]


def _run_options(func):
    for option in reversed(RUN_OPTIONS):
        func = option(func)
    return func


class InputError(Exception):
    """A line of the input cannot be read (one-line message naming the line)."""


def _one_source(run_id: str | None, experiment: str | None, model_uri: str | None = None) -> None:
    from raypeft.cli.main import _fail

    if [run_id, experiment, model_uri].count(None) != 2:
        _fail("give exactly one of --run RUN_ID, --experiment NAME or --model models:/NAME@ALIAS")


def download_trained(
    run_id: str | None,
    experiment: str | None,
    tracking_uri: str | None,
    dst: Path,
    model_uri: str | None = None,
) -> tuple[Path, str]:
    """The trained model folder of a run (or an experiment's best trial, or a registered
    model) and the run's id."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # keep stderr clean
    from mlflow.tracking import MlflowClient

    from raypeft.tracking import runs

    uri = runs.tracking_uri(tracking_uri)
    runs.check_store(uri)
    if model_uri is not None:  # issue 16: models:/NAME@alias (the registry)
        from raypeft.tracking.registry import download_registered

        return download_registered(uri, model_uri, dst)
    client = MlflowClient(tracking_uri=uri)
    run = runs.get_run(client, run_id) if run_id else runs.best_trial_run(client, experiment)
    return runs.download_model(client, run, dst), run.info.run_id


def read_records(
    lines: Iterable[str], *, pair: bool, jsonl: bool, source: str
) -> Iterator[tuple[str, str | None]]:
    """``(text, pair)`` per non-blank input line: ``text`` or ``text<TAB>pair`` lines, or
    JSON objects with ``text`` (and ``text_pair``) fields. Lazy: lines are read as needed."""
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        where = f"{source}:{number}"
        if jsonl:
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
            yield record["text"], second if pair else None
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


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _one_line(text: str) -> str:
    """One output line per input, whatever a (JSON) text holds."""
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def format_prediction(p, output_format: str, pair: bool) -> str:
    if output_format == "jsonl":
        record = {"text": p.text}
        if pair:
            record["text_pair"] = p.text_pair
        record.update(label=p.label, score=p.score)
        return json.dumps(record, ensure_ascii=False)
    score = "-" if p.score is None else f"{p.score:.4f}"
    text = p.text if not pair else f"{p.text}\t{p.text_pair}"
    return f"{p.label}\t{score}\t{_one_line(text)}"


@click.command("predict")
@_run_options
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
    help="text: label<TAB>probability<TAB>text; jsonl: {text, label, score}",
)
def predict_command(
    run_id: str | None,
    experiment: str | None,
    model_uri: str | None,
    tracking_uri: str | None,
    input_path: str,
    batch_size: int,
    output_format: str,
) -> None:
    """Classify texts with a trained trial (from MLflow); one output line per input line.

    The score is the predicted class's probability (the value, for regression; "-" for
    seq2seq models, which write the label; <unmatched> when it names no class).
    """
    from raypeft.cli.main import _fail, _quiet_libraries
    from raypeft.errors import ConfigError

    _quiet_libraries()
    _one_source(run_id, experiment, model_uri)
    from_stdin = input_path == "-"
    if not from_stdin and not Path(input_path).is_file():
        _fail(f"--input {input_path}: file not found")

    import torch

    from raypeft.serving.predict import Predictor, read_task_metadata

    with tempfile.TemporaryDirectory(prefix="raypeft-predict-") as tmp:
        try:
            folder, _ = download_trained(run_id, experiment, tracking_uri, Path(tmp), model_uri)
            pair = bool(read_task_metadata(folder).get("text_pair"))
        except ConfigError as exc:
            _fail(str(exc))
        source = "stdin" if from_stdin else input_path
        stream = (
            click.get_text_stream("stdin")
            if from_stdin
            else open(input_path, encoding="utf-8")  # closed below
        )
        try:
            records = read_records(
                stream,
                pair=pair,
                jsonl=not from_stdin and input_path.lower().endswith(".jsonl"),
                source=source,
            )
            try:  # read the first batch before loading the model: fail fast on bad input
                first = list(islice(records, batch_size))
            except InputError as exc:
                _fail(str(exc))
            except UnicodeDecodeError as exc:
                _fail(f"{source}: not UTF-8 text ({exc.reason})")
            if not first:
                _fail(f"{source}: no input texts (the input is empty or blank)")
            device = "cuda" if torch.cuda.is_available() else "cpu"
            try:
                predictor = Predictor.from_folder(folder, device=device)
            except (ConfigError, ValueError, OSError) as exc:
                _fail(f"cannot load the trained model: {_first_line(exc)}")
            count, start = 0, time.perf_counter()
            try:
                batches = predictor.predict_batches(chain(first, records), batch_size=batch_size)
                for batch in batches:
                    lines = [format_prediction(p, output_format, pair) for p in batch]
                    click.echo("\n".join(lines))
                    count += len(batch)
            except InputError as exc:
                _fail(str(exc))
            except UnicodeDecodeError as exc:
                _fail(f"{source}: not UTF-8 text ({exc.reason})")
            except BrokenPipeError:  # e.g. piped into `head`: stop quietly
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(0)
            elapsed = time.perf_counter() - start
        finally:
            if not from_stdin:
                stream.close()
    rate = count / elapsed if elapsed > 0 else float("inf")
    click.echo(
        f"{count} texts in {elapsed:.2f} s ({rate:.1f} texts/s; "
        f"model load {predictor.load_s:.2f} s)",
        err=True,
    )


@click.command("export")
@_run_options
@click.option(
    "--format",
    "export_format",
    type=click.Choice(["peft"]),
    required=True,
    help="peft: a Hugging Face peft adapter (PROMPT_TUNING for pt, PREFIX_TUNING for "
    "prefix with style: kv)",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="folder to write (must be absent or empty unless --force)",
)
@click.option("--force", is_flag=True, help="replace a non-empty --out folder")
def export_command(
    run_id: str | None,
    experiment: str | None,
    model_uri: str | None,
    tracking_uri: str | None,
    export_format: str,
    out: Path,
    force: bool,
) -> None:
    """Export a trained trial as a peft adapter, then check that peft loads it and
    reproduces the trained model (prompt, head and logits)."""
    from raypeft.cli.main import _fail, _quiet_libraries
    from raypeft.errors import ConfigError

    _quiet_libraries()
    _one_source(run_id, experiment, model_uri)
    from raypeft.serving.export import (
        ExportVerificationError,
        check_out_dir,
        export_peft,
        require_peft,
    )

    try:
        require_peft()
        check_out_dir(out, force)
    except ConfigError as exc:
        _fail(str(exc))
    with tempfile.TemporaryDirectory(prefix="raypeft-export-") as tmp:
        try:
            folder, used_run = download_trained(
                run_id, experiment, tracking_uri, Path(tmp), model_uri
            )
            result = export_peft(folder, out, force=force)
        except ConfigError as exc:
            _fail(str(exc))
        except (ValueError, OSError) as exc:  # e.g. a base model that cannot be loaded
            _fail(f"cannot export the trained model: {_first_line(exc)}")
        except ExportVerificationError as exc:
            click.echo(f"error: peft does not reproduce the trained model: {exc}", err=True)
            click.echo("nothing was written", err=True)
            sys.exit(1)
    click.echo(
        f"Exported run {used_run} as a peft {result.peft_type} adapter "
        f"(task_type {result.task_type}) to {result.out}:"
    )
    width = max(len(name) for name in result.files)
    for name, what in result.files.items():
        click.echo(f"  {name:<{width}}  {what}")
    click.echo("Verified:")
    for line in result.checks:
        click.echo(f"  {line}")
