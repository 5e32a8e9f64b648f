"""Bad input at the edges: non-finite numbers in any float key, a joint grid too large to
enqueue, a YAML file whose aliases expand beyond any experiment's size.

The float cases are generated from ``schema/experiment.schema.json``: every key whose type is
a number (in any section, method or search-space entry) gets NaN, +inf or -inf, in the file
and as a ``--set`` override, so a key added later is covered without editing this file.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from .helpers import BASE, Case, ids

SCHEMA = json.loads((Path(__file__).parents[3] / "schema/experiment.schema.json").read_text())
NON_FINITE = [math.nan, math.inf, -math.inf]
# a key for the dict-valued sections, so their entries can be reached
DICT_KEYS = {"space": "method.lr", "constraints": "val_loss"}


def _resolve(node: dict) -> dict:
    ref = node.get("$ref")
    return SCHEMA["$defs"][ref.rsplit("/", 1)[-1]] if ref else node


def _is_number(node: dict) -> bool:
    return _resolve(node).get("type") == "number"


def number_paths(node: dict, path: tuple = (), method: str | None = None) -> list[tuple]:
    """``(path, method name)`` of every number the schema allows; a path step is a key or
    an index into a fixed-length list."""
    node = _resolve(node)
    if _is_number(node):
        return [(path, method)]
    found: list[tuple] = []
    for alt in node.get("anyOf", []):
        found += number_paths(alt, path, method)
    for alt in node.get("oneOf", []):  # the method union: each alternative under its name
        alt = _resolve(alt)
        name = alt.get("properties", {}).get("name", {}).get("const", method)
        found += number_paths(alt, path, name)
    for key, child in node.get("properties", {}).items():
        found += number_paths(child, (*path, key), method)
    for i, item in enumerate(node.get("prefixItems", [])):
        found += number_paths(item, (*path, i), method)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and path and path[-1] in DICT_KEYS:
        found += number_paths(extra, (*path, DICT_KEYS[path[-1]]), method)
    return sorted(set(found), key=str)


PATHS = number_paths(SCHEMA)


def _with_value(path: tuple, method: str | None, value: Any) -> dict:
    data = copy.deepcopy(BASE)
    if method:
        data["method"] = {"name": method}
    node: Any = data
    for step, nxt in zip(path, (*path[1:], None), strict=True):
        if nxt is None:
            node[step] = value
        elif isinstance(nxt, int):  # a fixed-length list of numbers: fill it validly
            node = node.setdefault(step, [1e-3, 1e-2])
        else:
            node = node.setdefault(step, {})
    return data


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def test_the_schema_walk_finds_every_kind_of_float_key():
    keys = {_dotted(p) for p, _ in PATHS}
    assert {
        "train.head_lr",
        "method.lr",
        "method.lr_prompt",
        "search.constraints.val_loss.max",
    } <= keys
    assert {"space.method.lr.uniform.0", "space.method.lr.loguniform.1"} <= keys


FLOAT_CASES = [
    Case(
        f"{_dotted(path)}={value}{'@' + method if method else ''}",
        _with_value(path, method, value),
        (str(path[-1 if isinstance(path[-1], str) else -2]), "finite"),
    )
    for i, (path, method) in enumerate(PATHS)
    for value in [NON_FINITE[i % 3]]
]


@pytest.mark.parametrize("case", FLOAT_CASES, ids=ids(FLOAT_CASES))
def test_non_finite_numbers_are_refused_in_the_file(run_case, case):
    run_case(case)


SCALAR_PATHS = [(p, m) for p, m in PATHS if all(isinstance(s, str) for s in p)]
OVERRIDE_CASES = [
    Case(
        f"--set {_dotted(path)}={text}",
        _with_value(path[:-1], method, {}) if len(path) > 1 and method is None else BASE,
        (str(path[-1]), "finite"),
        args=("--set", f"{_dotted(path)}={text}"),
    )
    for i, (path, method) in enumerate(SCALAR_PATHS)
    if method is None or method == BASE["method"]["name"]
    for text in [[".nan", ".inf", "-.inf"][i % 3]]
]


@pytest.mark.parametrize("case", OVERRIDE_CASES, ids=ids(OVERRIDE_CASES))
def test_non_finite_numbers_are_refused_as_overrides(run_case, case):
    run_case(case)


def _grid_of(keys: int, values: int) -> dict:
    grids = {
        "train.seed": list(range(values)),
        "method.prompt_length": list(range(1, values + 1)),
        "train.max_grad_norm": [float(v + 1) for v in range(values)],
        "train.head_lr": [0.1 * (v + 1) for v in range(values)],
        "train.weight_decay": [0.01 * v for v in range(values)],
        "train.warmup_ratio": [0.05 * v for v in range(values)],
        "method.lr": [0.01 * (v + 1) for v in range(values)],
        "train.adam_eps": [1e-8 * (v + 1) for v in range(values)],
        "train.eval_every": list(range(1, values + 1)),
        "train.max_steps": list(range(20, 20 + values)),
    }
    space = {k: {"grid": v} for k, v in list(grids.items())[:keys]}
    return {**copy.deepcopy(BASE), "space": space}


def test_a_grid_of_ten_billion_points_is_refused_up_front(run_case):
    """10 keys x 10 values: counted, never enumerated; the line states the count and limit."""
    run_case(
        Case(
            "grid-1e10",
            _grid_of(10, 10),
            ("space: the joint grid of 10 grid keys", "10,000,000,000 combinations", "10,000"),
        )
    )


def test_a_billion_laughs_file_is_refused(run_case):
    """Nine levels of nine aliases stand for 387 million strings."""
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    text = yaml.safe_dump(BASE) + "\n".join(lines) + "\n"
    run_case(Case("billion-laughs", text, ("exp.yaml: not valid YAML", "anchors and aliases")))


EXPLICIT = [
    Case(
        "method-preset-inf",
        {**copy.deepcopy(BASE), "methods": {"dept": {"lr_prompt": math.inf}}},
        ("methods.dept", "finite"),
    ),
    Case(
        "grid-value-nan",
        {**copy.deepcopy(BASE), "space": {"train.head_lr": {"grid": [0.1, math.nan]}}},
        ("train.head_lr", "finite"),
    ),
]


@pytest.mark.parametrize("case", EXPLICIT, ids=ids(EXPLICIT))
def test_non_finite_numbers_are_refused_in_presets_and_grids(run_case, case):
    run_case(case)
