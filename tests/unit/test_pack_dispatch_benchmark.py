"""``python -m benchmarks.device.pack_dispatch --smoke`` prints, for every method that packs
and every K, the operators one pack step dispatches (in all and per phase), and the pack's time
against its members stepping one after another. Structure only: no count or time is judged
here."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.device import pack_dispatch
from benchmarks.device.steps import Setting
from raypeft.methods import METHODS
from tests.helpers import run_benchmark

REPO = Path(__file__).resolve().parents[2]
KS = ["1", "2"]  # --smoke's


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("|")[1:-1]]


def _rows(stdout: str, *header: str) -> list[list[str]]:
    """The cells of the markdown rows under the table whose header starts with ``header``."""
    lines = stdout.splitlines()
    start = next(
        i for i, line in enumerate(lines)
        if line.startswith("|") and tuple(_cells(line)[: len(header)]) == header
    )  # fmt: skip
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def _count(cell: str) -> int:
    value = int(cell.replace(",", ""))
    assert value > 0, cell
    return value


@pytest.mark.slow
def test_every_packing_method_and_k_gets_its_operator_count(tmp_path):
    proc = run_benchmark("benchmarks.device.pack_dispatch", ["--smoke"], tmp_path, [REPO])
    out = proc.stdout
    assert out.startswith(
        "Command: python -m benchmarks.device.pack_dispatch --smoke\nMachine: CPU "
    )

    def setting_of(method: str) -> Setting:
        return Setting("tiny", method, "fp32", 2, 8, 10, 1, True)

    methods = pack_dispatch.EVERY_METHOD
    assert set(METHODS) <= set(methods)
    why = pack_dispatch.packing_methods(methods, setting_of)
    packing = [m for m in methods if why[m] is None]
    assert packing, why  # the built-in methods pack

    summary = {(row[0], row[1]): row for row in _rows(out, "method", "step", "one trial alone")}
    ways = ["member by member", "fused"]
    expected = [(m, w) for m in packing for w in ways] + [
        (m, "") for m in methods if m not in packing
    ]
    assert list(summary) == expected
    fused = [m for m in packing if not summary[m, "fused"][2].startswith("n/a")]
    assert fused == packing, summary  # every built-in method's tiny setting fuses
    for method in packing:
        row = summary[method, "member by member"]
        _count(row[2])  # one trial alone
        assert all(_count(c) for c in row[3 : 3 + len(KS)]), row
        assert row[-1].endswith("×"), row  # the pack's time against sequential steps, at K=2
        if method not in fused:
            assert summary[method, "fused"][2] == f"n/a: method {method!r} has no fused form"
    for method in fused:  # issue 56's goal, as counts: a fused step does not grow with K
        one, two = (_count(c) for c in summary[method, "fused"][3 : 3 + len(KS)])
        assert two <= 1.1 * one, summary[method, "fused"]
        assert summary[method, "fused"][-1].endswith("×")

    phases = _rows(out, "method", "step", "K")
    want = [(m, w, k) for w in ways for m in (packing if w != "fused" else fused) for k in KS]
    assert [(r[0], r[1], r[2]) for r in phases] == want
    for method, way, k, forward, backward, rest, total in phases:
        assert _count(forward) + _count(backward) + _count(rest) == _count(total), method
        assert total == summary[method, way][3 + KS.index(k)]
    timed = [line for line in out.splitlines() if line.startswith("- ") and "K=2" in line]
    assert len(timed) == len(packing)
    assert sum(", fused " in line for line in timed) == len(fused)
