"""benchmarks.search.peer_search's translation of a raypeft search file into the Hugging Face way:
the same space (through the space entries' own ``suggest``), the same pruning schedule."""

from __future__ import annotations

from pathlib import Path

import optuna

from benchmarks.search import peer_search
from raypeft.config.loading import load_experiment

PT = Path(__file__).resolve().parents[2] / "search_spaces" / "pt.yaml"


def test_the_peer_samples_pt_yaml_s_space_under_its_own_names():
    cfg = load_experiment(PT)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        params = peer_search.peer_space(cfg, study.ask())
        low, high = cfg.space["method.lr"].candidates()
        assert low <= params["learning_rate"] <= high
        assert params["num_virtual_tokens"] in cfg.space["method.prompt_length"].listed()
        assert peer_search.INIT[params["init"]] in {"SAMPLE_VOCAB", "RANDOM", "TEXT"}


def test_the_peer_prunes_on_the_search_file_s_asha_schedule():
    cfg = load_experiment(PT)
    sched = cfg.search.scheduler
    assert peer_search.pruner_settings(cfg) == {
        "min_resource": sched.grace_period * cfg.train.eval_every,  # pt.yaml: 1 x 40 steps
        "reduction_factor": 3,
    }
    # The pruner asked as the Trainer asks it: a report at the first rung, then should_prune.
    # With the schema's float factor Optuna's rung indexing raised TypeError here.
    study = optuna.create_study(direction="maximize", pruner=peer_search.peer_pruner(cfg))
    pruned = []
    for accuracy in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4):
        trial = study.ask()
        trial.report(accuracy, step=cfg.train.eval_every)
        pruned.append(trial.should_prune())
        study.tell(trial, accuracy)
    assert pruned[0] is False and pruned[-1] is True  # the worst is stopped at the first rung


def test_a_fractional_reduction_factor_is_refused_by_name():
    import pytest

    cfg = load_experiment(PT)
    cfg.search.scheduler.reduction_factor = 2.5
    with pytest.raises(SystemExit, match="search.scheduler.reduction_factor"):
        peer_search.pruner_settings(cfg)


def test_unknown_variants_are_refused():
    import pytest

    with pytest.raises(SystemExit):
        peer_search.parse_args(["--variants", "raypeft,nope"])
