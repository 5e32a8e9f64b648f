"""Property-based bad input: ``raypeft validate`` on experiment files generated from the schema.

hypothesis starts from a valid experiment (tiny model, a small ``files`` task) and mutates it
from ``schema/experiment.schema.json``: any key the schema names set to a value of the wrong
type, out of range, non-finite, a huge list or odd unicode; unknown keys at any depth; the
same mutations as ``--set`` overrides; YAML anchors and aliases (a billion-laughs file too).
Whatever it produces, ``validate`` answers with exit 0, or exit 2 and exactly one
``error: ...`` line: never a traceback, and nothing is created in the working directory.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypeft.cli.main import main

SCHEMA = json.loads((Path(__file__).parents[2] / "schema/experiment.schema.json").read_text())

BASE: dict[str, Any] = {
    "name": "fuzz",
    "model": {"name": "tiny-bert", "max_length": 16},
    "method": {"name": "pt", "prompt_length": 4},
    "task": {
        "name": "files",
        "files": {"train": "train.jsonl", "validation": "val.jsonl"},
        "text_column": "text",
        "label_column": "label",
    },
    "train": {"max_steps": 20, "eval_every": 10, "batch_size": 4},
    "search": {"num_samples": 2},
    "run": {"storage_path": "ray_results"},
}


def _resolve(node: dict) -> dict:
    ref = node.get("$ref")
    return SCHEMA["$defs"][ref.rsplit("/", 1)[-1]] if ref else node


def _leaf_paths(node: dict, prefix: tuple[str, ...] = (), depth: int = 0) -> list[tuple]:
    """Every dotted key the schema names (through $ref, anyOf and oneOf), with its schema."""
    node = _resolve(node)
    out = [(prefix, node)] if prefix else []
    if depth > 4:
        return out
    for alt in node.get("anyOf", []) + node.get("oneOf", []):
        out += _leaf_paths(alt, prefix, depth + 1)
    for key, child in node.get("properties", {}).items():
        out += _leaf_paths(child, (*prefix, key), depth + 1)
    return out


PATHS = sorted({p for p, _ in _leaf_paths(SCHEMA)})

odd_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 1e308, 1e-320, "", "nan", ".inf"]),
    odd_text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(odd_text, inner, max_size=4),
    ),
    max_leaves=12,
)
huge_lists = st.integers(min_value=1000, max_value=5000).map(lambda n: list(range(n)))


def _set(data: dict, path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def mutated_experiments(draw) -> tuple[dict, list[str]]:
    """A copy of BASE with a few keys changed in the file and a few as ``--set`` overrides."""
    data = json.loads(json.dumps(BASE))
    overrides: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(PATHS))
        if draw(st.booleans()):  # an unknown key beside a known one
            path = (*path[:-1], draw(odd_text.filter(bool)))
        value = draw(st.one_of(values, huge_lists))
        if draw(st.booleans()):
            _set(data, path, value)
        else:
            overrides.append(f"{'.'.join(path)}={json.dumps(value, allow_nan=True)}")
    return data, overrides


def _files(tmp: Path) -> None:
    for name, prefix in (("train.jsonl", "t"), ("val.jsonl", "v")):
        (tmp / name).write_text(
            "".join(
                json.dumps({"text": f"{prefix} example {i}", "label": ["pos", "neg"][i % 2]}) + "\n"
                for i in range(8)
            )
        )


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _check_validate(tmp: Path, text: str, overrides: list[str]) -> None:
    (tmp / "exp.yaml").write_text(text, encoding="utf-8")
    before = _snapshot(tmp)
    args = ["validate", "exp.yaml"] + [a for o in overrides for a in ("--set", o)]
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        result = CliRunner().invoke(main, args)
    finally:
        os.chdir(cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"traceback for {args} on\n{text}\n{result.output}"
    )
    assert result.exit_code in (0, 2), (result.exit_code, result.output)
    if result.exit_code == 2:
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and result.output.strip() == errors[0], result.output
    assert _snapshot(tmp) == before, "validate created files"


FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure reproduces
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    _files(tmp_path)
    return tmp_path


@FUZZ
@given(mutated_experiments())
def test_validate_answers_mutated_files_in_one_line(workdir: Path, case) -> None:
    data, overrides = case
    _check_validate(workdir, yaml.safe_dump(data, allow_unicode=True), overrides)


@FUZZ
@given(st.lists(st.sampled_from(PATHS), min_size=1, max_size=3), st.data())
def test_validate_answers_yaml_aliases_in_one_line(workdir: Path, paths, data) -> None:
    """The same node referenced from several keys through an anchor."""
    shared = data.draw(values)
    doc = json.loads(json.dumps(BASE))
    for path in paths:
        _set(doc, path, shared)
    _check_validate(workdir, yaml.safe_dump(doc, allow_unicode=True), [])  # shared nodes: &id001


def test_validate_refuses_a_billion_laughs_file(workdir: Path) -> None:
    """Nine levels of nine aliases would expand to 387 million strings."""
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    text = yaml.safe_dump(BASE) + "\n".join(lines) + "\nspace: {train.seed: {grid: *a9}}\n"
    _check_validate(workdir, text, [])
