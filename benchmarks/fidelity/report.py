"""The fidelity benchmark's markdown tables, from its results file alone (no torch).

Scores are the test metric x100 (accuracy; MRPC F1; STS-B Pearson) of each run's best
checkpoint by validation, as mean ± sample std over seeds, at the learning rate chosen on
validation (seed 0) for that task and method.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from benchmarks.common.tables import markdown_table
from benchmarks.fidelity.plan import (
    ABLATIONS,
    DEPT_M,
    Plan,
    Records,
    Run,
    Setting,
    calibration_batch,
    calibration_verdict,
    chosen_lr,
    format_lr,
)

CLAIMS = (("DePT", "PT"), ("M-IDPG-PHM", "PT"))  # the papers' claims: left ≥ right


def table_lines(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table through the benchmarks' one formatter, as lines."""
    return markdown_table(header, [[str(c) for c in row] for row in rows]).splitlines()


def cell(values: list[float]) -> str:
    """``mean ± std`` (std 0 with one value; ``–`` with none)."""
    if not values:
        return "–"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {std:.1f}"


class Results:
    """The finished runs of one benchmark, read per (task, method, variant) at the rate
    chosen for the (task, method) on validation."""

    def __init__(self, plan: Plan, setting: Setting, records: Records):
        self.plan, self.setting, self.records = plan, setting, records

    def lr(self, task: str, method: str):
        """The rate chosen on validation, None until its grid has finished."""
        return chosen_lr(self.plan, self.setting, self.records, task, method)

    def runs(self, task: str, method: str, variant=()) -> list[dict]:
        """The finished records over seeds (seed 0 first), diverged ones included."""
        lr = self.lr(task, method)
        if lr is None:
            return []
        runs = [Run(task, method, lr, s, self.plan.steps, variant) for s in range(self.plan.seeds)]
        return [r for run in runs if (r := self.records.get(run.key(self.setting)))]

    def seeds(self, task: str, method: str, variant=()) -> list[float]:
        """Test scores (x100) over seeds; a diverged run has none."""
        runs = self.runs(task, method, variant)
        return [100 * r["test"] for r in runs if r.get("test") is not None]

    def step_s(self, task: str, method: str, variant=()) -> list[float]:
        """Measured seconds per training step over seeds."""
        return [r["step_s"] for r in self.runs(task, method, variant) if "step_s" in r]

    def first(self, tasks, method: str, variant=()) -> dict | None:
        """A scored record of (method, variant) on one of ``tasks`` (its size, metric and
        majority scores)."""
        found = (r for t in tasks for r in self.runs(t, method, variant) if "params" in r)
        return next(found, None)


def main_table(res: Results) -> list[str]:
    """Per task and method: mean ± std over seeds, the majority-class score, the means."""
    plan = res.plan
    rows = []
    means: dict[str, list[float]] = {m: [] for m in plan.methods}
    for task in plan.tasks:
        first = next((r for m in plan.methods if (r := res.first([task], m))), None)
        metric = first.get("metric", "?") if first else "?"
        majority = (first or {}).get("majority", {}).get("test", {}).get(metric)
        cells = []
        for method in plan.methods:
            values = res.seeds(task, method)
            if values:
                means[method].append(statistics.mean(values))
            cells.append(cell(values))
        base = "–" if majority is None else f"{100 * majority:.1f}"
        rows.append([task, metric, base, *cells])
    row = [
        f"**{statistics.mean(v):.1f}**" if len(v) == len(plan.tasks) else "–"
        for v in means.values()
    ]
    rows.append(["**mean**", "", "", *row])
    return table_lines(["task", "metric", "majority", *plan.methods], rows)


def claims_table(res: Results) -> list[str]:
    """Whether DePT ≥ PT and IDPG ≥ PT hold: the mean difference over tasks, and per task
    the difference and whether it exceeds two standard errors of the seeds."""
    header = ["claim", "mean Δ over tasks (points)", "holds on average", "tasks won",
              "won by > 2 SE", "per task Δ"]  # fmt: skip
    rows = []
    for left, right in CLAIMS:
        if left not in res.plan.methods or right not in res.plan.methods:
            continue
        deltas, clear, per_task = [], 0, []
        for task in res.plan.tasks:
            a, b = res.seeds(task, left), res.seeds(task, right)
            if not a or not b:
                per_task.append(f"{task} –")
                continue
            delta = statistics.mean(a) - statistics.mean(b)
            deltas.append(delta)
            clear += delta > 2 * _standard_error(a, b)
            per_task.append(f"{task} {delta:+.1f}")
        mean = statistics.mean(deltas) if deltas else math.nan
        won = sum(d > 0 for d in deltas)
        holds = "–" if not deltas else ("yes" if mean >= 0 else "no")
        rows.append(
            [f"{left} ≥ {right}", f"{mean:+.1f}", holds, f"{won}/{len(deltas)}",
             f"{clear}/{len(deltas)}", ", ".join(per_task)]
        )  # fmt: skip
    return table_lines(header, rows)


