"""``resources.use_gpu: auto`` (issue 40, item 3): the choice of K from probe measurements, the
rule from the recorded H200 table, the probe cache, and the resolution on given nodes. The
real-Ray resolution (a declared GPU, a CPU-only Ray) is tests/integration/test_gpu_auto_ray.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from raypeft.config.loading import load_experiment
from raypeft.config.schema import ExperimentConfig
from raypeft.errors import ConfigError
from raypeft.search.gpu_plan import plan_resources
from raypeft.search.gpu_probe import (
    RECORDED_SHARING,
    Measured,
    ProbeResult,
    cached,
    choose,
    probe_key,
    remember,
    rule_choice,
)
from raypeft.search.resources import trial_request
from raypeft.training.probe import probe_alone, probe_pack

REPO = Path(__file__).resolve().parents[2]
DEPT = REPO / "search_spaces" / "dept.yaml"
H100 = 81_559.0  # MiB


def share(k, speed, peak=400.0):
    return Measured("share", k, speed, peak)


def test_choose_takes_the_smallest_k_within_ten_percent_of_the_best():
    measured = [share(1, 1000), share(2, 1900), share(4, 2600), share(8, 2700)]
    got = choose(measured, H100)
    assert (got.mode, got.k) == ("share", 4)  # 2600 >= 0.9 × 2700
    assert "2,600 samples/s at K=4 vs 1,000 at K=1" in got.why


def test_choose_leaves_out_what_does_not_fit_the_memory_with_headroom():
    # 8 processes × (9,000 + 500 context) MiB > 90 % of 80 GiB; 4 × 9,500 fits
    measured = [share(1, 100, 9000), share(2, 180, 9000), share(4, 250, 9000), share(8, 400, 9000)]
    assert choose(measured, H100).k == 4
    measured.append(Measured("share", 16, error="out of memory"))
    assert choose(measured, H100).k == 4


def test_a_pack_wins_only_by_its_margin():
    shares = [share(1, 1000), share(2, 1800), share(4, 2000)]
    close = choose([*shares, Measured("pack", 4, 2100, 900)], H100)
    # 2100 < 1.1 × 2000 (the fastest sharing): separate trials, K=2 (1800 >= 0.9 × 2000)
    assert (close.mode, close.k) == ("share", 2)
    far = choose([*shares, Measured("pack", 4, 2300, 900), Measured("pack", 8, 2400, 1500)], H100)
    assert (far.mode, far.k) == ("pack", 4) and far.why.startswith("a pack of 4")


def test_nothing_fits_means_one_trial_per_gpu():
    got = choose([Measured("share", 1, error="out of memory")], H100)
    assert (got.mode, got.k) == ("share", 1)


def test_the_rule_reads_the_recorded_table():
    # minilm's row: 8 (5,605 vs 5,576 at 16: the smallest within 10 % of the best)
    assert rule_choice(384, 6, "encoder", 16).k == 8
    assert rule_choice(768, 12, "encoder", 16).k == 4  # roberta-base: 1,884 >= 0.9 × 1,976
    assert rule_choice(1024, 24, "encoder", 16).k == 2  # roberta-large: flat after 2
    assert rule_choice(768, 12, "seq2seq", 16).k == 8  # t5-base's own row
    assert rule_choice(384, 6, "encoder", 2).k == 2  # the CPUs beside the GPU hold two trials
    assert "gpu_share_h200.txt" in rule_choice(384, 6, "encoder", 8).why


def test_the_recorded_table_is_the_measured_file():
    text = (REPO / "benchmarks" / "results" / "gpu_share_h200.txt").read_text()
    rows = re.findall(r"measured (\S+) pt bf16 K=(\d+): ([\d.]+) samples/s", text)
    measured = {(name, int(k)): float(v) for name, k, v in rows}
    for name, row in RECORDED_SHARING.items():
        for k, speed in row["samples_per_s"].items():
            assert measured[(name, k)] == speed


def test_the_cache_round_trips_and_is_keyed_by_gpu_and_shape(tmp_path):
    cfg = load_experiment(DEPT)
    key = probe_key(cfg, "H100", 8, packs=True)
    assert probe_key(cfg, "A10G", 8, packs=True) != key
    longer = cfg.model_copy(update={"model": cfg.model.model_copy(update={"max_length": 128})})
    assert probe_key(longer, "H100", 8, packs=True) != key
    path = tmp_path / "gpu_probe.json"
    assert cached(key, path) is None
    result = ProbeResult("NVIDIA H100 80GB HBM3", H100, [share(1, 900), share(2, 1700)])
    remember(key, result, path)
    remember(probe_key(cfg, "A10G", 4, packs=False), result, path)  # a second entry
    assert cached(key, path) == result
    path.write_text("{not json")
    assert cached(key, path) is None  # a damaged cache is no cache


# ----------------------------------------------------------------------------- resolution

GPU_NODE = [{"CPU": 16.0, "GPU": 1.0, "accelerator_type:H100": 1.0}]
CPU_NODES = [{"CPU": 8.0}, {"CPU": 8.0, "GPU": 0.0}]


def _never(*_, **__):
    raise AssertionError("no probe was expected")


def test_no_gpu_resolves_to_the_cpu_and_fp16_is_refused_there():
    cfg = load_experiment(DEPT)
    plan = plan_resources(cfg, CPU_NODES, where="the cluster at x", probe=_never)
    assert plan.cfg.resources.use_gpu is False and trial_request(plan.cfg) == {"CPU": 1, "GPU": 0}
    assert plan.line == "resources: use_gpu auto → no GPU on the cluster at x: the CPU"
    fp16 = ExperimentConfig.model_validate(
        {**cfg.model_dump(mode="json"), "train": {**cfg.train.model_dump(), "precision": "fp16"}}
    )
    with pytest.raises(ConfigError, match=r"^train.precision: fp16 needs a GPU, and resources"):
        plan_resources(fp16, CPU_NODES, probe=_never)


def test_a_probe_decides_and_is_cached(tmp_path):
    cfg = load_experiment(DEPT)
    calls = []

    def probe(config, ks, packs, say):
        calls.append((ks, packs))
        measured = [share(k, 1000 * k**0.5) for k in ks]
        say(f"  GPU probe: {measured[-1].describe()}")
        return ProbeResult("NVIDIA H100 80GB HBM3", H100, measured)

    cache, lines = tmp_path / "gpu_probe.json", []
    plan = plan_resources(
        cfg, GPU_NODE, where="this machine", probe=probe, cache=cache, say=lines.append
    )
    assert calls == [([1, 2, 4, 8], True)]  # DePT packs on MiniLM: packs probed too
    # a probe takes minutes before the first trial: the user is told it runs, and what it finds
    assert lines == [
        "resources: use_gpu auto → probing the H100: 1, 2, 4, 8 trials sharing it, then packs "
        f"of 2, 4, 8 (at most 300 s; once: cached in {cache})",
        "  GPU probe: 8 sharing the GPU: 2,828 samples/s, peak 400 MiB each",
    ]
    assert trial_request(plan.cfg) == {"CPU": 1.0, "GPU": 0.125}
    assert plan.cfg.resources.use_gpu is True and plan.cfg.resources.gpus == 0.125
    assert "1 GPU seen by Ray on this machine; 8 trials per GPU" in plan.line
    assert "probe on NVIDIA H100 80GB HBM3" in plan.line
    again = plan_resources(
        cfg, GPU_NODE, where="this machine", probe=_never, cache=cache, say=lines.append
    )
    assert len(lines) == 2  # a cached probe runs nothing and says so in the plan's line
    assert again.cfg == plan.cfg and f"cached in {cache}" in again.line


def test_a_failed_probe_falls_back_to_the_rule(tmp_path):
    cfg = load_experiment(DEPT)
    node = [{"CPU": 4.0, "GPU": 1.0}]  # 4 CPUs beside the GPU: at most 4 trials of 1 CPU
    plan = plan_resources(cfg, node, probe=lambda *_, **__: "no CUDA", cache=tmp_path / "c.json")
    assert plan.cfg.resources.gpus == 0.25
    assert "no probe: no CUDA: rule from the H200" in plan.line
    assert not (tmp_path / "c.json").exists()  # nothing measured, nothing cached


def test_explicit_settings_keep_their_meaning():
    cfg = load_experiment(DEPT)
    data = cfg.model_dump(mode="json")

    def with_resources(**res):
        return ExperimentConfig.model_validate({**data, "resources": {**data["resources"], **res}})

    for explicit in (with_resources(use_gpu=True), with_resources(use_gpu=False)):
        plan = plan_resources(explicit, GPU_NODE, probe=_never)
        assert plan.cfg is explicit and plan.line is None
    # auto beside a sharing the file sets: auto only decides GPU or CPU
    given = with_resources(use_gpu="auto", gpus_per_worker=0.5)
    plan = plan_resources(given, GPU_NODE, probe=_never)
    assert plan.cfg.resources.gpus == 0.5
    assert plan.line.endswith("2 trials per GPU (gpus_per_worker: 0.5) as set")
    assert plan_resources(given, CPU_NODES, probe=_never).cfg.resources.gpus == 0
    packed = plan_resources(with_resources(trials_per_worker=4), GPU_NODE, probe=_never)
    assert trial_request(packed.cfg) == {"CPU": 0.25, "GPU": 0.25}


# ----------------------------------------------------------------------------- the probe's steps


def test_the_probe_steps_a_trial_and_a_pack_on_a_tiny_model():
    """The probe's code on a CPU (what the GPU tasks run): real steps, real spans."""
    cfg = ExperimentConfig.model_validate(
        {
            "name": "probe",
            "model": {"name": "tiny-bert", "max_length": 16},
            "method": {"name": "dept", "prompt_length": 4, "rank": 2},
            "train": {"batch_size": 4},
        }
    )
    alone = probe_alone(cfg, torch.device("cpu"), steps=2)
    assert alone["samples"] == 8 and alone["end"] > alone["start"] and alone["step_s"] > 0
    assert alone["peak_mib"] is None and alone["gpu_name"] is None  # measured on CUDA only
    pack = probe_pack(cfg, 3, torch.device("cpu"), steps=2)
    assert pack["samples"] == 3 * 2 * 4 and pack["end"] > pack["start"]
