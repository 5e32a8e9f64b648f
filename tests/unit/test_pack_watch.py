"""A pack server watching its members' trials, on a local Ray (raypeft.search.packs): a member
whose trial cannot be checked, time after time, fails with the reason, and the reason is the
Tune trial's error. The search's own registry and pack server, the tiny BERT and the synthetic
task of tests/unit/test_pack_host.py."""

from __future__ import annotations

import pytest
import ray
from ray import tune

from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.backbones import backbone_dims, load_config
from raypeft.search import packs
from raypeft.search.packs import Place, Seat, backbone_group, open_packs
from raypeft.training.pack import MemberSpec
from tests.unit.test_pack_host import experiment, task  # noqa: F401 - task: the fixture


def unanswerable_actor():
    """Stands for a trial's Tune actor whose every ping fails with an error: not a dead actor
    (that trial is gone, and its member leaves quietly), one that cannot be checked at all.
    Made here, so that it travels by value: Ray's workers cannot import a test module."""

    @ray.remote
    def refuse():
        raise RuntimeError("this trial's actor cannot be asked")

    class Ping:
        def remote(self):
            return refuse.remote()

    class Unanswerable:
        __ray_ready__ = Ping()  # what the pack server's watcher calls

    return Unanswerable()


def relaying(seat: Seat):
    """A Tune function trainable that relays the seat's reports, as a packed trial does."""

    def trainable(config: dict) -> None:
        seat.relay(lambda: {})

    return trainable


@pytest.mark.slow
def test_a_member_whose_trial_cannot_be_checked_fails_the_trial_with_the_reason(
    task,  # noqa: F811 - the fixture imported above
    local_ray,
    tmp_path,
):
    """The member trains on (it never reports: one evaluation, far away) while its trial's
    actor cannot be pinged; after WATCH_TRIES failed checks in a row the server fails it,
    and the Tune trial relaying its reports errors with why, not silence."""
    data = experiment(2, max_steps=100_000, eval_every=100_000).model_dump(mode="json")
    cfg = ExperimentConfig.model_validate({**data, "resources": {"trials_per_worker": 2}})
    config = load_config(cfg.model, 2, "single_label_classification")
    dims = backbone_dims(config, cfg.model.max_length, cfg.model.name)
    with open_packs(cfg, ray.put(task), dims) as registry:
        place = Place(backbone_group(cfg), ray.get_runtime_context().get_node_id())
        pack_id, server = ray.get(registry.assign.remote("t1", place, "stand-in", cfg.method))
        spec = MemberSpec("t1", cfg)
        identity = ray.get(server.join.remote(spec, unanswerable_actor(), "stand-in"))
        tuner = tune.Tuner(
            relaying(Seat(registry, server, pack_id, "t1", identity)),
            run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
        )
        grid = tuner.fit()
    (error,) = grid.errors
    text = str(error)
    assert f"pack {pack_id} lost track of trial t1" in text
    assert f"failed {packs.WATCH_TRIES} times in a row" in text
    assert "(RuntimeError: this trial's actor cannot be asked)" in text
