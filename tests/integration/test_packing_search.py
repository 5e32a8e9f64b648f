"""Packed searches through the real CLI (``resources.trials_per_worker``): every member is
still a trial. Read back from MLflow and Optuna:

- a packed search gives, run for run, the params and the metrics at every evaluation of its
  unpacked twin (fp32; the backbone runs without dropout); with room for two packs, its
  registry seats the configurations of one prompt length together (no padding);
- under ASHA, members the scheduler stops leave their pack, and the next configurations take
  their slots: every configuration gets its trial, and no pack ever holds more than K.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.helpers import parent_and_kids, run_cli, tiny_experiment

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]

K = 2
NOT_COMPARED = ("samples_per_s", "memory", "wall_time", "system/", "pack_")


def search(tmp_path: Path, name: str, resources: dict, **sections) -> Path:
    """Run ``raypeft tune`` on the tiny DePT search in its own folder; the folder."""
    cwd = tmp_path / name
    cwd.mkdir()
    path = tiny_experiment(cwd, resources=resources, **sections)
    # a generous cap: a few minutes on a quiet machine, much longer on a crowded one
    proc = run_cli(["tune", "--space", str(path), "--quiet"], cwd=cwd, timeout=1800)
    (cwd / "tune.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd


def study(cwd: Path) -> optuna.Study:
    return optuna.load_study(study_name="tiny-dept", storage=f"sqlite:///{cwd / 'optuna.db'}")


def histories(client, run) -> dict[str, list[tuple[int, float]]]:
    return {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        for name in run.data.metrics
    }


def by_config(cwd: Path) -> dict[tuple, tuple]:
    """The search's trial runs by configuration: ``{(lr_prompt, prompt_length): (client, run)}``."""
    client, _, kids = parent_and_kids(cwd)
    assert len(kids) == 4 and all(k.info.status == "FINISHED" for k in kids)
    key = ("method.lr_prompt", "method.prompt_length")
    return {tuple(k.data.params[p] for p in key): (client, k) for k in kids}


def assert_twins(alone: Path, packed: Path) -> None:
    """Run for run, the same params and metrics at every evaluation (MLflow) and the same
    values (Optuna); the packed runs carry their pack's id, size and padding waste."""
    runs_alone, runs_packed = by_config(alone), by_config(packed)
    assert runs_alone.keys() == runs_packed.keys()
    for config, (client, run) in runs_alone.items():
        twin_client, twin = runs_packed[config]
        differ = {k for k in run.data.params if k.startswith("resources.")}
        assert {k: v for k, v in run.data.params.items() if k not in differ} == {
            k: v for k, v in twin.data.params.items() if k not in differ
        }
        want, got = histories(client, run), histories(twin_client, twin)
        compared = [m for m in want if not any(part in m for part in NOT_COMPARED)]
        assert "val_accuracy" in compared and "train_loss" in compared
        assert [s for s, _ in want["val_accuracy"]] == [4, 8]
        for metric in compared:
            assert [s for s, _ in got[metric]] == [s for s, _ in want[metric]], metric
            assert [v for _, v in got[metric]] == pytest.approx(
                [v for _, v in want[metric]], rel=1e-4
            ), (config, metric)
        # what the member's run carries beside: its pack's id, size and padding waste
        assert twin.data.tags["raypeft.pack_id"].startswith("pack-")
        assert "raypeft.pack_id" not in run.data.tags
        assert {v for _, v in got["pack_size"]} <= {1.0, 2.0}
        assert 0 <= twin.data.metrics["pack_padding_waste"] < 1

    want_values, got_values = optuna_values(alone), optuna_values(packed)
    assert want_values.keys() == got_values.keys()
    for config, value in want_values.items():
        assert got_values[config] == pytest.approx(value, rel=1e-4), config


