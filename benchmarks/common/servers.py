"""Real database and object-store servers on loopback, for benchmarks and tests alike:
PostgreSQL, an S3 API and an MLflow tracking server.

Why real servers and not mocks: what breaks in production is what a mock leaves out. A
database URL reaches MLflow and Optuna through SQLAlchemy and its driver (psycopg 3), which
run their schema migrations, transactions and connection pools against the server; an
``s3://`` path reaches Ray Tune through pyarrow's S3 filesystem (its C++ AWS SDK), MLflow's
artefacts through boto3, and both only meet the endpoint, credentials and bucket over HTTP.
So each context manager below starts the real program as a process of its own, waits until
it answers, hands out what a client needs, and stops it by its process id when the block
ends (also when the code inside fails):

- :func:`postgres_server`: Debian's PostgreSQL (``initdb`` into a fresh folder, then the
  ``postgres`` server itself, not the system service), password authentication on TCP,
  listening on one loopback address and a free port.
- :func:`s3_server`: moto's server mode (``python -m moto.server``), the S3 REST API kept in
  its memory; clients reach it as they reach AWS, with ``AWS_ENDPOINT_URL`` pointing at it.
- :func:`mlflow_server`: ``mlflow server`` on a backend store, as a cluster's head runs it.

Both stores start in seconds on this machine (measured 2026-11-27: PostgreSQL ~1.5 s, initdb
included; moto ~1.5 s). benchmarks.scale.platform_overhead starts PostgreSQL; the tests
(tests/servers.py) start all three; a multi-node cluster test gives ``host`` an address the
nodes reach. Where a server cannot start on this machine (PostgreSQL not installed, no
``postgres`` user to run it as when root) :class:`ServerUnavailable` says why, before anything
starts: a benchmark prints it and exits 2, a test is skipped. No secret goes on a command
line (any local user reads every process's in /proc): the database URL reaches ``mlflow
server`` through its environment.

This module imports neither pytest nor the tests: benchmarks depend on raypeft alone.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common.processes import stop_group

START_TIMEOUT_S = 60  # each starts in seconds; a loaded machine gets some slack
STOP_TIMEOUT_S = 20


class ServerUnavailable(Exception):
    """A server this machine cannot start, and why (one line); ``package``: the Debian
    package that provides what is missing, where one does."""

    def __init__(self, reason: str, package: str | None = None):
        super().__init__(reason)
        self.reason, self.package = reason, package


def free_port(host: str) -> int:
    """A TCP port nobody listens on at ``host`` now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def stop_process(proc: subprocess.Popen, first: int = signal.SIGTERM) -> None:
    """Stop one server by its pid: ``first``, then SIGKILL if it has not exited in time."""
    if proc.poll() is None:
        os.kill(proc.pid, first)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.exists() else ""


def _wait_until(ready, proc: subprocess.Popen, what: str, log: Path) -> float:
    """Poll ``ready()`` until it is true; fail with the server's log if it exits or hangs.
    Returns the seconds waited."""
    start = time.monotonic()
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited (code {proc.returncode}):\n{_log_tail(log)}")
        if time.monotonic() - start > START_TIMEOUT_S:
            stop_process(proc, signal.SIGKILL)
            raise RuntimeError(f"{what}: no answer in {START_TIMEOUT_S} s:\n{_log_tail(log)}")
        time.sleep(0.1)
    return time.monotonic() - start


# ----------------------------------------------------------------------------- PostgreSQL


