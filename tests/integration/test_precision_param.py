"""The precision each trial resolved ``train.precision`` to is a param of its MLflow run."""

from __future__ import annotations

import pytest

from raypeft.modeling.precision import resolve_precision
from raypeft.training.result_keys import PRECISION_PARAM

pytestmark = pytest.mark.integration


def test_each_trial_run_logs_its_resolved_precision(finished_search):
    client = finished_search.client()
    exp = client.get_experiment_by_name(finished_search.experiment)
    (parent,) = client.search_runs([exp.experiment_id], "tags.`raypeft.role` = 'experiment'")
    kids = client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert len(kids) == 5
    expected = resolve_precision("auto", "cpu")  # the trials ran on this machine's CPU
    for kid in kids:
        assert kid.data.params["train.precision"] == "auto"
        assert kid.data.params[PRECISION_PARAM] == expected
