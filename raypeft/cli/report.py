"""``raypeft report EXPERIMENT``: figures, a trial table and a summary of a finished search.

Thin: it parses options and calls :mod:`raypeft.reporting` (imported inside the function, with
MLflow, matplotlib and plotly, so ``raypeft --help`` stays fast).
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from raypeft.cli.options import TRACKING_URI, fail, quiet_libraries
from raypeft.errors import ConfigError


def _default_out(experiment: str) -> Path:
    # an MLflow experiment name may hold '/' (e.g. Databricks paths): keep one folder level
    return Path("reports") / (re.sub(r"[^\w.+-]+", "_", experiment).strip("._") or "experiment")


@click.command("report")
@click.argument("experiment")
@TRACKING_URI
@click.option(
    "--run",
    "run_id",
    default=None,
    metavar="PARENT_RUN_ID",
    help="the search (parent run) to report on (default: the newest finished one)",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="output folder (default: reports/<experiment>)",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="trials in the learning curves and the summary table",
)
@click.option("--no-log", is_flag=True, help="do not log the folder to the parent run")
@click.option(
    "--plotly-js",
    type=click.Choice(["directory", "inline", "cdn"]),
    default="directory",
    show_default=True,
    help="how the per-figure HTML pages get plotly.js: one plotly.min.js in the folder (small, "
    "offline), embedded in each page (~5 MB each) or from a CDN (online); report.html, the "
    "page of every figure that is logged to MLflow, always embeds it",
)
def command(
    experiment: str,
    tracking_uri: str | None,
    run_id: str | None,
    out: Path | None,
    top: int,
    no_log: bool,
    plotly_js: str,
) -> None:
    """Report on a finished search of EXPERIMENT (read from MLflow).

    Writes PNG + HTML figures (α1 × α2 heat map over all m and per m, metric vs (m, r), metric
    vs trainable parameters with the Pareto front, learning curves, parameter importances),
    report.html (every figure on one page that opens alone), trials.csv and summary.md, then
    logs them under report/ on the search's parent run.
    """
    quiet_libraries()
    from mlflow.exceptions import MlflowException  # why: MLflow, matplotlib, plotly are slow

    from raypeft.reporting import (
        FIGURES,
        PLOTLY_BUNDLE,
        REPORT_PAGE,
        load_search,
        log_report,
        write_report,
    )

    folder = (out or _default_out(experiment)).resolve()
    try:
        search = load_search(tracking_uri, experiment, run_id)
        report = write_report(search, folder, top=top, plotly_js=plotly_js)
        location = None if no_log else log_report(search, folder)
    except ConfigError as exc:
        fail(str(exc))
    except MlflowException as exc:  # e.g. an unreachable tracking server
        text = str(exc).strip().strip("'\"") or repr(exc)
        fail(f"MLflow: {text.splitlines()[0]}")
    except OSError as exc:  # e.g. the output folder is not writable
        fail(f"{exc.filename or folder}: {exc.strerror or exc}")

    click.echo(
        f"Report on experiment {search.experiment!r}, search {search.parent_id} "
        f"({len(search.trials)} trials, metric {search.metric}, {search.mode})"
    )
    for name in FIGURES:
        if name in report.written:
            click.echo(f"  wrote   {name}.png, {name}.html")
        else:
            click.echo(f"  skipped {name}: {report.skipped[name]}")
    page = f", {REPORT_PAGE}: every figure on one page" if report.page else ""
    shared = ", plotly.min.js for the HTML pages" if (folder / PLOTLY_BUNDLE).exists() else ""
    click.echo(f"Report folder: {folder} (trials.csv, summary.md{shared}{page})")
    if location:
        click.echo(f"Logged to MLflow run {search.parent_id} under report/: {location}")
        if report.page:
            click.echo(f"  open report/{REPORT_PAGE} in the run's Artifacts tab: every figure")
    else:
        click.echo("Not logged to MLflow (--no-log)")
