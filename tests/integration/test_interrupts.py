"""Ctrl-C and ``kill`` during a real search (real Ray, MLflow, Optuna, through the CLI):
the search pauses, says how to go on, and ``--resume`` finishes it with nothing lost or
logged twice.

The search: 3 DePT trials on tiny-bert, one at a time, 1,000 steps each with an evaluation
(and checkpoint) every 100. The signal lands after the first trial finished and while the
second is past a checkpoint. The SIGTERM test runs the trials in packs of two
(``resources.trials_per_worker``): the signal lands while the third trains in a pack. The
damaged-checkpoint test pauses a shorter search (2 trials of 800 steps, under ASHA) in its
first trial. No resumed search prints Optuna's warning about a step reported twice: a
restarted trial runs the steps after its checkpoint again, and raypeft does not report them
to the study a second time.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import time
from pathlib import Path

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

STEPS, EVERY = 1000, 100
STUDY, OVERRIDE = "tiny-dept", "train.head_lr=0.02"  # an override the resume line must repeat


def _start(
    tmp_path: Path,
    packed: bool = False,
    trials: int = 3,
    steps: int = STEPS,
    scheduler: dict | None = None,
):
    """The search: ``trials`` grid points of ``steps`` steps each; ``packed``: two trials at a
    time in one pack (trials_per_worker 2), so the signal lands while the third trial trains
    in the pack its first two left; ``scheduler``: none unless given."""
    path = tiny_experiment(
        tmp_path,
        train={"max_steps": steps, "eval_every": EVERY, "batch_size": 8, "head_lr": 0.01},
        space={
            "method.lr_prompt": {"grid": [0.1, 0.3, 0.5][:trials]},
            "method.lr_lowrank": {"grid": [1.0e-3]},
            "method.prompt_length": {"choice": [2, 4, 6]},
        },
        search={
            "num_samples": trials,
            "max_concurrent": 2 if packed else 1,
            "scheduler": scheduler or {"type": "none"},
        },
        **({"resources": {"trials_per_worker": 2}} if packed else {}),
    )
    return start_search(["--space", str(path), "--quiet", "--set", OVERRIDE], tmp_path)


def _latest_steps(tmp_path: Path) -> dict[str, int]:
    """Each trial's newest reported step (Tune's result files)."""
    out: dict[str, int] = {}
    for r in results(tmp_path / "ray_results"):
        out[r["trial_id"]] = max(out.get(r["trial_id"], 0), r.get("step", 0))
    return out


def _midway(tmp_path: Path, proc, steps: int = STEPS, besides: str = "") -> str:
    """A trial (other than ``besides``) past a checkpoint and still far from its end."""
    running = wait_for(
        lambda: [
            t
            for t, s in _latest_steps(tmp_path).items()
            if t != besides and 2 * EVERY <= s < steps - 2 * EVERY
        ],
        "a trial mid-way (past a checkpoint)",
        400,
        proc,
    )
    return running[0]


def _one_finished_one_midway(tmp_path: Path, proc) -> tuple[str, str]:
    done = wait_for(
        lambda: [t for t, s in _latest_steps(tmp_path).items() if s >= STEPS], "trial 1", 400, proc
    )
    wait_for(lambda: mlflow_finished(tmp_path, done[0]), "trial 1 in MLflow", 60, proc)
    return done[0], _midway(tmp_path, proc, besides=done[0])


def _paused_line(tmp_path: Path, signal_name: str) -> str:
    """The last line the search printed, checked against MLflow: the trials it says ended
    are the finished runs, the ones it names as interrupted the KILLED ones."""
    line = (tmp_path / "stdout.log").read_text().strip().splitlines()[-1]
    match = re.fullmatch(
        rf"Paused by {signal_name}: (\d+) trials? ended, (\d+) interrupted \(([^)]*)\); "
        r"continue with: (raypeft tune .* --resume)",
        line,
    )
    assert match, line
    _, _, kids = parent_and_kids(tmp_path)
    ended = [k for k in kids if k.info.status != "KILLED"]
    killed = {k.data.tags["raypeft.trial_id"] for k in kids if k.info.status == "KILLED"}
    assert int(match[1]) == len(ended)
    assert int(match[2]) == len(killed) and set(match[3].split(", ")) == killed
    return line


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'optuna.db'}")


def _resume(tmp_path: Path, line: str):
    command = shlex.split(line.split("continue with: ", 1)[1])
    assert command[:2] == ["raypeft", "tune"] and command[-1] == "--resume"
    assert ["--set", OVERRIDE] == command[command.index("--set") : command.index("--set") + 2]
    resumed = run_cli(command[1:], cwd=tmp_path, timeout=900)
    (tmp_path / "resume.log").write_text(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # Optuna warns at a step reported twice; a restarted trial's repeated steps are not
    assert "reported value is ignored" not in resumed.stdout + resumed.stderr
    return resumed


def _assert_completed_once(
    tmp_path: Path, parent_id: str, trials: int = 3, steps: int = STEPS
) -> dict:
    client, parent, kids = parent_and_kids(tmp_path)  # still one search, the same run
    assert parent.info.run_id == parent_id and parent.info.status == "FINISHED"
    trial_ids = [k.data.tags["raypeft.trial_id"] for k in kids]
    assert len(kids) == trials and len(set(trial_ids)) == trials  # one run per trial
    assert all(k.info.status == "FINISHED" for k in kids)
    for kid in kids:
        assert_each_step_once(client, kid.info.run_id, steps, EVERY)
    study = _study(tmp_path)
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    complete = {
        t.user_attrs["raypeft.tune_trial_id"]
        for t in study.get_trials(states=(TrialState.COMPLETE,))
    }
    assert complete == set(trial_ids)  # every configuration's result reached Optuna
    return {k.data.tags["raypeft.trial_id"]: k for k in kids}


def test_ctrl_c_pauses_the_search_and_resume_finishes_it(tmp_path):
    proc = _start(tmp_path)
    try:
        done, running = _one_finished_one_midway(tmp_path, proc)
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(timeout=180) == 130, (tmp_path / "stdout.log").read_text()[-3000:]
    finally:
        kill_session(proc)

    line = _paused_line(tmp_path, "SIGINT")
    assert running in line
    log = (tmp_path / "stdout.log").read_text()
    assert "Tuner.restore" not in log and "Traceback" not in log
    assert "test split" not in log  # no test evaluation, no repeats

    client, parent, kids = parent_and_kids(tmp_path)
    assert parent.info.status == "KILLED"
    assert parent.data.tags["raypeft.interrupted"] == "SIGINT"
    by_trial = {k.data.tags["raypeft.trial_id"]: k for k in kids}
    assert by_trial[done].info.status == "FINISHED"
    assert by_trial[running].info.status == "KILLED"
    assert by_trial[running].data.tags["raypeft.interrupted"] == "SIGINT"
    finished_end = by_trial[done].info.end_time
    study = _study(tmp_path)
    # nothing RUNNING; the grid point not started yet stays enqueued (WAITING) for --resume
    assert not study.get_trials(states=(TrialState.RUNNING,))
    (paused,) = [t for t in study.trials if t.user_attrs.get("raypeft.interrupted") == "SIGINT"]
    assert paused.state == TrialState.FAIL

    _resume(tmp_path, line)
    after = _assert_completed_once(tmp_path, parent.info.run_id)
    assert after[done].info.end_time == finished_end  # the finished trial was not run again
    assert int(after[running].data.tags["raypeft.resumed_from_step"]) >= 2 * EVERY
    # the pause is history: the runs that finished are no longer tagged interrupted
    assert "raypeft.interrupted" not in after[running].data.tags
    assert after[running].data.tags["raypeft.resumed_after"] == "SIGINT"
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FINISHED" and "raypeft.interrupted" not in parent.data.tags
    study = _study(tmp_path)  # the paused trial went on in a new one, with its parameters
    (resumed,) = [
        t for t in study.trials if t.user_attrs.get("raypeft.resumed_from_trial") == paused.number
    ]
    assert resumed.params == paused.params and resumed.state == TrialState.COMPLETE


def test_sigterm_then_a_second_signal_stops_at_once_and_stays_resumable(tmp_path):
    """In packs (trials_per_worker 2): the pause and --resume work for packed trials as for
    trials alone (the Ctrl-C test above covers those)."""
    proc = _start(tmp_path, packed=True)
    try:
        _one_finished_one_midway(tmp_path, proc)
        os.kill(proc.pid, signal.SIGTERM)  # a batch scheduler's or `kill`'s signal
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGINT)  # impatient: a second signal in the grace period
        assert proc.wait(timeout=180) == 143, (tmp_path / "stdout.log").read_text()[-3000:]
    finally:
        kill_session(proc)

    line = _paused_line(tmp_path, "SIGTERM")
    client, parent, _ = parent_and_kids(tmp_path)
    assert parent.info.status == "KILLED" and parent.data.tags["raypeft.interrupted"] == "SIGTERM"
    _resume(tmp_path, line)
    after = _assert_completed_once(tmp_path, parent.info.run_id)
    # every trial trained in a pack; the interrupted one went on in a pack of the new search
    assert all(k.data.tags["raypeft.pack_id"] for k in after.values())
    assert any("raypeft.resumed_from_step" in k.data.tags for k in after.values())


def _checkpoints(tmp_path: Path, trial_id: str) -> list[Path]:
    """The checkpoint folders on disk of a trial (its folder names the trial id): the one
    Tune's last experiment snapshot names, and any newer one the trial wrote after it."""
    found = sorted((tmp_path / "ray_results").glob(f"*/*{trial_id}*/checkpoint_*"))
    assert found, trial_id
    return found


