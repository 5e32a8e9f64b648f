"""tests/system.py: a test that needs a missing system package is skipped naming it, the run
ends with one line listing such tests by package (under pytest-xdist too: the skip reports
reach the controller), and RAYPEFT_REQUIRE_SYSTEM turns the skips into failures. Each case
runs pytest on a tiny generated test file in a subprocess (seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import servers
from tests.servers import postgres_server

REPO = Path(__file__).resolve().parents[2]

CONFTEST = "from tests.system import pytest_terminal_summary  # noqa: F401\n"
TESTS = """
import pytest

from tests.system import missing, require


def test_drives_a_browser():
    require("chromium", "no-such-program-here", "it drives it")


def test_drives_it_again():
    require("chromium", lambda: None, "it drives it too")


def test_needs_a_database():
    missing("postgresql", "PostgreSQL is not installed (apt-get install postgresql)")


def test_skipped_for_another_reason():
    pytest.skip("not a package")


def test_finds_what_is_there():
    assert require("sh", "sh", "a shell").endswith("/sh")
"""


def _pytest(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_generated.py").write_text(TESTS)
    environ = {k: v for k, v in os.environ.items() if k != "RAYPEFT_REQUIRE_SYSTEM"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=tmp_path,
        env={**environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_one_line_names_every_test_skipped_for_a_package_under_xdist(tmp_path):
    proc = _pytest(tmp_path, "-n", "2", "-rs")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    *_, line, counts = proc.stdout.splitlines()  # after the other summaries (-rs's too)
    assert line == (
        "skipped for missing system packages: chromium (2 tests: "
        "test_generated.py::test_drives_a_browser, test_generated.py::test_drives_it_again), "
        "postgresql (1 test: test_generated.py::test_needs_a_database)"
    )
    assert counts.startswith("1 passed, 4 skipped")
    assert "missing system package chromium: it drives it (apt-get install chromium)" in proc.stdout
    # the reason already says how to install it: not twice
    assert proc.stdout.count("apt-get install postgresql") == 1


def test_no_line_when_nothing_was_skipped_for_a_package(tmp_path):
    proc = _pytest(tmp_path, "-k", "another_reason or finds")
    assert proc.returncode == 0 and "missing system packages" not in proc.stdout


def test_required_system_packages_fail_instead(tmp_path):
    proc = _pytest(tmp_path, RAYPEFT_REQUIRE_SYSTEM="1")
    assert proc.returncode == 1
    assert "3 failed, 1 passed, 1 skipped" in proc.stdout
    assert (
        "missing system package chromium: it drives it (apt-get install chromium); "
        "RAYPEFT_REQUIRE_SYSTEM is set"
    ) in proc.stdout


def test_a_postgresql_that_is_not_installed_skips_for_its_package(tmp_path, monkeypatch):
    """tests/servers.py: the benchmarks' ServerUnavailable becomes the package's skip."""
    monkeypatch.delenv("RAYPEFT_REQUIRE_SYSTEM", raising=False)
    monkeypatch.setattr(servers, "postgres_bin", lambda: None)
    with pytest.raises(pytest.skip.Exception) as skipped:
        postgres_server(tmp_path)
    assert str(skipped.value) == (
        "missing system package postgresql: PostgreSQL is not installed "
        "(no /usr/lib/postgresql/*/bin/initdb; apt-get install postgresql)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing started
