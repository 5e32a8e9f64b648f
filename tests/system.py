"""Tests that need a system package (Debian's, from apt-get: chromium, postgresql, ...) ask for
it here, so that its absence is never a quiet skip:

- :func:`require` (or :func:`missing`, where the caller found out itself) skips the test with
  a reason that names the package, ``missing system package NAME: why``;
- the run ends with one line naming every test so skipped, package by package
  (:func:`pytest_terminal_summary`, a hook tests/conftest.py takes in; pytest-xdist's workers
  send their skip reports to the controller, which prints it);
- with ``RAYPEFT_REQUIRE_SYSTEM=1`` (.ci/run sets it) such a test fails instead: CI has
  installed every package, so a skip there would hide a test that never ran.

The packages the full suite uses are listed in README.md, under its test command.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Generator, Iterable
from typing import Any, NoReturn

import pytest

REQUIRE_VARIABLE = "RAYPEFT_REQUIRE_SYSTEM"
MARK = "missing system package"
_MARKED = re.compile(re.escape(MARK) + r" ([\w.+-]+):")


def require(package: str, found: str | Callable[[], Any], why: str) -> Any:
    """What ``found`` finds: a program's name looked up on PATH, or a check called; when that
    is empty, the test is skipped (failed under ``RAYPEFT_REQUIRE_SYSTEM``) for the want of
    Debian's ``package``, ``why`` saying what needs it."""
    present = shutil.which(found) if isinstance(found, str) else found()
    if not present:
        missing(package, why)
    return present


def missing(package: str, why: str, install: str | None = None) -> NoReturn:
    """Skip the test (fail it under ``RAYPEFT_REQUIRE_SYSTEM``): ``package`` is not installed;
    ``install``: the command that installs it (default Debian's ``apt-get install``)."""
    install = install or f"apt-get install {package}"
    reason = f"{MARK} {package}: {why}" + ("" if install in why else f" ({install})")
    if os.environ.get(REQUIRE_VARIABLE, "") not in ("", "0"):
        pytest.fail(f"{reason}; {REQUIRE_VARIABLE} is set", pytrace=False)
    pytest.skip(reason)


def skipped_for_packages(reports: Iterable[Any]) -> str | None:
    """One line naming each test that ``reports`` (pytest's skip reports) show skipped for a
    missing system package, package by package; None when there is none."""
    tests: dict[str, set[str]] = {}
    for report in reports:
        longrepr = report.longrepr  # (file, line, "Skipped: reason"); a list once sent by xdist
        reason = longrepr[2] if isinstance(longrepr, (tuple, list)) else str(longrepr)
        marked = _MARKED.search(reason)
        if marked:
            tests.setdefault(marked.group(1), set()).add(report.nodeid.rsplit("/", 1)[-1])
    if not tests:
        return None
    parts = [
        f"{package} ({len(names)} test{'s' * (len(names) > 1)}: {', '.join(sorted(names))})"
        for package, names in sorted(tests.items())
    ]
    return "skipped for missing system packages: " + ", ".join(parts)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter) -> Generator[None]:
    """:func:`skipped_for_packages` of the run's skips, where there are any, after every other
    summary (the outermost wrapper resumes last), just above pytest's line of counts."""
    result = yield
    line = skipped_for_packages(terminalreporter.stats.get("skipped", []))
    if line:
        terminalreporter.write_line(line, yellow=True, bold=True)
    return result
