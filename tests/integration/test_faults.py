"""Faults injected into real searches (real Ray, real MLflow, tiny models), then checked for
anything lost: a training worker killed mid-trial, the driver killed mid-search and resumed,
a trial whose loss diverges, a tracking server that does not answer.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers import (
    assert_each_step_once,
    kill_session,
    mlflow_finished,
    parent_and_kids,
    results,
    run_cli,
    start_search,
    tiny_experiment,
    wait_for,
)

pytestmark = pytest.mark.integration


# A long single trial: 600 steps evaluated every 50 (tens of seconds on tiny-bert), so the
# kill lands mid-trial, after at least one checkpoint.
LONG = {"max_steps": 600, "eval_every": 50, "batch_size": 8, "head_lr": 0.01}


@pytest.mark.parametrize(
    "resources",
    [
        {"trial_runner": "in_process"},  # the trial's Tune actor trains: Tune restarts it
        {"trial_runner": "ray_train", "workers_per_trial": 2},  # Ray Train restarts workers
    ],
    ids=["tune-actor", "ray-train-ddp-worker"],
)
def test_killed_worker_resumes_from_its_checkpoint(tmp_path, resources):
    path = tiny_experiment(
        tmp_path,
        train=LONG,
        space={"method.lr_prompt": {"grid": [0.3]}, "method.lr_lowrank": {"grid": [1.0e-3]}},
        search={"num_samples": 1, "scheduler": {"type": "none"}},
        resources=resources,
        run={"max_failures": 2},
    )
    proc = start_search(["--space", str(path), "--quiet"], tmp_path)
    try:
        first = wait_for(
            lambda: [r for r in results(tmp_path / "ray_results") if r.get("step", 0) >= 100],
            "a checkpoint at step 100",
            timeout=300,
            proc=proc,
        )[0]
        killed_pid = first["worker_pid"]
        os.kill(killed_pid, signal.SIGKILL)  # the process that trains (rank 0)
        assert proc.wait(timeout=420) == 0, (tmp_path / "stdout.log").read_text()[-3000:]
    finally:
        kill_session(proc)

    client, parent, kids = parent_and_kids(tmp_path)
    assert parent.info.status == "FINISHED"
    (kid,) = kids  # still one run for the trial
    tags = kid.data.tags
    assert kid.info.status == "FINISHED"
    resumed_at = int(tags["raypeft.resumed_from_step"])
    assert first["step"] <= resumed_at < LONG["max_steps"]  # its last checkpoint, not step 0
    assert int(tags["raypeft.worker_pid"]) != killed_pid  # a new process carried on
    if resources["trial_runner"] == "in_process":
        assert tags["raypeft.restarts"] == "1"  # Tune's FailureConfig restarted the trial
    # nothing lost, nothing twice: every evaluation exactly once, up to the last step
    assert_each_step_once(client, kid.info.run_id, LONG["max_steps"], LONG["eval_every"])
    # the trial's clock goes on across the restart instead of starting again at 0
    history = client.get_metric_history(kid.info.run_id, "wall_time_s")
    walls = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert walls == sorted(walls), walls
    assert {f.path for f in client.list_artifacts(kid.info.run_id, "model")} >= {
        "model/trainable.safetensors",
        "model/config.yaml",
    }


def test_driver_killed_mid_search_resumes_without_losing_or_repeating(tmp_path):
    steps, every = 1000, 100  # ~10-20 s per trial on tiny-bert
    path = tiny_experiment(
        tmp_path,
        train={**LONG, "max_steps": steps, "eval_every": every},
        space={
            "method.lr_prompt": {"grid": [0.1, 0.3, 0.5]},
            "method.lr_lowrank": {"grid": [1.0e-3]},
            "method.prompt_length": {"choice": [2, 4, 6]},
        },
        search={"num_samples": 3, "max_concurrent": 1, "scheduler": {"type": "none"}},
    )
    args = ["--space", str(path), "--quiet"]
    proc = start_search(args, tmp_path)
    try:
        # the first trial finished (in MLflow too), the second past a checkpoint: kill then
        def latest_steps() -> dict[str, int]:
            out: dict[str, int] = {}
            for r in results(tmp_path / "ray_results"):
                out[r["trial_id"]] = max(out.get(r["trial_id"], 0), r.get("step", 0))
            return out

        done = wait_for(
            lambda: [t for t, s in latest_steps().items() if s >= steps], "trial 1", 400, proc
        )
        wait_for(lambda: mlflow_finished(tmp_path, done[0]), "trial 1 in MLflow", 60, proc)
        running = wait_for(
            lambda: [t for t, s in latest_steps().items() if 3 * every <= s < steps - every],
            "trial 2 mid-way",
            400,
            proc,
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = time.time()
    finally:
        kill_session(proc)  # the driver's local Ray goes with it (as on a laptop reboot)

    client, parent, kids = parent_and_kids(tmp_path)
    assert parent.info.status == "RUNNING"  # what a killed driver leaves behind
    before = {k.data.tags["raypeft.trial_id"]: k for k in kids}
    finished_history = client.get_metric_history(before[done[0]].info.run_id, "val_accuracy")
    study_name, storage = "tiny-dept", f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.load_study(study_name=study_name, storage=storage)
    complete_before = {
        t.user_attrs["raypeft.tune_trial_id"]: t.value
        for t in study.get_trials(states=(TrialState.COMPLETE,))
    }
    assert done[0] in complete_before

    # a driver killed while Ray copied its callback state into the experiment's folder leaves
    # the file cut short (seen in CI: Tuner.restore then failed with a traceback); make it so
    states = sorted((tmp_path / "ray_results").rglob("callback-states-*.pkl"))
    assert states
    for state in states:
        state.write_bytes(state.read_bytes()[:-7])

    # a different file is refused; the same command with --resume continues
    proc2 = run_cli(["tune", *args, "--resume", "--set", "train.seed=7"], cwd=tmp_path)
    assert proc2.returncode == 2 and "train.seed" in proc2.stderr, proc2.stderr[-2000:]
    resumed = run_cli(["tune", *args, "--resume"], cwd=tmp_path, timeout=600)
    (tmp_path / "resume.log").write_text(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "3 trials" in resumed.stdout
    assert all(state.with_name(f"{state.name}.damaged").is_file() for state in states)

    client, parent_after, kids = parent_and_kids(tmp_path)  # still one search run
    assert parent_after.info.run_id == parent.info.run_id
    assert parent_after.info.status == "FINISHED"
    trial_ids = [k.data.tags["raypeft.trial_id"] for k in kids]
    assert len(kids) == 3 and len(set(trial_ids)) == 3  # exactly one run per trial
    assert all(k.info.status == "FINISHED" for k in kids)
    after = {k.data.tags["raypeft.trial_id"]: k for k in kids}
    # the trial that had finished was not run again: its run is untouched
    assert after[done[0]].info.end_time == before[done[0]].info.end_time
    assert after[done[0]].info.end_time / 1000 < killed_at
    history = client.get_metric_history(after[done[0]].info.run_id, "val_accuracy")
    assert [(m.step, m.value) for m in history] == [(m.step, m.value) for m in finished_history]
    # the interrupted trial continued its own run from a checkpoint, not from step 0: the one
    # the driver's last experiment snapshot named (every second here: start_search), which may
    # be a step or two behind the result the test saw before the kill
    mid = after[running[0]]
    assert int(mid.data.tags["raypeft.resumed_from_step"]) >= every
    for kid in kids:
        assert_each_step_once(client, kid.info.run_id, steps, every)

    # the Optuna history is intact: the earlier trial as it was, every trial complete
    study = optuna.load_study(study_name=study_name, storage=storage)
    complete = {
        t.user_attrs["raypeft.tune_trial_id"]: t.value
        for t in study.get_trials(states=(TrialState.COMPLETE,))
    }
    assert set(complete) == set(trial_ids)
    assert all(complete[t] == v for t, v in complete_before.items())
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))


def test_a_trial_started_after_tunes_last_snapshot_runs_again_on_resume(tmp_path):
    """A driver that dies just after it started a trial, before Tune snapshotted the
    experiment again, leaves that trial's Optuna trial and MLflow run RUNNING while Tune's
    saved experiment (and searcher) do not know it. Made here directly: the search is killed
    in its first trial once Tune's snapshot names it, then the second grid point is started
    as the searcher and the MLflow callback start a trial (Optuna's ask, MLflow's create_run,
    with the same attributes and tags). `--resume` trains that configuration again, as a new
    trial, and ends the stale trial and run with the reason."""
    steps, every = 400, 100
    path = tiny_experiment(
        tmp_path,
        train={**LONG, "max_steps": steps, "eval_every": every},
        space={
            "method.lr_prompt": {"grid": [0.3, 0.5]},
            "method.lr_lowrank": {"grid": [1.0e-3]},
            "method.prompt_length": {"grid": [4]},
        },
        search={"num_samples": 2, "max_concurrent": 1, "scheduler": {"type": "none"}},
    )
    args = ["--space", str(path), "--quiet"]
    proc = start_search(args, tmp_path)
    try:
        first = wait_for(
            lambda: [r for r in results(tmp_path / "ray_results") if every <= r.get("step", 0)],
            "the first trial's first checkpoint",
            400,
            proc,
        )[0]
        wait_for(  # Tune's snapshot names the first trial (it resumes from there)
            lambda: any(
                first["trial_id"] in f.read_text()
                for f in (tmp_path / "ray_results").rglob("experiment_state-*.json")
            ),
            "Tune's snapshot of the first trial",
            60,
            proc,
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        kill_session(proc)
    assert first["step"] < steps  # killed in the first trial, before the second was asked for

    # the second trial, started after Tune's last snapshot: the study's next grid point
    client, parent, kids = parent_and_kids(tmp_path)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.load_study(study_name="tiny-dept", storage=storage)
    # catches: a kill after the second trial was asked for (then Tune's snapshot may know it)
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 1
    stale = study.ask()  # the grid point the searcher enqueued, as its _ask takes it
    params = {
        "method.lr_prompt": stale.suggest_categorical("method.lr_prompt", [0.3, 0.5]),
        "method.lr_lowrank": stale.suggest_categorical("method.lr_lowrank", [1.0e-3]),
        "method.prompt_length": stale.suggest_categorical("method.prompt_length", [4]),
    }
    assert params["method.lr_prompt"] == 0.5  # not the first trial's
    stale.set_user_attr("raypeft.parent_run_id", parent.info.run_id)
    stale.set_user_attr("raypeft.tune_trial_id", "unsnapshotted")
    stale_run = client.create_run(
        parent.info.experiment_id,
        run_name="dept-unsnapshotted",
        tags={
            "mlflow.parentRunId": parent.info.run_id,
            "raypeft.trial_id": "unsnapshotted",
            "raypeft.role": "trial",
        },
    ).info.run_id
    client.log_param(stale_run, "method.lr_prompt", 0.5)

    resumed = run_cli(["tune", *args, "--resume"], cwd=tmp_path, timeout=600)
    (tmp_path / "resume.log").write_text(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # catches: a resumed search that ends without the configuration Tune never knew
    assert "Search finished: 2 trials (0 stopped early, 0 failed)" in resumed.stdout
    assert "1 trial started after Ray Tune's last snapshot ran again" in resumed.stdout

    client, parent_after, kids = parent_and_kids(tmp_path)
    assert parent_after.info.run_id == parent.info.run_id
    assert parent_after.info.status == "FINISHED"
    by_trial = {k.data.tags["raypeft.trial_id"]: k for k in kids}
    # the stale run is closed with the reason, not left RUNNING
    gone = by_trial.pop("unsnapshotted")
    assert gone.info.status == "KILLED"
    assert "after Ray Tune's last snapshot" in gone.data.tags["raypeft.error"]
    # catches: the configuration lost: both grid points trained to their end
    assert all(k.info.status == "FINISHED" for k in by_trial.values())
    lrs = sorted(float(k.data.params["method.lr_prompt"]) for k in by_trial.values())
    assert lrs == [0.3, 0.5]
    for kid in by_trial.values():
        assert_each_step_once(client, kid.info.run_id, steps, every)

    # the study agrees: the stale trial FAIL with the reason, its configuration COMPLETE in
    # the trial that ran it again (which names it), nothing left RUNNING or WAITING
    study = optuna.load_study(study_name="tiny-dept", storage=storage)
    trials = {t.number: t for t in study.trials}
    stale_after = trials[stale.number]
    assert stale_after.state == TrialState.FAIL
    assert "after Ray Tune's last snapshot" in stale_after.user_attrs["raypeft.error"]
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert sorted(t.params["method.lr_prompt"] for t in complete) == [0.3, 0.5]
    (again,) = [t for t in complete if t.params["method.lr_prompt"] == 0.5]
    assert again.user_attrs["raypeft.rerun_of_trial"] == stale.number
    assert again.user_attrs["raypeft.tune_trial_id"] in by_trial
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))


@pytest.mark.usefixtures("shared_ray")  # nothing here is about Ray's start or stop
@pytest.mark.parametrize("packed", [False, True], ids=["alone", "packed"])
def test_diverging_trial_fails_with_its_reason_and_the_search_goes_on(tmp_path, packed):
    """Packed: both trials train in one pack (one prompt length: the registry seats them
    together); the diverging member fails alone, its pack mate goes on to the end. The
    searches join this pytest process's Ray, as a cluster's driver does."""
    path = tiny_experiment(
        tmp_path,
        train={"warmup_ratio": 0.0},
        space={
            "method.lr_prompt": {"grid": [1.0e30, 0.3]},
            "method.lr_lowrank": {"grid": [1e-3]},
            "method.prompt_length": {"grid": [4]},
        },
        search={"num_samples": 2, "scheduler": {"type": "none"}},
        **({"resources": {"trials_per_worker": 2}} if packed else {}),
    )
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 trials (0 stopped early, 1 failed)" in proc.stdout
    client, parent, kids = parent_and_kids(tmp_path)
    assert parent.info.status == "FINISHED" and parent.data.metrics["num_failed_trials"] == 1
    by_lr = {float(k.data.params["method.lr_prompt"]): k for k in kids}
    bad, good = by_lr[1.0e30], by_lr[0.3]
    assert bad.info.status == "FAILED"
    assert "NonFiniteLossError" in bad.data.tags["raypeft.error"]
    assert "raypeft.restarts" not in bad.data.tags  # a diverging loss is never retried
    assert good.info.status == "FINISHED"
    assert parent.data.tags["raypeft.best_run_id"] == good.info.run_id
    if packed:  # one pack held both
        assert bad.data.tags["raypeft.pack_id"] == good.data.tags["raypeft.pack_id"]
    study = optuna.load_study(study_name="tiny-dept", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "FAIL"]
    (failed,) = [t for t in study.trials if t.state == TrialState.FAIL]
    assert "NonFiniteLossError" in failed.user_attrs["raypeft.error"]


def test_unreachable_tracking_server_fails_before_any_trial(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    path = tiny_experiment(tmp_path)
    before = set(os.listdir(tmp_path))
    start = time.monotonic()
    proc = run_cli(["tune", "--space", str(path), "--tracking-uri", uri], cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and uri in lines[0] and "does not answer" in lines[0], proc.stderr
    assert time.monotonic() - start < 60  # no minutes of HTTP retries
    assert set(os.listdir(tmp_path)) == before  # no Ray results, no Optuna db, nothing
