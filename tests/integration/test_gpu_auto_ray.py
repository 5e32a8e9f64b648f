"""``resources.use_gpu: auto`` on a real Ray (issue 40, item 3): the shipped dept.yaml asks Ray
for GPUs where Ray declares one, and for none on a CPU-only Ray; ``raypeft validate`` says what
it will do.

This machine has no GPU: one is declared to Ray (``ray.init(num_gpus=1)``, as
``ray start --num-gpus=1`` would). The probe's first task then runs on that declared GPU, finds
no CUDA (torch sees none), and the search falls back to the recorded table's rule; with a probe
cached for the GPU type Ray reports (``accelerator_type:H100``, declared too) the cache decides
and nothing is probed. Nothing trains on the declared GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from click.testing import CliRunner

from raypeft.cli.main import main
from raypeft.config.loading import load_experiment
from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.backbones import backbone_dims, load_config
from raypeft.search.gpu_plan import packs_allowed
from raypeft.search.gpu_probe import Measured, ProbeResult, probe_key, remember
from raypeft.search.resources import trial_request
from raypeft.search.run import SearchOptions, _resolve_resources

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEPT = REPO / "search_spaces" / "dept.yaml"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYPEFT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _resolve(cfg, uri):
    lines = []
    resolved = _resolve_resources(cfg, uri, SearchOptions(printer=lines.append))
    return resolved, lines


def test_a_declared_gpu_gets_the_trials(tmp_path, cache_dir):
    cfg = load_experiment(DEPT)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    ray.init(
        address="local",
        num_cpus=8,
        num_gpus=1,
        resources={"accelerator_type:H100": 1},
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        # the probe's task finds no CUDA under the declared GPU: the rule decides (MiniLM: 8)
        resolved, lines = _resolve(cfg, uri)
        assert trial_request(resolved) == {"CPU": 1.0, "GPU": 0.125}
        assert resolved.resources.use_gpu is True
        # the probe is announced (it takes minutes on a real GPU), then what was decided
        assert lines[0].startswith("resources: use_gpu auto → probing the H100: 1, 2, 4, 8 trials")
        assert len(lines) == 2  # no measurement: none to report
        assert lines[1].startswith("resources: use_gpu auto → 1 GPU seen by Ray on this machine")
        assert "8 trials per GPU (gpus_per_worker: 0.125)" in lines[1]
        assert (
            "no probe: torch sees no CUDA GPU where Ray declares one: rule from the H200"
            in (lines[1])
        )
        assert not (cache_dir / "gpu_probe.json").exists()
        # a probe cached for this backbone, method, shape and GPU type decides, unprobed
        dims = _dims(cfg)
        key = probe_key(cfg, "H100", 8, packs_allowed(cfg, dims))
        measured = [Measured("share", 1, 900, 300), Measured("share", 2, 1700, 300),
                    Measured("share", 4, 1750, 300), Measured("pack", 4, 3000, 700)]  # fmt: skip
        remember(key, ProbeResult("NVIDIA H100 80GB HBM3", 81559, measured))
        resolved, lines = _resolve(cfg, uri)
        assert trial_request(resolved) == {"CPU": 0.25, "GPU": 0.25}  # packs of 4 on one GPU
        assert resolved.resources.trials_per_worker == 4
        assert len(lines) == 1  # cached: nothing probed, nothing announced
        assert "packs of 4 trials per GPU (trials_per_worker: 4)" in lines[0]
        assert "probe on NVIDIA H100 80GB HBM3, cached in" in lines[0]
    finally:
        ray.shutdown()


def test_a_cpu_only_ray_keeps_the_trials_on_the_cpu(tmp_path, cache_dir):
    cfg = load_experiment(DEPT)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        resolved, lines = _resolve(cfg, f"sqlite:///{tmp_path}/mlflow.db")
    finally:
        ray.shutdown()
    assert trial_request(resolved) == {"CPU": 1.0, "GPU": 0.0}
    assert resolved.resources.use_gpu is False
    assert lines == ["resources: use_gpu auto → no GPU on this machine: the CPU"]
    assert not cache_dir.exists()  # nothing probed


def test_explicit_use_gpu_is_not_resolved(tmp_path):
    data = load_experiment(DEPT).model_dump(mode="json")
    for value in (True, False):
        data["resources"]["use_gpu"] = value
        cfg = ExperimentConfig.model_validate(data)
        resolved, lines = _resolve(cfg, f"sqlite:///{tmp_path}/mlflow.db")
        assert resolved is cfg and lines == []  # no Ray started, nothing said


def test_validate_says_what_auto_will_do():
    here = CliRunner().invoke(main, ["validate", str(DEPT)])
    assert here.exit_code == 0, here.output
    assert "  resources: use_gpu auto → no GPU on this machine: the CPU" in here.output
    cluster = CliRunner().invoke(main, ["validate", str(DEPT), "--address", "10.0.0.1:6379"])
    assert cluster.exit_code == 0, cluster.output
    assert "decided at the start of the search from the GPUs Ray sees on the cluster" in (
        cluster.output
    )
    off = CliRunner().invoke(main, ["validate", str(DEPT), "--set", "resources.use_gpu=false"])
    assert off.exit_code == 0 and "use_gpu auto" not in off.output


def _dims(cfg):
    config = load_config(cfg.model, 2, "single_label_classification")
    return backbone_dims(config, cfg.model.max_length, cfg.model.name)
