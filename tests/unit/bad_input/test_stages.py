"""The preflight stages run in order: with two things wrong, the earlier stage's error is the
one line ``validate`` (and ``tune``) print."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main
from raypeft.preflight import STAGES

from .helpers import CPUS, exp, files_task, rows

BROKEN = {  # one break per stage after the schema, as experiment sections
    "files and data": lambda tmp: {"task": files_task(tmp, train=rows(8, ["pos"]))},
    "model": lambda tmp: {"model": {"name": "./models/nope", "max_length": 16}},
    "method settings": lambda tmp: {
        "method": {"name": "dept", "prompt_length": 9, "budget_prompt_length": 10}
    },
    "stores": lambda tmp: {"tracking": {"uri": "bogus://host/x"}},
    "resources": lambda tmp: {"resources": {"cpus_per_worker": CPUS + 1}},
}
SHOWS = {
    "files and data": "2+ needed",
    "model": "no such folder",
    "method settings": "`r >= 1` must hold",
    "stores": "unknown scheme 'bogus'",
    "resources": "resources.cpus_per_worker",
}


def test_the_stages_are_in_the_documented_order():
    assert STAGES == ("schema", "files and data", "model", "method settings", "stores", "resources")
    assert list(BROKEN) == list(STAGES[1:])


PAIRS = [(a, b) for i, a in enumerate(BROKEN) for b in list(BROKEN)[i + 1 :]]


@pytest.mark.parametrize("earlier,later", PAIRS, ids=[f"{a}-before-{b}" for a, b in PAIRS])
def test_the_earlier_stage_fails_first(earlier, later, tmp_path, monkeypatch, guarded):
    monkeypatch.chdir(tmp_path)
    # the later break first, so that a shared section (none today) keeps the earlier one
    sections = {**BROKEN[later](tmp_path), **BROKEN[earlier](tmp_path)}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp(**sections)))
    result = CliRunner().invoke(main, ["validate", "exp.yaml"])
    assert result.exit_code == 2, result.output
    assert SHOWS[earlier] in result.stderr and SHOWS[later] not in result.stderr
