"""A fork server for the tests' ``raypeft`` command lines (tests.helpers.run_cli).

Every ``raypeft`` process spends 4-7 s of CPU importing torch, transformers, Ray, MLflow,
Optuna and datasets before it does anything (measured with ``python -X importtime`` on this
machine, 2026-11-28), and the suite runs about a hundred of them. This server imports those
libraries once, in the environment the command lines run in, then forks one child per
command line: the child is a new process (its own pid, session, working directory,
environment, stdin/stdout/stderr files) that runs the console script's entry point,
``raypeft.cli.main:main``, with the given arguments and exits as Python does (non-daemon
threads joined, atexit handlers run, so a local Ray it started is shut down). What it does
not repeat is the libraries' import. Of raypeft's own modules only the entry point and what
it imports are preloaded (every command imports them first); the modules a command imports
lazily are imported by the child, as the console script would, so a missing one still fails.

What differs from ``subprocess.run([raypeft, ...])``: the libraries read environment
variables at import time in the server's environment, so tests.helpers sends here only the
command lines whose environment differs from the server's in variables read at call time
(:data:`CALL_TIME`), and runs every other one as a real console-script process; the random
modules are reseeded in each child (a fresh process seeds them from the OS). Command lines
that a test signals or watches while they run (tests.helpers.start_search) always start the
console script itself.

Protocol (one JSON line each way, over a Unix socket): request ``{"args", "cwd", "env",
"stdin", "stdout", "stderr"}`` (file paths; ``stdin`` may be null), answers ``{"pid": N}``
when the child has started and ``{"returncode": N}`` when it has ended (negative: killed by
that signal, as subprocess reports it). One command line at a time.

Run as ``python -m tests.cli_server SOCKET`` (tests.helpers starts one per pytest process).
"""

from __future__ import annotations

import json
import os
import socket
import sys

# Variables the preloaded libraries read when called, not when imported: a command line
# whose environment differs from the server's only in these (and pytest's own) may fork.
CALL_TIME = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "RAYPEFT_TEST_RAY_ADDRESS",  # tests.helpers.SHARED_RAY: read by run_cli only
        "TUNE_GLOBAL_CHECKPOINT_S",  # ray.tune.execution.tune_controller, per search
        "MLFLOW_TRACKING_URI",  # mlflow.environment_variables: read by .get() at each use
        "MLFLOW_S3_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",  # botocore: read when a session or client is made
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "AWS_ENDPOINT_URL",
    }
)

# What every search driver imports (python -X importtime of `raypeft tune`): the libraries,
# not raypeft's own modules beyond the console script's entry point.
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",  # transformers' lazy shell loads these on first use
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.bert.modeling_bert",  # tiny-bert and MiniLM, most tests' backbones
    "transformers.trainer_utils",
    "datasets",
    "pyarrow",
    "pandas",
    "scipy.stats",
    "sqlalchemy.orm",
    "alembic.context",
    "mlflow",
    "mlflow.tracking",
    "mlflow.pyfunc",
    "mlflow.store.tracking.sqlalchemy_store",
    "optuna",
    "ray",
    "ray.tune",
    "ray.train",
    "raypeft.cli.main",
)


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # MLflow maps every installed distribution to its modules once per process, the first
    # time a model is logged (its requirements are checked against the environment even when
    # given): 0.55 s of CPU in every search driver that logs its best model (raypeft's
    # requirements, measured 2026-11-28). Done here once, every forked driver inherits the
    # map; the check itself still runs in each.
    from mlflow.utils.requirements_utils import warn_dependency_requirement_mismatches

    warn_dependency_requirement_mismatches(["mlflow"])


def _serve(path: str) -> dict | None:
    """Answer requests until the parent pytest process is gone; in a forked child, return
    its request (the child then runs it and exits)."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    listener.settimeout(2.0)
    print("ready", flush=True)
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(None)
            request = json.loads(conn.makefile("r").readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                return request
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            try:
                conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
            except OSError:  # the test gave up on it (a timeout) and closed the connection
                pass
    return None


def _become(request: dict) -> None:
    """This forked child becomes the command line's process: own session, folder,
    environment and standard files, reseeded random modules."""
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(request["stdin"] or os.devnull, os.O_RDONLY)
    stdout, stderr = (
        os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for name in ("stdout", "stderr")
    )
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    import random

    import numpy

    random.seed()
    numpy.random.seed()
    sys.argv = ["raypeft", *request["args"]]
    # the console script's sys.path: its own folder first, not the repository's root (where
    # `python -m tests.cli_server` started), so nothing of tests/ or benchmarks/ imports
    sys.path[0] = os.path.dirname(sys.executable)


def main() -> None:
    (path,) = sys.argv[1:]
    _preload()
    request = _serve(path)
    if request is None:
        return
    _become(request)
    from raypeft.cli.main import main as raypeft

    # SystemExit from click carries the exit code; the interpreter then exits as usual
    sys.exit(raypeft(args=request["args"], prog_name="raypeft"))


if __name__ == "__main__":
    main()
