"""Writing the report: PNG + HTML per figure, ``report.html``, ``trials.csv``, ``summary.md``,
MLflow artefacts.

:func:`write_report` draws every figure of :data:`~raypeft.reporting.figures.FIGURES` into a
folder (a figure that cannot be drawn is recorded as skipped, with why, and never sinks the
report), and every HTML figure once more into one self-contained page, ``report.html``
(plotly.js inside it); :func:`log_report` logs the folder under ``report/`` on the search's
parent run, with ``report.html`` in place of the per-figure pages: the MLflow UI's artefact
viewer shows an HTML file alone, in a frame that cannot load a file beside it.
"""

from __future__ import annotations

import csv
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from raypeft.data.metrics import format_metric
from raypeft.errors import ConfigError
from raypeft.reporting.drawing import Skip
from raypeft.reporting.figures import FIGURES
from raypeft.reporting.load import Search

REPORT_ARTIFACTS = "report"  # where the folder goes among the parent run's artefacts
# how an HTML page gets plotly.js -> plotly's include_plotlyjs ("directory": one shared copy,
# PLOTLY_BUNDLE, beside the pages; plotly.io.write_html copies it there once)
PLOTLY_JS: dict[str, str | bool] = {"directory": "directory", "inline": True, "cdn": "cdn"}
PLOTLY_BUNDLE = "plotly.min.js"
REPORT_PAGE = "report.html"  # every HTML figure on one page, plotly.js inlined (~5 MB)
FIGURE_HEIGHT = "640px"  # of each figure on REPORT_PAGE
# what a trial costs, next to what it scored (blank in the table when a run lacks one)
EFFICIENCY_METRICS = (
    "train_samples_per_s",
    "eval_samples_per_s",
    "trainable_params",
    "peak_memory_mb",
    "wall_time_s",
)


@dataclass
class Report:
    folder: Path
    written: dict[str, str]  # figure -> note
    skipped: dict[str, str]  # figure -> reason
    page: Path | None = None  # REPORT_PAGE, where at least one figure was drawn