@dataclass
class Postgres:
    """A running PostgreSQL server: its address, superuser and process."""

    host: str
    port: int
    user: str
    password: str
    pid: int
    data_dir: Path
    start_s: float = 0.0  # seconds from initdb to the first accepted connection

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` with psycopg 3 as the driver (MLflow, Optuna)."""
        return (
            f"postgresql+psycopg://{self.user}:{self.password}@{self.host}:{self.port}/{database}"
        )

    def conninfo(self, database: str) -> str:
        """The libpq connection string of ``database`` (``psycopg.connect``)."""
        return (
            f"host={self.host} port={self.port} user={self.user} "
            f"password={self.password} dbname={database}"
        )

    def create_database(self, name: str) -> str:
        """Create an empty database; returns its URL (:meth:`url`)."""
        import psycopg  # why: only those who start a server need the driver

        with psycopg.connect(self.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's binaries (Debian's layout), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as: ``postgres`` when we are root (PostgreSQL refuses to run
    as root), else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ServerUnavailable(
            "running as root and there is no 'postgres' user to run PostgreSQL as",
            package="postgresql",  # Debian's package creates the user
        ) from None


def postgres_runnable() -> tuple[Path, pwd.struct_passwd | None]:
    """PostgreSQL's binaries and the user to run them as (None: ourselves); raises
    :class:`ServerUnavailable` where PostgreSQL cannot run here."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise ServerUnavailable(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; "
            "apt-get install postgresql)",
            package="postgresql",
        )
    return bin_dir, _server_user()


def _reachable_by(folder: Path, user: pwd.struct_passwd | None) -> None:
    """Let the server's user traverse the folders down to ``folder`` (pytest's temp folders
    are 0700 root): search permission only, so it can neither list nor read them."""
    if user is None:
        return
    for parent in [folder, *folder.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


def _as(user: pwd.struct_passwd | None) -> dict:
    """Popen arguments that run the child as ``user`` (nothing: as ourselves)."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _initdb(bin_dir: Path, data: Path, user_name: str, password: str, as_user: dict) -> None:
    """A fresh cluster in ``data``: the superuser ``user_name`` with ``password``,
    scram-sha-256 on TCP, peer on the Unix socket."""
    pwfile = data.parent / "pwfile"
    pwfile.write_text(password + "\n")
    if as_user:
        os.chown(pwfile, as_user["user"], as_user["group"])
    subprocess.run(
        [str(bin_dir / "initdb"), "-D", str(data), "-U", user_name, f"--pwfile={pwfile}"]
        + ["--auth-host=scram-sha-256", "--auth-local=peer", "-E", "UTF8", "--no-sync"]
        + ["--locale=C.UTF-8"],
        check=True,
        capture_output=True,
        **as_user,
    )
    pwfile.unlink()


@contextmanager
def postgres_server(work: Path, host: str = "127.0.0.1") -> Iterator[Postgres]:
    """A PostgreSQL server of its own for the block: initdb into ``work/postgres/data``,
    ``postgres`` started directly (no service manager), listening on ``host`` only at a free
    port with password authentication, its Unix socket in ``work/postgres``; stopped by its
    pid (fast shutdown, then SIGKILL) when the block ends. Raises :class:`ServerUnavailable`
    where PostgreSQL cannot run here."""
    bin_dir, user = postgres_runnable()
    as_user = _as(user)
    folder = work / "postgres"
    folder.mkdir(parents=True)
    _reachable_by(work, user)
    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)
    started = time.monotonic()
    name, password = "raypeft", secrets.token_hex(12)
    _initdb(bin_dir, folder / "data", name, password, as_user)
    port = free_port(host)
    log = folder / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(folder / "data"), "-c", f"port={port}"]
            + ["-c", f"listen_addresses={host}", "-c", f"unix_socket_directories={folder}"]
            + ["-c", "fsync=off", "-c", "synchronous_commit=off"],  # a throw-away store
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            **as_user,
        )
    server = Postgres(host, port, name, password, proc.pid, folder / "data")
    try:
        _wait_until(lambda: _accepts(server), proc, "postgres", log)
        server.start_s = time.monotonic() - started
        yield server
    finally:
        stop_process(proc, signal.SIGINT)  # SIGINT: PostgreSQL's fast shutdown


def _accepts(server: Postgres) -> bool:
    import psycopg  # why: only those who start a server need the driver

    try:
        psycopg.connect(server.conninfo("postgres"), connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


# ----------------------------------------------------------------------------- S3 (moto)


@dataclass
class S3:
    """A running S3 API server: its endpoint, process and the environment clients need."""

    endpoint: str  # http://HOST:PORT
    pid: int
    region: str = "us-east-1"
    start_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    def client(self):
        """A boto3 S3 client of this server."""
        import boto3  # why: only those who start a server need it

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )

    def create_bucket(self, name: str) -> str:
        """Create an empty bucket; returns ``s3://name``."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key in ``bucket`` under ``prefix``."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def s3_env(endpoint: str, region: str) -> dict[str, str]:
    """What AWS clients read to reach an S3-compatible endpoint as they reach AWS: boto3 and
    pyarrow's S3 filesystem (``AWS_ENDPOINT_URL``, the AWS SDKs' own setting), MLflow's
    artefact client (``MLFLOW_S3_ENDPOINT_URL``), credentials any S3 API accepts here, and no
    instance-metadata lookups (there is no EC2 here to ask)."""
    return {
        "AWS_ACCESS_KEY_ID": "raypeft-test",
        "AWS_SECRET_ACCESS_KEY": "raypeft-test-secret",
        "AWS_DEFAULT_REGION": region,
        "AWS_ENDPOINT_URL": endpoint,
        "MLFLOW_S3_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@contextmanager
def s3_server(work: Path, host: str = "127.0.0.1") -> Iterator[S3]:
    """moto's S3 API server for the block (``python -m moto.server`` of this environment) on
    ``host`` at a free port, its log in ``work/s3.log``; stopped by its pid when the block
    ends. Its buckets live in its memory and go with it."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port(host)
    endpoint = f"http://{host}:{port}"
    log = work / "s3.log"
    started = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = S3(endpoint, proc.pid)
    server.env = s3_env(endpoint, server.region)
    try:
        _wait_until(lambda: _answers(endpoint), proc, "moto.server", log)
        server.start_s = time.monotonic() - started
        yield server
    finally:
        stop_process(proc)


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer: it serves
    except OSError:
        return False


# ----------------------------------------------------------------------------- MLflow


@dataclass
class TrackingServer:
    """A running ``mlflow server``: its URL and process (the leader of its process group)."""

    url: str  # http://HOST:PORT
    pid: int
    start_s: float = 0.0


@contextmanager
def mlflow_server(
    work: Path,
    backend_store_uri: str,
    artifacts_destination: str,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> Iterator[TrackingServer]:
    """``mlflow server`` of this environment for the block, as a cluster's head runs it: the
    backend store (e.g. a :func:`postgres_server` database), artefacts proxied to
    ``artifacts_destination`` (e.g. ``s3://bucket/mlflow``, with :attr:`S3.env` in ``env``),
    one worker, no job runner; its log in ``work/mlflow.log``. Stopped with its workers (its
    process group) when the block ends. The backend store's URI (a database's password) goes
    through the environment, which mlflow's CLI reads for ``--backend-store-uri`` and hands
    to its workers, not on the command line, which any local user can read."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port(host)
    url = f"http://{host}:{port}"
    server_env = dict(os.environ, **(env or {}))
    server_env.update(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
    server_env["MLFLOW_BACKEND_STORE_URI"] = backend_store_uri
    server_env.pop("MLFLOW_TRACKING_URI", None)
    log = work / "mlflow.log"
    started = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--host", host]
            + ["--port", str(port), "--workers", "1"]
            + ["--artifacts-destination", artifacts_destination],
            env=server_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its workers in its own group, stopped together
        )
    server = TrackingServer(url, proc.pid)
    try:
        _wait_until(lambda: _healthy(url), proc, "mlflow server", log)
        server.start_s = time.monotonic() - started
        yield server
    finally:
        stop_group(proc, STOP_TIMEOUT_S)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
