"""``raypeft simulate FILE... --table T``: what would these searches have cost and found?

Thin: it parses options, checks every input before anything is written (a bad key is one
line, exit 2, nothing created), then calls :mod:`raypeft.search.simulate` for the numbers
and :mod:`raypeft.reporting.replay_figures` for the figures.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import click

from raypeft.cli.options import OVERRIDES, TRACKING_URI, fail, quiet_libraries
from raypeft.config.loading import load_experiment
from raypeft.errors import ConfigError


@click.command("simulate")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--table",
    "table_path",
    required=True,
    type=click.Path(path_type=Path),
    help="a learning-curve table (raypeft table --out), e.g. benchmarks/results/table_*.json",
)
@click.option("--replays", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the seed draws")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="trials at once (default: search.max_concurrent, else as many as the recording ran)",
)
@OVERRIDES
@TRACKING_URI
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output folder (default: simulations/<table's experiment>)")  # fmt: skip
@click.option("--no-log", is_flag=True, help="do not log the results to MLflow")
def command(files, table_path, replays, seed, concurrency, overrides, tracking_uri, out, no_log):
    """Replay each search FILE (its sampler, scheduler, num_samples and space) REPLAYS times
    against the recorded learning curves of --table, through the same Optuna searcher and
    Ray Tune scheduler objects ``raypeft tune`` builds, on a simulated clock. Prints, per
    file, the compute spent and the regret of the chosen configuration as fractions of the
    full grid's and in points: median and IQM with bootstrap 95% intervals. Each replay sees
    the recorded seeds as the file's search.trial_seed trains them and holds one seed out,
    which its choice is scored on; every file after the first is compared with the first
    replay by replay (paired difference, bootstrap interval, Wilcoxon's test)."""
    quiet_libraries()
    from raypeft.search.simulate import CurveTable, differences, replay_config, simulate

    try:
        table = CurveTable.load(table_path)
        searches = [load_experiment(f, list(overrides)) for f in files]
        store = None if no_log else checked_tracking_uri(tracking_uri)  # before any replay
    except ConfigError as exc:
        fail(str(exc))
    for file, search in zip(files, searches, strict=True):  # all checked before any output
        try:
            replay_config(search, table, concurrency or table.concurrency())
        except ConfigError as exc:
            fail(f"{file}: {exc}")
    for note in {"; ".join(differences(s, table)) for s in searches} - {""}:
        click.echo(f"replayed on the table's recording: {note}")
    labels = _labels(files, searches)
    sims = [
        simulate(s, table, replays, seed, concurrency, label)
        for s, label in zip(searches, labels, strict=True)
    ]
    click.echo(summary_table(sims))
    for line in paired_lines(sims):
        click.echo(line)
    for sim in sims:
        click.echo(goal_line(sim))
    folder = (out or _default_out(table)).resolve()
    write_outputs(sims, table, folder, store)


def summary_table(sims) -> str:
    """One row per replayed search: compute, and the regret of its choice on the seed held
    out of each replay, then the in-sample regret (by seed-mean, seeds it saw included)."""
    from tabulate import tabulate  # why: keeps --help fast

    rows = []
    for sim in sims:
        steps, wall, regret = sim.spread("steps"), sim.spread("wall"), sim.spread("regret")
        heldout = sim.spread("heldout")
        rows.append(
            [
                sim.name,
                len(sim.scores),
                _ci(steps.median, steps.median_ci),
                _ci(wall.median, wall.median_ci),
                _ci(heldout.median, heldout.median_ci),
                _ci(heldout.iqm, heldout.iqm_ci),
                f"{heldout.q25:.2f}-{heldout.q75:.2f}" if heldout.n else "-",
                _ci(regret.median, regret.median_ci),
                f"{sim.spread('normalised').median:.2f}",
            ]
        )
    headers = ["search", "replays", "steps/grid (median, 95% CI)", "wall/grid",
               "regret pts, held-out seed (median)", "held-out (IQM)", "held-out 25-75%",
               "in-sample regret (median)", "in-sample norm."]  # fmt: skip
    return tabulate(rows, headers=headers)


def paired_lines(sims) -> list[str]:
    """Each search after the first against the first, replay by replay (the same seed draws
    and held-out seed): the mean difference in regret and in trial-steps."""
    base = sims[0]
    lines = []
    for sim in sims[1:]:
        regret = sim.paired(base, base.scored_on)
        steps = sim.paired(base, "steps")
        which = "held-out" if base.scored_on == "heldout" else "in-sample"
        lines.append(
            f"{sim.name} - {base.name}, paired over {regret.n} replays: {which} regret "
            f"{regret.describe()} points; trial-steps/grid {steps.describe()}"
        )
    return lines


def goal_line(sim) -> str:
    goal = sim.goal()
    verdict = "met" if goal["met"] else "not met"
    scored = "on the held-out seed" if goal["scored_on"] == "heldout" else "in-sample"
    return (
        f"{sim.name}: goal {verdict}: median regret {scored} {goal['median_regret']:.2f} points "
        f"(tolerance {goal['tolerance_points']:.2f}: {goal['tolerance']}) at "
        f"{goal['median_steps']:.2f} of the grid's trial-steps (goal <= 0.30); best "
        f"configuration {sim.quality.best} (seed-mean {sim.quality.means[sim.quality.best]:.4f})"
    )


def write_outputs(sims, table, folder: Path, tracking_uri: str | None) -> None:
    """Per search a folder of replays.csv and summary.json; the figures beside them; one
    MLflow run per search."""
    from raypeft.reporting.replay_figures import draw_anytime, draw_tradeoff
    from raypeft.search.simulate.records import log_simulation, write_replays

    folder.mkdir(parents=True, exist_ok=True)
    draw_anytime({s.name: s.anytime_band() for s in sims}, folder)
    draw_tradeoff({s.name: [(r.steps, r.regret) for r in s.scores] for s in sims}, folder)
    for sim in sims:
        own = folder / _safe(sim.name)
        write_replays(sim, own)
        for figure in ("anytime.png", "tradeoff.png"):
            (own / figure).write_bytes((folder / figure).read_bytes())
        if tracking_uri:
            experiment, run_id = log_simulation(sim, table, own, tracking_uri)
            click.echo(f"{sim.name}: MLflow experiment {experiment!r}, run {run_id}")
    click.echo(f"figures and summaries: {folder}")


def checked_tracking_uri(uri: str | None) -> str:
    """The store the replays are logged to, once it answers (a server, a database) or its
    sqlite file's folder exists."""
    from raypeft.config.redact import redact_uri
    from raypeft.tracking.runs import tracking_uri  # why: MLflow imports slowly
    from raypeft.tracking.stores import check_tracking_store

    resolved = tracking_uri(uri)
    check_tracking_store(resolved, redact_uri(resolved))
    return resolved


def _labels(files, searches) -> list[str]:
    """Each search by its name; by its file's name where names repeat."""
    names = [s.name for s in searches]
    if len(set(names)) == len(names):
        return names
    return [str(f) for f in files]


def _ci(value: float, interval: tuple[float, float]) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _safe(name: str) -> str:
    return re.sub(r"[^\w.+-]+", "_", name).strip("._") or "search"


def _default_out(table) -> Path:
    return Path("simulations") / _safe(str(table.source.get("experiment", "table")))
