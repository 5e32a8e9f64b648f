"""The Model Registry (raypeft.tracking.registry) on a real MLflow store (temp sqlite): every
search adds a version; the champion alias moves only to a better one on the same metric, per
``tracking.champion_policy``; ``models:/`` URIs are read back with one-line errors.
"""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from raypeft.config.schema import TrackingConfig
from raypeft.errors import ConfigError
from raypeft.tracking.registry import (
    Candidate,
    beats,
    parse_model_uri,
    register,
    source_run_id,
)
from raypeft.tracking.tags import METRIC_TAG, PARAMS_TAG, SEARCH_TAG


@pytest.fixture
def client(tmp_path):
    return MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")


@pytest.fixture
def make_candidate(client):
    """Factory: a logged model of a new run in experiment ``exp``, as a registry candidate."""
    experiment_id = client.create_experiment("exp")

    def make(value: float, metric: str = "accuracy", mode: str = "max", search: str = "s"):
        run = client.create_run(experiment_id)
        model = client.create_logged_model(
            experiment_id, name="pyfunc", source_run_id=run.info.run_id
        )
        return Candidate(
            model_id=model.model_id,
            run_id=run.info.run_id,
            trial_id=f"t{value}",
            search_run_id=search,
            experiment="exp",
            metric=metric,
            mode=mode,
            value=value,
            method="dept",
            trainable_params=320,
            task="tweet_sentiment",
            backbone="minilm",
            test_value=value - 0.01,
        )

    return make


@pytest.mark.slow
def test_versions_accumulate_and_the_alias_moves_only_to_a_better_one(client, make_candidate):
    first = register(client, "exp", make_candidate(0.60, search="s1"))
    assert (first.version, first.alias_moved, first.previous) == ("1", True, None)
    assert "the first champion" in first.line()
    worse = register(client, "exp", make_candidate(0.55, search="s2"))
    assert (worse.version, worse.alias_moved, worse.previous) == ("2", False, "1")
    assert "0.5500 does not beat 0.6000 of version 1" in worse.reason
    same = register(client, "exp", make_candidate(0.60, search="s3"))  # a tie is not better
    assert not same.alias_moved
    better = register(client, "exp", make_candidate(0.65, search="s4"))
    assert better.alias_moved and better.previous == "1"
    assert "alias 'champion' -> version 4" in better.line()
    assert str(client.get_model_version_by_alias("exp", "champion").version) == "4"
    versions = client.search_model_versions("name = 'exp'")
    assert sorted(int(v.version) for v in versions) == [1, 2, 3, 4]
    v2 = client.get_model_version("exp", "2")
    assert v2.tags[SEARCH_TAG] == "s2" and v2.tags[METRIC_TAG] == "accuracy"
    assert v2.tags[PARAMS_TAG] == "320" and v2.tags["raypeft.method"] == "dept"
    assert "validation accuracy 0.5500" in v2.description
    # the version points at the logged model's artefacts; the model lists its versions
    v4 = client.get_model_version("exp", "4")
    experiment_id = client.get_experiment_by_name("exp").experiment_id
    model = next(
        m for m in client.search_logged_models([experiment_id]) if m.source_run_id == v4.run_id
    )
    assert v4.source == model.artifact_location
    assert json.loads(model.tags["mlflow.modelVersions"]) == [{"name": "exp", "version": "4"}]


def test_a_champion_chosen_on_another_metric_is_not_comparable(client, make_candidate):
    register(client, "exp", make_candidate(0.30, metric="loss", mode="min"))
    result = register(client, "exp", make_candidate(0.99))
    assert not result.alias_moved
    assert "chosen on validation loss (min)" in result.reason and "not comparable" in result.reason
    # min metrics: lower is better
    register(client, "lossy", make_candidate(0.30, metric="loss", mode="min"))
    assert register(client, "lossy", make_candidate(0.20, metric="loss", mode="min")).alias_moved


def test_alias_policies(client, make_candidate):
    register(client, "exp", make_candidate(0.60))
    forced = register(client, "exp", make_candidate(0.10), policy="always")
    assert forced.alias_moved and "always" in forced.reason
    kept = register(client, "exp", make_candidate(0.99), policy="never")
    assert not kept.alias_moved and kept.previous == "2"
    none = register(client, "other", make_candidate(0.5), alias=None)
    assert none.alias is None and not client.get_registered_model("other").aliases
    custom = register(client, "other", make_candidate(0.6), alias="prod")
    assert (
        custom.alias_moved
        and str(client.get_model_version_by_alias("other", "prod").version) == "2"
    )
    with pytest.raises(ValueError, match="policy must be one of"):
        register(client, "exp", make_candidate(0.5), policy="sometimes")


def test_a_champion_set_by_hand_is_never_displaced(client, make_candidate):
    register(client, "exp", make_candidate(0.60), alias=None)
    client.set_model_version_tag("exp", "1", METRIC_TAG, "accuracy")
    client.delete_model_version_tag("exp", "1", "raypeft.metric_value")
    client.set_registered_model_alias("exp", "champion", "1")
    result = register(client, "exp", make_candidate(0.99))
    assert not result.alias_moved and "records no raypeft metric" in result.reason


def test_beats_compares_only_the_same_metric_and_mode(client, make_candidate):
    register(client, "exp", make_candidate(0.5))
    champion = client.get_model_version_by_alias("exp", "champion")
    assert beats(make_candidate(0.6), champion)[0]
    assert not beats(make_candidate(0.6, mode="min"), champion)[0]


def test_model_uris(client, make_candidate):
    assert parse_model_uri("models:/exp@champion") == ("exp", None, "champion")
    assert parse_model_uri("models:/exp/3") == ("exp", "3", None)
    assert parse_model_uri("models:/m-abc") == ("m-abc", None, None)
    for bad in ("exp@champion", "runs:/abc/model", "models:/"):
        with pytest.raises(ConfigError, match="expected models:/NAME@ALIAS"):
            parse_model_uri(bad)
    candidate = make_candidate(0.5)
    register(client, "exp", candidate)
    assert source_run_id(client, "models:/exp@champion") == candidate.run_id
    assert source_run_id(client, "models:/exp/1") == candidate.run_id
    assert source_run_id(client, f"models:/{candidate.model_id}") == candidate.run_id
    with pytest.raises(ConfigError, match="models:/exp@prod: not in the model registry"):
        source_run_id(client, "models:/exp@prod")
    with pytest.raises(ConfigError, match="models:/nope/1: not in the model registry"):
        source_run_id(client, "models:/nope/1")


def test_registry_config_keys():
    assert TrackingConfig().registered_model_name("dept-tweets") == "dept-tweets"
    assert TrackingConfig().registered_model_name("/Users/me/my exp") == "Users-me-my-exp"
    assert TrackingConfig(register_model="prod-sentiment").registered_model_name("x") == (
        "prod-sentiment"
    )
    assert TrackingConfig(register_model=False).registered_model_name("x") is None
    for bad in ("a/b", "a@b", " "):
        with pytest.raises(ValueError, match="registered model name must be non-empty"):
            TrackingConfig(register_model=bad)
    with pytest.raises(ValueError):
        TrackingConfig(champion_policy="sometimes")
