"""``raypeft ui``: the MLflow web UI on a search's tracking store, opened on its runs.

Starts ``mlflow server`` (one worker, no job runner: two processes, ready in ~10 s) in its own
process group, waits until it answers ``/health``, prints the URL of the experiment's runs
page as ``MLflow UI: <url>`` and serves until Ctrl-C or SIGTERM, then stops the server and
every process it started.

The trained artefacts of the runs are served too: runs logged to a local store keep absolute
artefact paths (``<store folder>/mlruns/<experiment id>/<run id>/artifacts``), which the
server reads directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from raypeft.cli.options import TRACKING_URI, fail, port_in_use, quiet_libraries
from raypeft.config.redact import redact_uri
from raypeft.errors import ConfigError
from raypeft.tracking.stores import check_store, sqlite_file

if TYPE_CHECKING:
    from mlflow.entities import Experiment

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
REMOTE_SCHEMES = ("http:", "https:", "databricks")


class _Stop(Exception):
    """SIGTERM or SIGHUP arrived."""


def _client_host(host: str) -> str:
    """The address a browser on this machine uses to reach a server bound to ``host``."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _wait_ready(proc: subprocess.Popen, base_url: str, timeout: float, log: Path) -> None:
    # why: needed only while waiting for the server to answer
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            raise click.ClickException(
                f"the MLflow server exited (code {code}) while starting: {_last_line(log)}"
            )
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise click.ClickException(
                f"the MLflow server did not answer {base_url}/health within {timeout:.0f} s"
                + (f": {_last_line(log)}" if _last_line(log) else "")
            )
        time.sleep(0.25)


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # the leader is gone; its workers may linger for a moment
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _raise_stop(signum, frame) -> None:
    raise _Stop()


@click.command("ui")
@click.argument("experiment", required=False)
@TRACKING_URI
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="interface to listen on; the UI has no authentication, keep it local",
)
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="server worker processes",
)
@click.option(
    "--start-timeout",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="seconds to wait for the server to answer",
)
def command(
    experiment: str | None,
    tracking_uri: str | None,
    host: str,
    port: int,
    workers: int,
    start_timeout: float,
) -> None:
    """Browse a search in the MLflow web UI: its parent run, trials, metrics and artefacts.

    Starts an MLflow server on the tracking store (on 127.0.0.1 only, by default), waits until
    it answers, prints "MLflow UI: <url>" (the runs page of EXPERIMENT, a name or an id; the
    UI's home page without one) and serves until Ctrl-C, then stops the server. The trials
    are nested under their search's parent run: expand it in the runs table. Trained
    artefacts are in each run's Artifacts tab.

    The UI has no authentication: anyone who can reach the port can read and change the
    runs, so any --host other than 127.0.0.1 is warned about.

    \b
    Example:
      raypeft ui tiny-search --port 5001
    """
    from raypeft.tracking.experiment_view import runs_page_url  # why: imports MLflow
    from raypeft.tracking.runs import tracking_uri as resolve_uri  # why: imports MLflow

    quiet_libraries()
    uri = resolve_uri(tracking_uri)
    found = _check_before_starting(uri, experiment, host, port)
    if host not in LOCAL_HOSTS:
        click.echo(
            f"warning: listening on {host}: the MLflow UI has no authentication, anyone who "
            "can reach this port can read and change the runs",
            err=True,
        )
    base_url = f"http://{_client_host(host)}:{port}"
    # the runs page in the model-training view, with the objective metrics as columns
    url = runs_page_url(base_url, found) if found is not None else f"{base_url}/"
    lines = [f"MLflow UI: {url}"]
    if found is not None:
        lines += _best_trial_lines(uri, found, base_url)
    error, exit_code = _serve(
        _server_command(uri, host, port, workers), base_url, lines, uri, start_timeout
    )
    if error:
        fail(error, exit_code)