def _one_line_error(proc, *expected: str) -> None:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: ") and "Traceback" not in proc.stderr
    assert all(text in line for text in expected), line


def test_damaged_checkpoints_and_models_never_give_a_traceback(tmp_path):
    """The paused trial's checkpoint damaged, ``--resume`` trains that trial again from step
    0, says so, and counts it as what it is (finished, not failed); the finished search's
    model damaged in MLflow's store, ``predict``, ``export`` and ``serve`` refuse it in one
    line naming the run and the file. (Two shorter trials, paused in the first: what is
    damaged is all that matters here.)

    Under ASHA, whose one rung is the trials' last evaluation (the 8th, its max_t): the trial
    that started over runs its 8 evaluations to step 800. Judged on Tune's
    training_iteration, which the restored trial continues from its checkpoint's count while
    its steps start again, it would have been stopped at its 8th result, steps short of its
    end, and counted as stopped early."""
    trials, steps = 2, 800
    asha = {"type": "asha", "grace_period": steps // EVERY}  # max_t: 8 evaluations
    proc = _start(tmp_path, trials=trials, steps=steps, scheduler=asha)
    try:
        running = _midway(tmp_path, proc, steps)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=180) == 130, (tmp_path / "stdout.log").read_text()[-3000:]
    finally:
        kill_session(proc)
    for checkpoint in _checkpoints(tmp_path, running):  # whichever Tune restores
        state = checkpoint / "resume" / "state.safetensors"
        state.write_bytes(state.read_bytes()[:1000])  # a bad disk: the file cut short

    resumed = _resume(tmp_path, _paused_line(tmp_path, "SIGINT"))
    output = resumed.stdout + resumed.stderr
    assert "Traceback" not in output
    assert f"Search finished: {trials} trials (0 stopped early, 0 failed)" in resumed.stdout
    (said,) = [ln for ln in resumed.stdout.splitlines() if "could not resume" in ln]
    assert said.startswith("  1 of them") and running in said
    client, parent, _ = parent_and_kids(tmp_path)
    after = _assert_completed_once(tmp_path, parent.info.run_id, trials, steps)
    reason = after[running].data.tags["raypeft.restarted_because"]
    assert "state.safetensors: damaged" in reason and "started over" in reason
    # what ASHA judged: the trial's evaluations, while Tune's count went on past them
    restarted = [r for r in results(tmp_path / "ray_results") if r["trial_id"] == running]
    last = max(restarted, key=lambda r: r["training_iteration"])
    assert (last["step"], last["evaluation"]) == (steps, steps // EVERY)
    assert last["training_iteration"] > last["evaluation"]

    best_run = client.get_run(parent.data.tags["raypeft.best_run_id"])
    stored = Path(best_run.info.artifact_uri.removeprefix("file://")) / "model"
    trainable = stored / "trainable.safetensors"
    intact = trainable.read_bytes()
    trainable.write_bytes(intact[:-10])  # an upload cut short
    where = f"run {best_run.info.run_id}: model/trainable.safetensors: damaged"
    predict = ["predict", "--experiment", STUDY, "--input", "-"]
    _one_line_error(run_cli(predict, tmp_path, stdin="good\n"), where)
    export = ["export", "--experiment", STUDY, "--format", "peft", "--out", "x"]
    _one_line_error(run_cli(export, tmp_path), where)
    assert not (tmp_path / "x").exists()
    trainable.write_bytes(intact)
    (stored / "config.yaml").unlink()
    missing = f"run {best_run.info.run_id}: model/config.yaml: missing"
    _one_line_error(run_cli(predict, tmp_path, stdin="good\n"), missing)

    # the python_function model's own copy: `raypeft serve` checks it before MLflow's server
    # starts, and `predict --model` reads the same copy
    model_id = parent.data.tags["raypeft.best_model_id"]
    pyfunc = Path(client.get_logged_model(model_id).artifact_location.removeprefix("file://"))
    (served,) = pyfunc.rglob("raypeft_model/trainable.safetensors")
    served.write_bytes(served.read_bytes()[:1000])
    where = (
        f"model models:/{model_id} (logged from run {best_run.info.run_id}): "
        "artifacts/raypeft_model/trainable.safetensors: damaged"
    )
    _one_line_error(run_cli(["serve", "--experiment", STUDY], tmp_path), where)
    by_model = ["predict", "--model", f"models:/{model_id}", "--input", "-"]
    _one_line_error(run_cli(by_model, tmp_path, stdin="good\n"), where)