def optuna_values(cwd: Path) -> dict[tuple, float]:
    """One complete Optuna trial per configuration, and its value."""
    trials = study(cwd).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    return {
        (str(t.params["method.lr_prompt"]), str(t.params["method.prompt_length"])): t.value
        for t in trials
    }


def test_a_packed_search_matches_its_unpacked_twin_run_for_run(tmp_path):
    sections = {
        "train": {
            "max_steps": 8,
            "eval_every": 4,
            "precision": "fp32",
            "num_threads": 1,
            "backbone_dropout": 0,  # twins are exact with dropout off (issue 15)
        },
        # two prompt lengths: members of one pack are padded to the longer
        "space": {"method.prompt_length": {"grid": [2, 6]}},
        "search": {"num_samples": 4, "sampler": "grid", "scheduler": {"type": "none"}},
    }
    alone = search(tmp_path, "alone", {"cpus_per_worker": 1}, **sections)
    # 1/K of a CPU per member: two packs of K fit two cores, so four trials run at once
    packed = search(tmp_path, "packed", {"cpus_per_worker": 1, "trials_per_worker": K}, **sections)

    assert_twins(alone, packed)
    # grouped by prompt length (fullest-first seating would have put lengths 2 and 6 in one
    # pack): no member was ever padded
    for _, run in by_config(packed).values():
        assert run.data.metrics["pack_padding_waste"] == 0


def test_asha_stops_members_and_the_next_configurations_take_their_slots(tmp_path):
    """The first configuration learns (head_lr 0.05), the five after it barely move: once the
    first has reported at the rung, ASHA (keeping the best quarter) stops each of them there.
    Their slots take the next configurations until all six have trained. The best one is then
    repeated with another seed (search.repeat_best), in a pack too. The search and ASHA both
    rank by validation loss: the learning configuration's is clearly the lowest (accuracy on
    48 examples ties, and dropout in a pack lets a barely moving trial win a tie)."""
    cwd = search(
        tmp_path,
        "asha",
        {"cpus_per_worker": K, "trials_per_worker": K},
        train={"max_steps": 12, "eval_every": 4, "num_threads": 1, "warmup_ratio": 0.0},
        # grid points run first, in file order (sampler random); one value of the others
        space={
            "method.lr_prompt": {"grid": [0.3]},
            "method.prompt_length": {"grid": [4]},
            "train.head_lr": {"grid": [0.05, 1e-6, 2e-6, 3e-6, 4e-6, 5e-6]},
        },
        search={
            "num_samples": 6,
            "sampler": "random",
            "metric": "loss",
            "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 4},
            "repeat_best": {"top_k": 1, "seeds": 1},
        },
    )
    client, parent, runs = parent_and_kids(cwd)
    assert parent.info.status == "FINISHED"
    (repeat,) = [k for k in runs if k.data.tags["raypeft.role"] == "repeat"]
    assert repeat.info.status == "FINISHED" and repeat.data.tags["raypeft.pack_id"]
    assert repeat.data.params["train.head_lr"] == "0.05"  # the best configuration, again
    kids = [k for k in runs if k.data.tags["raypeft.role"] == "trial"]
    assert len(kids) == 6 and all(k.info.status == "FINISHED" for k in kids)
    assert len({k.data.params["train.head_lr"] for k in kids}) == 6  # every configuration
    stopped = [k for k in kids if k.data.tags["raypeft.stopped_early"] == "true"]
    assert len(stopped) >= 3
    members: dict[str, set[str]] = {}
    for kid in kids:
        sizes = [m.value for m in client.get_metric_history(kid.info.run_id, "pack_size")]
        assert sizes and max(sizes) <= K  # a pack never holds more than K
        pack = kid.data.tags["raypeft.pack_id"]
        members.setdefault(pack, set()).add(kid.data.tags["raypeft.trial_id"])
    # freed slots were taken by later trials: a pack trained more configurations than K
    assert max(len(m) for m in members.values()) > K
    trials = study(cwd).trials
    assert len(trials) == 6
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