def _check_before_starting(
    uri: str, experiment: str | None, host: str, port: int
) -> Experiment | None:
    """Fail (one line) on what would stop the server or the page: a remote store, a missing
    store, a busy port, an unknown experiment. Returns the experiment."""
    if uri.startswith(REMOTE_SCHEMES):
        fail(f"{redact_uri(uri)}: already a tracking server; open it in a browser instead")
    try:
        check_store(uri)
    except ConfigError as exc:
        fail(str(exc))
    why = port_in_use(host, port)
    if why:
        fail(why)
    if experiment is None:
        return None
    from mlflow.tracking import MlflowClient  # why: MLflow is slow to import

    from raypeft.tracking.runs import find_experiment

    try:
        return find_experiment(MlflowClient(tracking_uri=uri), experiment)
    except ConfigError as exc:
        fail(str(exc))


def _best_trial_lines(uri: str, experiment: Experiment, base_url: str) -> list[str]:
    """The newest search's best trial, as a link to its run page in the model-training view,
    and why a run opened from the UI's own links may land in GenAI."""
    from mlflow.tracking import MlflowClient  # why: MLflow is slow to import

    from raypeft.tracking.experiment_view import run_page_url
    from raypeft.tracking.runs import parent_runs
    from raypeft.tracking.tags import BEST_RUN_TAG

    searches = parent_runs(MlflowClient(tracking_uri=uri), experiment.experiment_id)
    best = next((s.data.tags[BEST_RUN_TAG] for s in searches if s.data.tags.get(BEST_RUN_TAG)), "")
    lines = []
    if best:
        lines.append(f"  best trial: {run_page_url(base_url, experiment.experiment_id, best)}")
    lines.append(
        "  a run opened from the UI's own links shows in the browser's last view (GenAI at "
        'first): click "Model training" at the top left once and the browser keeps it'
    )
    return lines


def _server_command(uri: str, host: str, port: int, workers: int) -> list[str]:
    """``mlflow server`` on the store, serving its artefacts. The store's URI is not on it
    (:func:`_start` hands it over through the environment)."""
    command_line = [sys.executable, "-m", "mlflow", "server"]
    store = sqlite_file(uri)
    if store is not None:
        # experiments created from the UI keep their artefacts beside the store, as tune does
        command_line += ["--default-artifact-root", str(store.parent / "mlruns")]
    return command_line + ["--host", host, "--port", str(port), "--workers", str(workers)]


def _serve(
    command_line: list[str], base_url: str, lines: list[str], uri: str, timeout: float
) -> tuple[str | None, int]:
    """Start the server, print its URL once it answers, serve until it stops or a stop
    signal comes, and stop it. Returns the error to print (None: none) and the exit code."""
    with tempfile.TemporaryDirectory(prefix="raypeft-ui-") as tmp:
        log = Path(tmp) / "mlflow-server.log"
        previous = {s: signal.getsignal(s) for s in _HANDLED}
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if previous[sig] != signal.SIG_IGN:  # e.g. nohup: keep serving on hang-up
                signal.signal(sig, _raise_stop)
        proc = None
        try:
            proc = _start(command_line, log, uri)
            return _announce_and_wait(proc, base_url, lines, uri, timeout, log)
        except (KeyboardInterrupt, _Stop):
            click.echo("stopping the MLflow server", err=True)
            return None, 0
        finally:
            for sig in _HANDLED:  # a second Ctrl-C must not cut the clean-up short
                signal.signal(sig, signal.SIG_IGN)
            try:
                if proc is not None:
                    _stop(proc)
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)


_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _start(command_line: list[str], log: Path, uri: str) -> subprocess.Popen:
    """The server, its backend store ``uri`` in the variable mlflow's CLI reads for
    ``--backend-store-uri``: a database's password on a command line is any local user's to
    read (/proc/PID/cmdline)."""
    env = dict(
        os.environ,
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        MLFLOW_DISABLE_TELEMETRY="true",
        MLFLOW_BACKEND_STORE_URI=uri,
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            command_line,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # one group to stop; Ctrl-C reaches us only
        )


def _announce_and_wait(
    proc: subprocess.Popen, base_url: str, lines: list[str], uri: str, timeout: float, log: Path
) -> tuple[str | None, int]:
    try:
        _wait_ready(proc, base_url, timeout, log)
    except click.ClickException as exc:
        return exc.format_message(), 2
    for line in lines:  # the first: "MLflow UI: <url>"
        click.echo(line)
    click.echo(f"  store {redact_uri(uri)}; press Ctrl-C to stop")
    sys.stdout.flush()
    code = proc.wait()
    return f"the MLflow server stopped (code {code}): {_last_line(log)}", 1
