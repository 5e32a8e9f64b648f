"""The real servers of benchmarks/common/servers.py (PostgreSQL, moto's S3 API, ``mlflow
server``), for tests: the same functions, except that a server this machine cannot start
skips the test that wants it for the missing system package (tests/system.py; a failure
under RAYPEFT_REQUIRE_SYSTEM), instead of raising :class:`ServerUnavailable`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import servers
from benchmarks.common.servers import (
    S3,
    Postgres,
    ServerUnavailable,
    TrackingServer,
    free_port,
    mlflow_server,
    s3_env,
    s3_server,
    stop_process,
)
from tests.system import missing

__all__ = [
    "S3",
    "Postgres",
    "TrackingServer",
    "free_port",
    "mlflow_server",
    "postgres_server",
    "s3_env",
    "s3_server",
    "stop_process",
]


def postgres_server(work: Path, host: str = "127.0.0.1"):
    """:func:`benchmarks.common.servers.postgres_server` (a context manager), or the test
    skipped where PostgreSQL cannot run here."""
    try:
        servers.postgres_runnable()
    except ServerUnavailable as exc:
        if exc.package is None:
            pytest.skip(exc.reason)
        missing(exc.package, exc.reason)
    return servers.postgres_server(work, host)
