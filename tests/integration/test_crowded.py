"""Two ``raypeft tune`` started at the same moment in one empty folder (two terminals): both
create the folder's ``mlflow.db`` and ``optuna.db`` at once, and both complete, each search
with its own parent run, its own nested trial runs and its own Optuna trials, none failed by
the other - for two experiments, and for two searches of one experiment (one Optuna study).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from tests.helpers import RAYPEFT, children, cli_env, kill_session, tiny_experiment

pytestmark = pytest.mark.integration

TRIALS = 2


def experiment_file(folder: Path, work: Path, name: str) -> Path:
    folder.mkdir()
    path = tiny_experiment(
        folder,
        task={"max_test_examples": 48},
        train={"max_steps": 8, "eval_every": 4},
        search={"num_samples": TRIALS, "max_concurrent": 1, "scheduler": {"type": "none"}},
        run={"storage_path": str(work / "ray_results")},
    )
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "name": name}))
    return path


@pytest.mark.parametrize("same_experiment", [False, True], ids=["two-experiments", "one"])
def test_two_searches_started_together_in_one_folder_both_complete(tmp_path, same_experiment):
    work = tmp_path / "work"  # empty: no store yet
    work.mkdir()
    names = ["crowd", "crowd"] if same_experiment else ["crowd-a", "crowd-b"]
    files = [experiment_file(tmp_path / f"cfg{i}", work, n) for i, n in enumerate(names)]
    logs = [tmp_path / f"search{i}.log" for i in range(2)]
    procs = [
        subprocess.Popen(
            [RAYPEFT, "tune", "--space", str(path), "--quiet"],
            cwd=work,
            env=cli_env(),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for path, log in zip(files, logs, strict=True)
    ]
    try:
        codes = [proc.wait(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            kill_session(proc)
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n---\n".join(out[-2500:] for out in outputs)

    # MLflow: each command's parent run (as it printed it), finished, with its own trials
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    printed = [re.search(r"parent run (\w+)", out).group(1) for out in outputs]
    assert len(set(printed)) == 2
    trial_runs: dict[str, set[str]] = {}  # parent run id -> its trials' Tune ids
    for parent_id in printed:
        parent = client.get_run(parent_id)
        assert parent.info.status == "FINISHED"
        assert parent.data.tags["raypeft.role"] == "experiment"
        kids = children(client, parent.info.experiment_id, parent_id)
        assert len(kids) == TRIALS and all(k.info.status == "FINISHED" for k in kids)
        trial_runs[parent_id] = {k.data.tags["raypeft.trial_id"] for k in kids}
    assert all(len(ids) == TRIALS for ids in trial_runs.values())
    assert not set.intersection(*trial_runs.values())
    experiments = {client.get_run(p).info.experiment_id for p in printed}
    assert len(experiments) == (1 if same_experiment else 2)

    # Optuna: every trial complete (none left RUNNING, none failed by the other search),
    # each tagged with its own search, the same trials as that search's MLflow runs
    storage = f"sqlite:///{work / 'optuna.db'}"
    studies = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    assert studies == sorted(set(names))
    trials = [
        t for name in studies for t in optuna.load_study(study_name=name, storage=storage).trials
    ]
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 * TRIALS
    optuna_runs: dict[str, set[str]] = {}
    for trial in trials:
        parent_id = trial.user_attrs["raypeft.parent_run_id"]
        optuna_runs.setdefault(parent_id, set()).add(trial.user_attrs["raypeft.tune_trial_id"])
    assert optuna_runs == trial_runs