def _standard_error(a: list[float], b: list[float]) -> float:
    """Standard error of the difference of two seed means (0 with single seeds)."""
    var = sum(statistics.variance(x) / len(x) for x in (a, b) if len(x) > 1)
    return math.sqrt(var)


def lr_table(res: Results) -> list[str]:
    """Each method's trainable count (its derived size knob) and the rate chosen per task."""
    rows = []
    for method in res.plan.methods:
        firsts = [r for t in res.plan.tasks if (r := res.first([t], method))]
        sizes = {
            f"{r['params']:,}" + "".join(f", {k}={v}" for k, v in r.get("derived", {}).items())
            for r in firsts
        }
        lrs = [(t, res.lr(t, method)) for t in res.plan.tasks]
        chosen = ", ".join(f"{t}: {format_lr(lr)}" for t, lr in lrs if lr is not None)
        rows.append([method, "; ".join(sorted(sizes)), chosen])
    return table_lines(["method", "trainable parameters", "learning rate chosen (per task)"], rows)


def curve_table(res: Results) -> list[str]:
    """DePT's score against m at the fixed budget (r derived), PT as m = budget length, with
    the training step time relative to PT's (the paper's Figure 3)."""
    tasks = res.plan.curve_tasks
    if not tasks:  # --curve-tasks "": no curve
        return []
    lines = []
    pt_step = [s for t in tasks for s in res.step_s(t, "PT")]
    rows = [("PT", ())] + [
        ("DePT", () if m == DEPT_M else (("method.prompt_length", m),))
        for m in sorted(res.plan.curve_m, reverse=True)
    ]
    for method, variant in rows:
        if method not in res.plan.methods:
            continue
        values = [res.seeds(t, method, variant) for t in tasks]
        record = res.first(tasks, method, variant)
        m = (
            res.setting.budget_length
            if method == "PT"
            else dict(variant).get("method.prompt_length", DEPT_M)
        )
        rank = (record or {}).get("derived", {}).get("rank", 0 if method == "PT" else "–")
        params = f"{record['params']:,}" if record and "params" in record else "–"
        steps = [s for t in tasks for s in res.step_s(t, method, variant)]
        ratio = (
            f"{statistics.mean(steps) / statistics.mean(pt_step):.2f}×"
            if steps and pt_step
            else "–"
        )
        means = [statistics.mean(v) for v in values if v]
        mean = f"{statistics.mean(means):.1f}" if len(means) == len(tasks) else "–"
        lines.append([m, rank, params, *(cell(v) for v in values), mean, ratio])
    return table_lines(["m", "r", "trainable", *tasks, "mean", "step time vs PT"], lines)


def ablation_table(res: Results) -> list[str]:
    """Each fix against its old behaviour, at the default's chosen rate: new, old, Δ."""
    rows = []
    for ablation in ABLATIONS:
        for method in (m for m in ablation.methods if m in res.plan.methods):
            for task in res.plan.ablation_tasks:
                new, old = res.seeds(task, method), res.seeds(task, method, ablation.overrides)
                delta = (
                    f"{statistics.mean(new) - statistics.mean(old):+.1f}" if new and old else "–"
                )
                rows.append(
                    [f"{ablation.fix}: {ablation.new} vs {ablation.old}", method, task,
                     cell(new), cell(old), delta]
                )  # fmt: skip
    header = ["fix", "method", "task", "new (default)", "old", "Δ new − old"]
    return table_lines(header, rows)


def benchmark_report(plan: Plan, setting: Setting, records: Records, command: str) -> list[str]:
    """Every table of the benchmark, with the setting and the command that reproduces it."""
    res = Results(plan, setting, records)
    ours = [r for r in records.values() if r["steps"] == plan.steps]
    minutes = sum(r.get("seconds", 0) for r in ours) / 60
    intro = (
        f"Test metric (x100), mean ± std over {plan.seeds} seeds; budget {setting.budget_params:,} "
        f"trainable parameters (PT l={setting.budget_length}; task head excluded); {setting.model} "
        f"s={setting.max_length}, {plan.steps} steps, batch {setting.batch_size}, "
        f"{setting.evals} evaluations per run, train ≤{setting.train_examples}, validation "
        f"≤{setting.eval_examples}, test ≤{setting.test_examples}, precision {setting.precision}"
        f" ({', '.join(sorted({str(r.get('precision')) for r in ours}))})"
    )
    curve = f"DePT's m against r at the fixed budget (rate chosen for m={DEPT_M})"
    sections = [  # a part the command left out (e.g. --curve-tasks "") prints nothing
        ("Do the papers' claims hold here?", claims_table(res)),
        ("", lr_table(res)),
        (curve, curve_table(res)),
        ("Each fix against the old behaviour (at the default's chosen rate)", ablation_table(res)),
    ]
    lines = [intro, "", *main_table(res), ""]
    for title, table in sections:
        if len(table) > 2:  # a header, its rule and at least one row
            lines += ([title, ""] if title else []) + [*table, ""]
    return [
        *lines, f"{len(ours)} runs, {minutes:.0f} run-minutes. Reproduce with:", "",
        "```bash", command, "```",
    ]  # fmt: skip


