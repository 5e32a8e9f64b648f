"""``raypeft ui`` seen in a real browser: headless Chromium (Debian's), driven by Playwright.

The command runs as a subprocess on the shared finished search's store (read only). The test
opens the URL it prints: the runs page in MLflow's model-training view with the objective's
metric columns already shown (no click); it expands the parent run (MLflow collapses nested
runs) and checks that the parent run, every trial and their metric values are on the page;
then, through the same server, a trial's dataset inputs, the registered model (its version
and the champion alias) and the best trial's artefacts. Screenshots of each page are kept as
test artefacts in ``$RAYPEFT_TEST_ARTIFACTS/ui`` (default ``test-artifacts/ui`` in the
checkout). Playwright drives the system browser (``executable_path``); it never downloads one.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from raypeft.tracking.runs import parent_runs, trial_runs
from tests.helpers import RAYPEFT
from tests.system import require

pytestmark = pytest.mark.integration

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(
    os.environ.get("RAYPEFT_TEST_ARTIFACTS") or Path(__file__).parents[2] / "test-artifacts"
)
START_TIMEOUT_S = 180  # mlflow server starts in ~5-20 s; more on a loaded machine
UI_TIMEOUT_MS = 60_000  # page loads and renders (each wait ends as soon as the text is there)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of the system Chromium (tests/system.py: skipped without one, failed under
    RAYPEFT_REQUIRE_SYSTEM)."""
    return require(
        "chromium",
        lambda: shutil.which("chromium") or shutil.which("chromium-browser"),
        "the browser tests drive it (Playwright, headless)",
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class UiProcess:
    """A running ``raypeft ui``: its process, port and the URL it printed."""

    def __init__(self, proc: subprocess.Popen, port: int, stderr_path: Path):
        self.proc, self.port, self.stderr_path = proc, port, stderr_path
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]

    def wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"raypeft ui printed no URL in {timeout} s; stderr:\n{self.stderr()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                code = self.proc.wait()
                pytest.fail(f"raypeft ui exited ({code}) before serving; stderr:\n{self.stderr()}")
            if line.startswith("MLflow UI: "):
                return line[len("MLflow UI: ") :].strip()

    def next_line(self, timeout: float) -> str:
        """The next line the command prints (after its URL)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"raypeft ui printed nothing more in {timeout} s")
        assert line is not None, f"raypeft ui exited; stderr:\n{self.stderr()}"
        return line

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, as a service manager would; SIGKILL the tree if it does not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """Last resort: the ui and the server group(s) it started (their own sessions)."""
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            children = ""
        self.proc.kill()
        self.proc.wait()
        for pid in children.split():
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture
def ui(finished_search, tmp_path):
    """``raypeft ui tiny-search --port <free>`` in the search's folder; always stopped after."""
    env = dict(
        os.environ,
        MLFLOW_DISABLE_TELEMETRY="true",
        RAY_USAGE_STATS_ENABLED="0",
        HF_HUB_OFFLINE="1",
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    port = _free_port()
    stderr_path = tmp_path / "ui.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [RAYPEFT, "ui", finished_search.experiment, "--port", str(port)],
            cwd=finished_search.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    running = UiProcess(proc, port, stderr_path)
    try:
        yield running
    finally:
        if proc.poll() is None:
            try:
                running.stop()
            except subprocess.TimeoutExpired:
                pass


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 100 and height > 100 and len(data) > 10_000, (width, height, len(data))


def test_ui_shows_the_search_and_its_trials_in_chromium(chromium, finished_search, ui, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    store = finished_search.cwd / "mlflow.db"
    store_hash = _sha256(store)
    client = finished_search.client()
    experiment = client.get_experiment_by_name(finished_search.experiment)
    exp_id = experiment.experiment_id
    (parent,) = parent_runs(client, exp_id)
    trials = trial_runs(client, exp_id, parent.info.run_id)
    assert len(trials) == 5
    trial_names = sorted(t.info.run_name for t in trials)
    assert all(name.startswith("dept-") for name in trial_names), trial_names
    best_id = parent.data.tags["raypeft.best_run_id"]
    shots = ARTIFACTS / "ui"
    shots.mkdir(parents=True, exist_ok=True)

    t0 = time.monotonic()
    url = ui.wait_for_url(START_TIMEOUT_S)
    started_s = time.monotonic() - t0
    base = f"http://127.0.0.1:{ui.port}"
    # the model-training view, with raypeft's shared view (the objective's metric columns)
    assert url == (
        f"{base}/#/experiments/{exp_id}/runs"
        "?workflowType=machine_learning&viewStateShareKey=raypeft"
    )
    # the best trial's run page, a link that opens in the model-training view too
    best_url = ui.next_line(30).strip()
    assert best_url == (
        f"best trial: {base}/#/experiments/{exp_id}/runs/{best_id}?workflowType=machine_learning"
    )
    best_url = best_url.removeprefix("best trial: ")
    assert 'click "Model training"' in ui.next_line(30)

    # the trained artefacts are served (the runs' artifact_uri are absolute local paths)
    import urllib.request

    with urllib.request.urlopen(
        f"{base}/api/2.0/mlflow/artifacts/list?run_id={best_id}&path=model", timeout=30
    ) as response:
        listed = {f["path"] for f in json.load(response)["files"]}
    assert {"model/config.yaml", "model/trainable.safetensors"} <= listed

    t1 = time.monotonic()
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # fresh: no saved table layout
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 2400, "height": 1100},  # room for the metric columns
        )
        try:
            page = context.new_page()
            page.goto(url)

            # MLflow's model-training view: its sidebar (Runs, Models, Model registry), not
            # the GenAI one (Traces first, Judges, Evaluation runs)
            expect(page.get_by_role("link", name="Model registry")).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            expect(page.get_by_role("link", name="Judges")).to_have_count(0)

            # the parent run, by its run name, in the table's pinned (left) part
            row = page.locator(f'.ag-pinned-left-cols-container [row-id="{parent.info.run_id}"]')
            parent_link = row.get_by_role("link", name=finished_search.experiment, exact=True)
            expect(parent_link).to_be_visible(timeout=UI_TIMEOUT_MS)

            # nested runs are collapsed under their parent: expand it
            first_trial = page.get_by_role("link", name=trial_names[0], exact=True)
            if not first_trial.is_visible():
                row.locator("button").first.click()
            for name in trial_names:
                expect(page.get_by_role("link", name=name, exact=True)).to_be_visible(
                    timeout=UI_TIMEOUT_MS
                )

            # the objective's metric columns are there without a click (the shared view)
            def cell(run_id: str, metric: str):
                return page.locator(
                    f'.ag-center-cols-container [row-id="{run_id}"] [col-id="metrics.`{metric}`"]'
                )

            for metric in ("best_val_accuracy", "val_accuracy", "test_accuracy"):
                header = page.locator(f'.ag-header-cell[col-id="metrics.`{metric}`"]')
                header.scroll_into_view_if_needed(timeout=UI_TIMEOUT_MS)
                expect(header).to_be_visible()
                expect(header).to_contain_text(metric)
            shown = cell(parent.info.run_id, "best_val_accuracy")
            expect(shown).to_be_visible(timeout=UI_TIMEOUT_MS)
            assert float(shown.inner_text()) == pytest.approx(
                parent.data.metrics["best_val_accuracy"], abs=1e-6
            )
            for trial in trials:
                shown = cell(trial.info.run_id, "val_accuracy")
                expect(shown).to_be_visible(timeout=UI_TIMEOUT_MS)
                assert float(shown.inner_text()) == pytest.approx(
                    trial.data.metrics["val_accuracy"], abs=1e-6
                )
            shown = cell(parent.info.run_id, "test_accuracy")
            assert float(shown.inner_text()) == pytest.approx(
                parent.data.metrics["test_accuracy"], abs=1e-6
            )

            # as a Tune user reads a trial table: stopped early or not, and the searched params
            def column(col_id: str, run_id: str):
                header = page.locator(f'.ag-header-cell[col-id="{col_id}"]')
                header.scroll_into_view_if_needed(timeout=UI_TIMEOUT_MS)
                expect(header).to_be_visible()
                return page.locator(
                    f'.ag-center-cols-container [row-id="{run_id}"] [col-id="{col_id}"]'
                )

            for trial in trials:
                stopped = column("tags.`raypeft.stopped_early`", trial.info.run_id)
                expect(stopped).to_have_text(trial.data.tags["raypeft.stopped_early"])
                lr = column("params.`method.lr_prompt`", trial.info.run_id)
                expect(lr).to_have_text(trial.data.params["method.lr_prompt"])
                # MLflow's status is FINISHED either way: a stopped trial's name says so, in
                # the table's first column (this fixture's ASHA stops none: each name is
                # checked against its tag)
                step = int(client.get_metric_history(trial.info.run_id, "val_accuracy")[-1].step)
                early = trial.data.tags["raypeft.stopped_early"] == "true"
                assert trial.info.run_name.endswith(f" (stopped early at step {step})") == early
                assert ("stopped early" in trial.info.run_name) == early

            # the shared view's order: the run name, stopped early, the searched params, then
            # the metrics (MLflow's own order put the tag last and the params after the metrics)
            def position(col_id: str) -> int:
                header = page.locator(f'.ag-header-cell[col-id="{col_id}"]')
                header.scroll_into_view_if_needed(timeout=UI_TIMEOUT_MS)
                return int(header.get_attribute("aria-colindex"))  # its place in the table

            view = json.loads(experiment.tags["mlflow.sharedViewState.raypeft"])
            space = [k.removeprefix("space.") for k in parent.data.params if k[:6] == "space."]
            searched = [f"params.`{key}`" for key in space]
            assert len(searched) == 3
            assert set(searched) <= set(view["columnOrder"])
            searched.sort(key=view["columnOrder"].index)  # the search file's order
            order = [
                "attributes.`Run Name`",
                "tags.`raypeft.stopped_early`",
                *searched,
                "metrics.`best_val_accuracy`",
            ]
            places = [position(col_id) for col_id in order]
            assert places == sorted(places), dict(zip(order, places, strict=True))
            runs_png = shots / "runs-training-view.png"
            page.screenshot(path=str(runs_png))

            # the printed link to the best trial: its page in the model-training view (its
            # sidebar and breadcrumb), with how far it trained in its description
            page.goto(best_url)
            expect(page.get_by_role("link", name="Model registry")).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            expect(page.get_by_role("link", name="Judges")).to_have_count(0)
            expect(page.get_by_role("link", name="Evaluations")).to_have_count(0)
            best_run = client.get_run(best_id)
            expect(page.get_by_text(best_run.data.tags["mlflow.note.content"])).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            best_png = shots / "best-trial-training-view.png"
            page.screenshot(path=str(best_png))

            # a trial's dataset inputs: the three splits, their contexts and digests
            trial = trials[0]
            inputs = {i.dataset.name: i for i in trial.inputs.dataset_inputs}
            train = inputs["tweet_sentiment-train"].dataset
            page.goto(
                f"{base}/#/experiments/{exp_id}/runs/{trial.info.run_id}"
                "?workflowType=machine_learning"
            )
            label = f"tweet_sentiment-train ({train.digest})"
            expect(page.get_by_text(label).first).to_be_visible(timeout=UI_TIMEOUT_MS)
            page.get_by_text(label).first.click()  # the dataset drawer: every split
            for name in ("tweet_sentiment-validation", "tweet_sentiment-test"):
                digest = inputs[name].dataset.digest
                expect(page.get_by_text(f"{name} ({digest})").first).to_be_visible(
                    timeout=UI_TIMEOUT_MS
                )
            for text in ("Data details for", "examples per class", "Source type"):
                expect(page.get_by_text(text).first).to_be_visible()
            datasets_png = shots / "trial-datasets.png"
            page.wait_for_timeout(1500)  # let the drawer finish sliding in
            page.screenshot(path=str(datasets_png))
            page.keyboard.press("Escape")

            # the registered model: version 1 of the experiment's name, alias champion
            registry = f"{base}/#/models/{finished_search.experiment}"
            page.goto(f"{registry}?workflowType=machine_learning")
            expect(page.get_by_text("Version 1", exact=True).first).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            expect(page.get_by_text("champion").first).to_be_visible()
            page.goto(f"{registry}/versions/1?workflowType=machine_learning")
            expect(page.get_by_text("champion").first).to_be_visible(timeout=UI_TIMEOUT_MS)
            best_name = client.get_run(best_id).info.run_name
            expect(page.get_by_role("link", name=best_name).first).to_be_visible()
            expect(page.get_by_text("raypeft.metric_value").first).to_be_visible()
            registry_png = shots / "registered-model-version.png"
            page.screenshot(path=str(registry_png))

            # the best trial's trained artefacts, through the UI's artefact browser
            page.goto(f"{base}/#/experiments/{exp_id}/runs/{best_id}/artifacts")
            page.get_by_text("model", exact=True).first.click(timeout=UI_TIMEOUT_MS)
            expect(page.get_by_text("trainable.safetensors", exact=True)).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            page.get_by_text("config.yaml", exact=True).first.click()
            expect(page.get_by_text("budget_prompt_length").first).to_be_visible(
                timeout=UI_TIMEOUT_MS
            )
            artifacts_png = shots / "artifacts.png"
            page.screenshot(path=str(artifacts_png))
        finally:
            context.close()
    browser_s = time.monotonic() - t1
    for png in (runs_png, best_png, datasets_png, registry_png, artifacts_png):
        _assert_png(png)

    # SIGTERM stops the command, the server and its workers; the port is free again
    t2 = time.monotonic()
    assert ui.stop() == 0, ui.stderr()
    stop_s = time.monotonic() - t2
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", ui.port)) != 0, "the MLflow server still listens"
    assert "Traceback" not in ui.stderr()
    assert _sha256(store) == store_hash  # the store was only read
    print(f"ui ready {started_s:.1f} s, browser checks {browser_s:.1f} s, stop {stop_s:.1f} s")
