"""What several commands share: options, the one-line failure, quiet libraries, loading and
checking an experiment file (tune, validate) and fetching a trained run (predict, export).

Heavy imports (the preflight pipeline, MLflow) stay inside the functions so ``raypeft --help``
stays fast.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from raypeft.config.loading import load_experiment
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError

if TYPE_CHECKING:
    from raypeft.preflight import Checked

EXIT_USER_ERROR = 2

# Every command that reads or writes a tracking store takes the same option.
TRACKING_URI = click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
)

# Every command that reads an experiment file takes the same overrides.
OVERRIDES = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a key of the file, e.g. --set search.num_samples=4 (repeatable)",
)

# The commands that read a trained run back (predict, export) name it the same way.
RUN_OPTIONS = [
    click.option("--run", "run_id", default=None, help="MLflow run id of a trial (or of a search)"),
    click.option(
        "--experiment",
        default=None,
        help="experiment name: the best trial of its newest finished search",
    ),
    click.option(
        "--model",
        "model_uri",
        default=None,
        help="a registered or logged model: models:/NAME@champion, models:/NAME/VERSION "
        "or models:/<logged model id>",
    ),
    TRACKING_URI,
]


def run_options(func):
    """Decorator: ``--run``, ``--experiment``, ``--model`` and ``--tracking-uri``."""
    for option in reversed(RUN_OPTIONS):
        func = option(func)
    return func


def error_line(message: str) -> str:
    """``error: message`` on one printable line: a control character in what the user typed
    (a key with a carriage return or a newline in it) is shown escaped, never printed."""
    shown = (c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)
    return "error: " + "".join(shown)


def fail(message: str, exit_code: int = EXIT_USER_ERROR) -> NoReturn:
    """A user error: one ``error:`` line on stderr, exit code 2."""
    click.echo(error_line(message), err=True)
    sys.exit(exit_code)


def quiet_libraries() -> None:
    """Silence what would drown the command's own output."""
    # Progress bars from datasets/transformers would drown the trial table.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # with a tracking server MLflow prints two "View run" links per run closed (--quiet too)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # MLflow's "Downloading artifacts" bars (the summary and predict read models back)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("psycopg").addFilter(_recovered_pipeline)


def _recovered_pipeline(record: logging.LogRecord) -> bool:
    """Drop psycopg's warning about a pipeline a failed statement aborted: MLflow's PostgreSQL
    store catches that failure and recovers (``log_batch`` of metrics it already holds, as
    linking a run's metrics to its model does), so the warning on stderr reports nothing
    wrong. Everything else psycopg logs is kept."""
    message = record.getMessage()
    return not (message.startswith("error ignored terminating") and "pipeline aborted" in message)


def load_and_check(
    file: Path, overrides: tuple[str, ...], address: str | None
) -> tuple[ExperimentConfig, Checked]:
    """Load the experiment file and run the preflight pipeline on it (fails with one line)."""
    try:
        return check_file(file, overrides, address)
    except ConfigError as exc:
        fail(str(exc))


def check_file(
    file: Path, overrides: tuple[str, ...], address: str | None
) -> tuple[ExperimentConfig, Checked]:
    """Load the experiment file and run the preflight pipeline on it (raises ConfigError)."""
    from raypeft.preflight import run_checks  # why: transformers, datasets; keeps --help fast

    cfg = load_experiment(file, list(overrides))
    return cfg, run_checks(cfg, str(file), address=address)


def experiment_files(
    files: tuple[Path, ...], space_file: Path | None, most: int | None
) -> list[Path]:
    """The experiment files a command was given, as arguments or as ``--space FILE`` (as
    ``tune`` always took it): at least one, at most ``most``, not both ways."""
    given = [*files, *([space_file] if space_file else [])]
    if files and space_file:
        fail("give the experiment file as the argument or as --space FILE, not both")
    if not given:
        fail("name the experiment file: FILE (or --space FILE)")
    if most is not None and len(given) > most:
        fail(f"one experiment file at a time, but got {len(given)}: {' '.join(map(str, given))}")
    return given


def one_source(run_id: str | None, experiment: str | None, model_uri: str | None) -> None:
    """``--run``, ``--experiment`` or ``--model``, exactly one."""
    if [run_id, experiment, model_uri].count(None) != 2:
        fail("give exactly one of --run RUN_ID, --experiment NAME or --model models:/NAME@ALIAS")


def which_model(run_id: str | None, experiment: str | None, model_uri: str | None) -> str:
    """What the user's option names, said plainly (they can differ: a champion alias stays
    on an earlier search's model unless a newer one beats it)."""
    if model_uri:
        return f"{model_uri} (the registered or logged model it names)"
    if experiment:
        return f"the best trial of experiment {experiment!r}'s newest finished search"
    return "the given run"


def download_trained(
    run_id: str | None,
    experiment: str | None,
    tracking_uri: str | None,
    dst: Path,
    model_uri: str | None = None,
) -> tuple[Path, str]:
    """The trained model folder of a run (or an experiment's best trial, or a registered or
    logged model) and the run's id."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # keep stderr clean
    from mlflow.tracking import MlflowClient  # why: MLflow is slow to import

    from raypeft.tracking import runs  # why: MLflow loads only when a run is read
    from raypeft.tracking.stores import check_store

    uri = runs.tracking_uri(tracking_uri)
    check_store(uri)
    if model_uri is not None:
        from raypeft.tracking.registry import download_registered  # why: as above

        return download_registered(uri, model_uri, dst)
    client = MlflowClient(tracking_uri=uri)
    run = runs.get_run(client, run_id) if run_id else runs.best_trial_run(client, experiment)
    return runs.download_model(client, run, dst), run.info.run_id


def first_line(exc: Exception) -> str:
    """An exception's first line (its type when it has no message)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound (None if it can), checked as the server binds it:
    ``raypeft ui`` and ``raypeft serve`` say so in one line rather than let their server fail."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: {exc.strerror}"
    family, socktype, proto, _, address = infos[0]
    with socket.socket(family, socktype, proto) as sock:
        # as uvicorn does: a port that only has connections in TIME_WAIT is free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return f"{host}:{port}: cannot listen there ({exc.strerror}); choose another --port"
    return None