def calibration_report(
    plan: Plan,
    setting: Setting,
    records: Records,
    estimate: Callable[[int], float] | None,
    command: str,
) -> list[str]:
    """PT's validation accuracy (at its chosen rate) against each task's majority-class rate
    per step count, the suggested count, and the full benchmark's estimated wall time."""
    tasks = plan.calibrate_tasks
    rows = []
    suggested = None
    for steps in plan.calibrate_steps:
        verdicts = [calibration_verdict(plan, setting, records, t, steps) for t in tasks]
        if all(v is None for v in verdicts):
            continue
        cells = [_verdict_cell(v) for v in verdicts]
        passes = all(v is not None and v["left"] for v in verdicts)
        if passes and suggested is None:
            suggested = steps
        wall = f"{estimate(steps) / 3600:.1f} h" if estimate else "–"
        rows.append([steps, *cells, "yes" if passes else "no", wall])
    header = ["steps", *(f"{t} val acc / majority" for t in tasks), "PT left it on all",
              "full run (est.)"]  # fmt: skip
    lines = table_lines(header, rows)
    runs = len(calibration_batch(plan, 0))
    lines += ["", *first_left_lines(plan, setting, records)]
    lines += [
        "",
        f"Left = validation accuracy ≥ majority rate + {100 * plan.margin:.0f} points, at the "
        f"rate chosen on validation ({runs} PT runs per step count).",
        "",
    ]
    if suggested is None:
        lines.append(
            "No step count tried made PT leave the majority class on every task: "
            "try larger --calibrate-steps."
        )
    else:
        lines.append(
            f"Suggested: --steps {suggested} (the smallest count where PT left it on all)."
        )
    if estimate:
        lines += ["", fits_line(estimate, TARGET_HOURS)]
    return [*lines, "", "Calibrated with:", "", "```bash", command, "```"]


def first_left_lines(plan: Plan, setting: Setting, records: Records) -> list[str]:
    """From each calibration run's validation curve (every evaluation), the first step at
    which PT's accuracy was past the majority class: a long run answers for shorter counts
    (with its own, longer schedule: a run that ends there decays its rate sooner)."""
    lines = []
    for task in plan.calibrate_tasks:
        cells = []
        for steps in plan.calibrate_steps:
            for lr in plan.grid("PT"):
                record = records.get(Run(task, "PT", lr, 0, steps).key(setting))
                if not record or record.get("failed") or "val_curve" not in record:
                    continue
                bar = record["majority"]["validation"].get("accuracy", 1.0) + plan.margin
                # the curve is in accuracy on every classification task
                first = next((s for s, v in record["val_curve"] if v >= bar), None)
                curve = ", ".join(f"{s}: {100 * v:.1f}" for s, v in record["val_curve"])
                where = f"first past it at step {first}" if first else "never past it"
                cells.append(f"lr {lr} over {steps} steps: {where} ({curve})")
        if cells:
            lines.append(f"- {task} (majority + margin {100 * bar:.1f}): " + "; ".join(cells))
    return lines


TARGET_HOURS = 2.5  # issue 14: the benchmark runs in the background in at most this


def fits_line(estimate: Callable[[int], float], target_hours: float) -> str:
    """The largest step count whose full benchmark fits in ``target_hours`` (the estimate
    is linear in the steps: fixed costs plus steps times the measured step times)."""
    per_step = (
        estimate(1100) - estimate(100)
    ) / 1000  # a run evaluates --evals times at any length
    base = estimate(100) - 100 * per_step
    steps = int((3600 * target_hours - base) / per_step) if per_step > 0 else 0
    if steps < 1:
        return f"No step count fits the full benchmark in {target_hours:g} h at this setting."
    return (
        f"At this setting the full benchmark fits in {target_hours:g} h up to about "
        f"{steps} steps ({base / 3600:.1f} h of evaluations and set-up, "
        f"{per_step * 100 / 3600:.2f} h per 100 steps)."
    )


def _verdict_cell(verdict: dict | None) -> str:
    """``81.0 / 50.5 ✓ (lr 0.3)`` or ``–`` while the count is running."""
    if verdict is None or verdict["accuracy"] is None:
        return "–"
    mark = "✓" if verdict["left"] else "✗"
    scores = f"{100 * verdict['accuracy']:.1f} / {100 * verdict['majority']:.1f}"
    return f"{scores} {mark} (lr {format_lr(verdict['lr'])})"
