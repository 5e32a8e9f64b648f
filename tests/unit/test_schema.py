"""The shipped JSON schema of experiment files is current, and it accepts the shipped files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main
from raypeft.config.schema import experiment_json_schema

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "schema" / "experiment.schema.json"
FILES = sorted((REPO / "search_spaces").rglob("*.yaml"))


def test_shipped_schema_is_current():
    shipped = json.loads(SCHEMA.read_text())
    assert shipped == experiment_json_schema(), (
        "schema/experiment.schema.json is stale: run `raypeft schema --out "
        "schema/experiment.schema.json`"
    )


def test_schema_command_prints_it():
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    assert json.loads(result.output) == experiment_json_schema()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_shipped_files_name_the_schema_and_match_its_sections(path):
    text = path.read_text()
    assert text.startswith("# yaml-language-server: $schema=../schema/experiment.schema.json")
    schema = experiment_json_schema()
    data = yaml.safe_load(text)
    assert set(data) <= set(schema["properties"])  # editors flag unknown sections too
    assert schema["additionalProperties"] is False


def test_schema_describes_the_search_language():
    defs = experiment_json_schema()["$defs"]
    search = defs["SearchConfig"]["properties"]
    assert set(search["sampler"]["enum"]) == {"tpe", "random", "grid", "cmaes", "gp", "nsga2"}
    assert {"objectives", "constraints", "repeat_best", "trial_seed", "storage"} <= set(search)
    kinds = defs["SchedulerConfig"]["properties"]["type"]["enum"]
    assert set(kinds) == {"asha", "hyperband", "median", "none"}
    assert {"GridParam", "ChoiceParam", "UniformParam", "LogUniformParam", "IntParam"} <= set(defs)
