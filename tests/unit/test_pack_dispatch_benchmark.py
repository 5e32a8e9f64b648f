"""``python -m benchmarks.pack_dispatch --smoke`` prints, for every method that packs and every
K, the operators one pack step dispatches (in all and per phase), and the pack's time against
its members stepping one after another. Structure only: no count or time is judged here."""

from __future__ import annotations

from pathlib import Path

from benchmarks import pack_dispatch
from benchmarks.gpu_step import Setting
from raypeft.methods import METHODS
from tests.helpers import run_benchmark

REPO = Path(__file__).resolve().parents[2]
KS = ["1", "2"]  # --smoke's


def _rows(stdout: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown rows after the header line that starts with ``first_cell``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_cell} "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.split("|")[1:-1]])
    return rows


def _count(cell: str) -> int:
    value = int(cell.replace(",", ""))
    assert value > 0, cell
    return value


def test_every_packing_method_and_k_gets_its_operator_count(tmp_path):
    proc = run_benchmark("benchmarks.pack_dispatch", ["--smoke"], tmp_path, [REPO])
    out = proc.stdout
    assert out.startswith("Command: python -m benchmarks.pack_dispatch --smoke\nMachine: CPU ")

    def setting_of(method: str) -> Setting:
        return Setting("tiny", method, "fp32", 2, 8, 10, 1, True)

    why = pack_dispatch.packing_methods(list(METHODS), setting_of)
    packing = [m for m in METHODS if why[m] is None]
    assert packing, why  # the built-in methods pack

    summary = {row[0]: row for row in _rows(out, "method")}
    assert list(summary) == [*packing, *(m for m in METHODS if m not in packing)]
    for method in packing:
        row = summary[method]
        _count(row[1])  # one trial alone
        assert all(_count(c) for c in row[2 : 2 + len(KS)]), row
        assert row[-1].endswith("×"), row  # the pack's time against sequential steps, at K=2

    phases = _rows(out, "method   | K")
    assert [(r[0], r[1]) for r in phases] == [(m, k) for m in packing for k in KS]
    for method, k, forward, backward, rest, total in phases:
        assert _count(forward) + _count(backward) + _count(rest) == _count(total), method
        assert total == summary[method][2 + KS.index(k)]
    timed = [line for line in out.splitlines() if line.startswith("- ") and "K=2" in line]
    assert len(timed) == len(packing)
