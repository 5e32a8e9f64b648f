"""``raypeft serve``: ``mlflow models serve`` for a trained model, once its files are checked.

MLflow's scoring server loads the python_function model in its worker and, when a file is
damaged or missing, ends in its own tracebacks; a model has no public way to make it stop
with one line. So the files are checked here first (the digests recorded when they were
written), with the same one-line error and exit code 2 as ``predict`` and ``export``; only an
intact model is handed to ``mlflow models serve``, which then answers exactly as it would
have (``/ping``, ``/invocations``, the same request and response format).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import click

from raypeft.cli.options import (
    fail,
    one_source,
    port_in_use,
    quiet_libraries,
    run_options,
    which_model,
)
from raypeft.errors import ConfigError

DEFAULT_PORT = 5001  # `raypeft ui` and `mlflow ui` take 5000: both can run side by side


@click.command("serve")
@run_options
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="interface to listen on; the scoring server has no authentication, keep it local",
)
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--workers", type=click.IntRange(min=1), default=1, show_default=True,
    help="scoring server worker processes (each loads the model)",
)  # fmt: skip
def command(
    run_id: str | None,
    experiment: str | None,
    model_uri: str | None,
    tracking_uri: str | None,
    host: str,
    port: int,
    workers: int,
) -> None:
    """Serve a trained model over HTTP, as ``mlflow models serve --env-manager local`` does,
    after checking its files: POST ``{"inputs": {"text": [...]}}`` to /invocations.
    """
    quiet_libraries()
    one_source(run_id, experiment, model_uri)
    why = port_in_use(host, port)
    if why:
        fail(why)
    store, uri, trained_run = _checked_model(run_id, experiment, model_uri, tracking_uri)
    click.echo(
        f"model: {which_model(run_id, experiment, model_uri)}: {uri} (run {trained_run}); "
        f"files checked; serving on http://{host}:{port}/invocations",
        err=True,
    )
    args = ["models", "serve", "-m", uri, "--env-manager", "local"]
    args += ["-h", host, "-p", str(port), "-w", str(workers)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "MLFLOW_REGISTRY_URI": store}
    # MLflow starts `uvicorn` by name: this environment's, also when it is not activated
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # MLflow's own CLI replaces this process: its signals, output and exit code are the user's
    os.execve(sys.executable, [sys.executable, "-m", "mlflow", *args], env)


def _checked_model(
    run_id: str | None, experiment: str | None, model_uri: str | None, tracking_uri: str | None
) -> tuple[str, str, str]:
    """The store, the ``models:/`` URI of the python_function model to serve, and the run it
    was logged from, once its raypeft files match their digests (else one line, exit 2)."""
    from mlflow.tracking import MlflowClient  # why: MLflow is slow to import

    from raypeft.tracking import runs
    from raypeft.tracking.registry import download_registered, logged_model_uri
    from raypeft.tracking.stores import check_store

    store = runs.tracking_uri(tracking_uri)
    try:
        check_store(store)
        if model_uri is None:
            model_uri = logged_model_uri(MlflowClient(tracking_uri=store), run_id, experiment)
        with tempfile.TemporaryDirectory(prefix="raypeft-serve-") as tmp:
            _, trained_run = download_registered(store, model_uri, Path(tmp))
    except ConfigError as exc:
        fail(str(exc))
    return store, model_uri, trained_run
