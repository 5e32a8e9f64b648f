"""``optuna-dashboard sqlite:///optuna.db``, as the summary suggests, on a finished search: the
install provides it, and its own API (the WSGI app ``optuna-dashboard`` serves) shows the
study as raypeft recorded it: the objective's name, every trial, the best trial raypeft chose,
and parameter importances."""

from __future__ import annotations

import json
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna_dashboard
import pytest

from raypeft.tracking.tags import BEST_TRIAL_TAG, ROLE_TAG, ROLE_TRIAL, TRIAL_ID_TAG
from tests.helpers import RAYPEFT

pytestmark = pytest.mark.integration


def get(app, path: str) -> dict:
    """One GET through the dashboard's WSGI app, its JSON body."""
    environ: dict = {}
    setup_testing_defaults(environ)
    environ["PATH_INFO"] = path
    status: list[str] = []
    body = b"".join(app(environ, lambda code, headers, exc_info=None: status.append(code)))
    assert status and status[0].startswith("200"), (path, status, body[:500])
    return json.loads(body)


def attrs(trial: dict) -> dict[str, str]:
    return {a["key"]: a["value"] for a in trial["user_attrs"]}


def test_the_dashboard_the_summary_suggests_shows_the_search_as_raypeft_chose_it(finished_search):
    assert (Path(RAYPEFT).parent / "optuna-dashboard").is_file()  # installed beside raypeft
    assert "browse with: optuna-dashboard sqlite:///" in finished_search.stdout
    app = optuna_dashboard.wsgi(f"sqlite:///{finished_search.cwd / 'optuna.db'}")
    (study,) = get(app, "/api/studies")["study_summaries"]
    assert study["study_name"] == finished_search.experiment
    detail = get(app, f"/api/studies/{study['study_id']}")
    assert detail["objective_names"] == ["accuracy"]
    trained = {attrs(t).get("raypeft.tune_trial_id") for t in detail["trials"]} - {None}
    parent = finished_search.parent_run()
    client = finished_search.client()
    runs = client.search_runs([parent.info.experiment_id], f"tags.`{ROLE_TAG}` = '{ROLE_TRIAL}'")
    assert trained == {run.data.tags[TRIAL_ID_TAG] for run in runs}  # every trained trial
    (best,) = detail["best_trials"]
    assert attrs(best)["raypeft.tune_trial_id"] == parent.data.tags[BEST_TRIAL_TAG]
    importances = get(app, f"/api/studies/{study['study_id']}/param_importances")
    (per_objective,) = importances["param_importances"]
    assert {p["name"] for p in per_objective} >= {"method.lr_prompt", "method.lr_lowrank"}
