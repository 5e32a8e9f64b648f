"""``raypeft report``'s HTML pages seen in a real browser: headless Chromium (Debian's), driven
by Playwright as in ``test_ui_browser.py``.

The report of the shared finished search (on a copy of its store, where it is also logged to
MLflow) is opened at two window widths: every figure's title must lie inside the page and
above its plot (a two-line title's first line used to be drawn at y = -7 px). Then the
``report.html`` logged to MLflow is downloaded alone into an empty folder and opened: each
figure must render (plotly's ``.main-svg``) with nothing beside the file, as in the MLflow
UI's artefact viewer. Screenshots are kept in ``$RAYPEFT_TEST_ARTIFACTS/report``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from raypeft.reporting import FIGURES, REPORT_PAGE
from tests.helpers import run_cli
from tests.integration.test_report_cli import copy_store, search_runs
from tests.integration.test_ui_browser import ARTIFACTS, CHROMIUM_ARGS, _assert_png, chromium

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]
__all__ = ["chromium"]  # the fixture, shared with test_ui_browser.py

WIDTHS = (1024, 1920)  # a laptop and a desktop window, pixels
RENDER_TIMEOUT_MS = 60_000
# each figure's boxes, in page pixels: its title, its plot areas (the drag layers plotly lays
# over each subplot) and the subplot titles (annotations)
BOXES_JS = """(root) => {
  const box = (e) => { const r = e.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; };
  const title = root.querySelector('.g-gtitle');
  return {
    title: title ? box(title) : null,
    plots: [...root.querySelectorAll('.draglayer .nsewdrag')].map(box),
    panels: [...root.querySelectorAll('.annotation')].map(box),
  };
}"""


def _check_boxes(name: str, width: int, boxes: dict) -> None:
    title = boxes["title"]
    assert title is not None, f"{name} at {width} px: no title drawn"
    where = f"{name} at {width} px: title {title}"
    assert title["top"] >= 0 and title["left"] >= 0 and title["right"] <= width, where
    assert boxes["plots"], f"{name} at {width} px: no plot drawn"
    below = [b["top"] for b in boxes["plots"] + boxes["panels"]]
    assert title["bottom"] <= min(below), f"{where} runs into the plot (top {min(below)})"


def test_report_figures_fit_the_page_and_the_logged_page_opens_alone(
    chromium, finished_search, tmp_path
):
    from playwright.sync_api import expect, sync_playwright

    uri = copy_store(finished_search.cwd, tmp_path, finished_search.client(), "tiny-search")
    out = tmp_path / "rep"
    proc = run_cli(
        ["report", "tiny-search", "--tracking-uri", uri, "--out", str(out)], cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    pages = sorted(p for p in out.glob("*.html") if p.name != REPORT_PAGE)
    names = [p.stem for p in pages]
    assert {"lr_heatmap", "budget_m_r", "learning_curves"} <= set(names) <= set(FIGURES)

    # the copy MLflow holds, alone in an empty folder: no plotly.min.js beside it
    client = MlflowClient(tracking_uri=uri)
    _, parent, _ = search_runs(client, "tiny-search")
    alone = tmp_path / "alone"
    alone.mkdir()
    logged = Path(
        client.download_artifacts(parent.info.run_id, f"report/{REPORT_PAGE}", str(alone))
    )
    assert [p.name for p in logged.parent.iterdir()] == [REPORT_PAGE]

    shots = ARTIFACTS / "report"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            for width in WIDTHS:
                page = browser.new_page(viewport={"width": width, "height": 800})
                for path in pages:
                    page.goto(path.as_uri())
                    page.wait_for_selector(".main-svg", timeout=RENDER_TIMEOUT_MS)
                    boxes = page.locator(".js-plotly-plot").evaluate(BOXES_JS)
                    _check_boxes(path.stem, width, boxes)
                    page.screenshot(path=str(shots / f"{path.stem}-{width}.png"))

                # every figure of the logged page renders, and fits as it does alone
                page.goto(logged.as_uri())
                for name in names:
                    figure = page.locator(f"#{name}")
                    expect(figure.locator(".main-svg").first).to_be_attached(
                        timeout=RENDER_TIMEOUT_MS
                    )
                    _check_boxes(f"{REPORT_PAGE}#{name}", width, figure.evaluate(BOXES_JS))
                assert page.locator(".js-plotly-plot").count() == len(names)
                page.screenshot(path=str(shots / f"report-{width}.png"), full_page=True)
                page.close()
        finally:
            browser.close()
    for width in WIDTHS:
        _assert_png(shots / f"report-{width}.png")