def write_report(search: Search, out: Path, top: int = 5, plotly_js: str = "directory") -> Report:
    """Write every figure (PNG + HTML), ``trials.csv`` and ``summary.md`` into ``out``.

    ``plotly_js`` (:data:`PLOTLY_JS`): "directory" writes plotly.js once into ``out`` as
    ``plotly.min.js`` and each HTML page loads it from there (small pages, offline), "inline"
    embeds it in each page (~5 MB a page), "cdn" links it from plotly's CDN (small pages,
    online only). Whatever the choice, ``report.html`` holds every HTML figure with plotly.js
    inlined once: one file that opens alone, offline and in the MLflow UI.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    # plotly writes its bundle only where none exists: an older report's (another plotly
    # version's, or one no page of this report loads) must go first
    (out / PLOTLY_BUNDLE).unlink(missing_ok=True)
    (out / REPORT_PAGE).unlink(missing_ok=True)
    report = Report(out, {}, {})
    pages: dict[str, go.Figure] = {}
    for name, (_, draw) in FIGURES.items():
        for stale in (out / f"{name}.png", out / f"{name}.html"):
            stale.unlink(missing_ok=True)  # a skipped figure must not leave an old file behind
        try:
            if search.metric is None:
                raise Skip("no trial reported a validation metric")
            figs = draw(search, top) if name == "learning_curves" else draw(search)
        except Skip as why:
            report.skipped[name] = str(why)
            continue
        except Exception as exc:  # noqa: BLE001 - one figure must never sink the report
            report.skipped[name] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0]
            continue
        figs.png.savefig(out / f"{name}.png", dpi=120)
        figs.html.write_html(out / f"{name}.html", include_plotlyjs=PLOTLY_JS[plotly_js])
        report.written[name] = figs.note
        pages[name] = figs.html
    if pages:
        report.page = out / REPORT_PAGE
        write_report_page(search, pages, report.page)
    write_trials_csv(search, out / "trials.csv")
    (out / "summary.md").write_text(summary_markdown(search, report, top))
    return report


def write_report_page(search: Search, pages: dict[str, go.Figure], path: Path) -> None:
    """Every HTML figure on one self-contained page: plotly.js is inlined once (with the
    first figure, plotly's ``to_html(include_plotlyjs=True)``), nothing is loaded from beside
    it or from the internet."""
    title = f"Search report: {search.experiment} (run {search.parent_id})"
    sections = []
    for n, (name, fig) in enumerate(pages.items()):
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=n == 0,
            div_id=name,
            default_height=FIGURE_HEIGHT,
        )
        caption = html.escape(FIGURES[name][0])
        sections.append(f'<section id="{name}-figure"><h2>{caption}</h2>{div}</section>')
    path.write_text(
        '<!DOCTYPE html>\n<html>\n<head><meta charset="utf-8" />'
        f"<title>{html.escape(title)}</title></head>\n"
        '<body style="font-family: sans-serif; margin: 0 1em">\n'
        f"<h1>{html.escape(title)}</h1>\n" + "\n".join(sections) + "\n</body>\n</html>\n",
        encoding="utf-8",
    )


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def trials_table(search: Search) -> tuple[list[str], list[list[str]]]:
    """Header and rows of ``trials.csv``: one row per trial, scored ones best first."""
    searched = list(search.space)
    derived = sorted({k for t in search.trials for k in t.params if k.startswith("derived.")})
    val = f"val_{search.metric}"
    header = [
        "run_id",
        "trial_id",
        "method",
        "status",
        "stopped_early",
        *searched,
        *derived,
        search.value_key,
        val,
        *EFFICIENCY_METRICS,
        "error",
    ]
    ranked = search.ranked()
    rest = sorted((t for t in search.trials if t.value is None), key=lambda t: t.trial_id)
    rows = []
    for t in ranked + rest:
        stopped = "" if t.stopped_early is None else str(t.stopped_early).lower()
        rows.append(
            [t.run_id, t.trial_id, t.method, t.status, stopped]
            + [t.params.get(k, "") for k in searched + derived]
            + [_cell(t.value), _cell(t.metrics.get(val))]
            + [_cell(t.metrics.get(k)) for k in EFFICIENCY_METRICS]
            + [t.error]
        )
    return header, rows


def write_trials_csv(search: Search, path: Path) -> None:
    header, rows = trials_table(search)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def summary_markdown(search: Search, report: Report, top: int) -> str:
    """A short markdown page: the search, its top trials, the figures written or skipped."""
    ranked = search.ranked()
    failed = sum(t.status == "FAILED" for t in search.trials)
    stopped = sum(bool(t.stopped_early) for t in search.trials)
    lines = [
        f"# Search report: {search.experiment}",
        "",
        f"- parent run: `{search.parent_id}` ({search.parent.info.status})",
        f"- metric: validation {search.metric} ({search.mode}); trials ranked by "
        f"`{search.value_key}`",
        f"- trials: {len(search.trials)} ({len(ranked)} scored, {stopped} stopped early, "
        f"{failed} failed); one row each in `trials.csv`",
    ]
    if ranked:
        lines.append(
            f"- best trial: {ranked[0].label}, run `{ranked[0].run_id}`: "
            f"{format_metric(ranked[0].value)}"
        )
        keys = [k for k in search.space if any(k in t.params for t in ranked)]
        lines += [
            "",
            f"## Top {min(top, len(ranked))} trials",
            "",
            "| # | trial | method | "
            + " | ".join([search.value_key, "stopped early", *keys])
            + " |",
            "|---" * (5 + len(keys)) + "|",
        ]
        for n, t in enumerate(ranked[:top], start=1):
            cells = [
                str(n),
                t.trial_id,
                t.method,
                format_metric(t.value),
                "yes" if t.stopped_early else "no",
            ]
            cells += [t.params.get(k, "") for k in keys]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Figures", ""]
    if report.page is not None:
        lines.append(f"- `{REPORT_PAGE}`: every HTML figure below on one page (opens alone)")
    for name, (what, _) in FIGURES.items():
        if name in report.written:
            note = f" ({report.written[name]})" if report.written[name] else ""
            lines.append(f"- `{name}.png`, `{name}.html`: {what}{note}")
        else:
            lines.append(f"- {name}: skipped: {report.skipped.get(name, 'not drawn')}")
    return "\n".join(lines) + "\n"


def logged_files(folder: Path) -> list[Path]:
    """What :func:`log_report` logs of a report folder: every file but the per-figure HTML
    pages and their shared ``plotly.min.js``, which ``report.html`` replaces (a page that
    loads plotly.js from beside it is blank in the MLflow UI's viewer, and inlined in each
    page plotly.js would be logged once a figure, ~5 MB each)."""
    pages = {f"{name}.html" for name in FIGURES} | {PLOTLY_BUNDLE}
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name not in pages)


def log_report(search: Search, folder: Path) -> str:
    """Log the report folder (:func:`logged_files`) as the parent run's ``report/``
    artefacts; returns their URI."""
    for path in logged_files(folder):
        search.client.log_artifact(search.parent_id, str(path), artifact_path=REPORT_ARTIFACTS)
    return f"{search.parent.info.artifact_uri.rstrip('/')}/{REPORT_ARTIFACTS}"
