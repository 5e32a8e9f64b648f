"""The backbone cache: a trial whose backbone comes from the cache is the trial a fresh process
trains, metric for metric; cached backbones stay pristine; keys and eviction.

Real torch on tiny models (and the packaged MiniLM, a real checkpoint whose head is drawn from
the seed). A fresh process is a real subprocess running the same :func:`trial_outcome`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raypeft.config.schema import ExperimentConfig, ModelConfig
from raypeft.data import prepare_task
from raypeft.modeling import cache
from raypeft.modeling.backbones import load_backbone
from raypeft.modeling.build import build_model
from raypeft.modeling.prompted import TRAINABLE_FILE
from raypeft.training.loop import train
from raypeft.training.result_keys import PHASE_PREFIX

# Reported values that measure time or memory, not what was learnt.
_TIMING_SUFFIXES = ("_per_s", "_mb", "_s")

# A fresh process: import this file by path and train one trial there.
_FRESH_PROCESS = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("cache_case", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print("OUTCOME " + json.dumps(module.trial_outcome(json.loads(sys.argv[2])), sort_keys=True))
"""


def experiment(spec: dict) -> ExperimentConfig:
    """A short trial: ``spec`` names the model, the method (a dict) and the seed."""
    length = 32 if spec["model"] == "minilm" else 16
    return ExperimentConfig.model_validate(
        {
            "name": "cache",
            "model": {"name": spec["model"], "max_length": length},
            "task": {"max_train_examples": 32, "max_eval_examples": 16, "max_test_examples": 16},
            "method": spec["method"],
            "train": {
                "max_steps": 6,
                "eval_every": 3,
                "batch_size": 8,
                "eval_batch_size": 16,
                "seed": spec.get("seed", 0),
                "precision": spec.get("precision", "auto"),
            },
        }
    )


def trial_outcome(spec: dict) -> dict:
    """Train one trial of ``spec`` with one thread; what it learnt, as JSON-ready values: every
    report's metrics (timings left out) and a digest of the checkpoint's tensors."""
    torch.set_num_threads(1)  # the same reduction order in every process
    cfg = experiment(spec)
    task = prepare_task(cfg.task, cfg.model)
    history = []

    def report(metrics: dict, folder: Path | None) -> None:
        kept = learnt(metrics)
        if folder is not None:
            kept["checkpoint_sha256"] = hashlib.sha256(
                (folder / TRAINABLE_FILE).read_bytes()
            ).hexdigest()
        history.append(kept)

    best = learnt(train(cfg, task, report))
    return json.loads(json.dumps({"history": history, "best": best}, sort_keys=True))


def learnt(metrics: dict) -> dict:
    """``metrics`` without the values that measure time or memory (a phase's seconds too)."""
    return {
        k: v
        for k, v in metrics.items()
        if not k.endswith(_TIMING_SUFFIXES) and not k.startswith(PHASE_PREFIX)
    }


def fresh_process_outcome(spec: dict) -> dict:
    """:func:`trial_outcome` in a new Python process (nothing cached)."""
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, __file__, json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("OUTCOME "))
    return json.loads(line[len("OUTCOME ") :])


def entry_snapshot() -> dict[str, torch.Tensor]:
    """Copies of every tensor of the most recently used cache entry."""
    entry = cache._ENTRIES[cache.cached_keys()[-1]]
    return {k: v.detach().clone() for k, v in entry.model.state_dict().items()}


def hooks_on(model: torch.nn.Module) -> int:
    """Forward (pre-)hooks registered anywhere in ``model``."""
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


PT = {"name": "pt", "prompt_length": 4, "lr": 0.05}
DEPT = {
    "name": "dept",
    "prompt_length": 4,
    "budget_prompt_length": 6,
    "lr_prompt": 0.05,
    "lr_lowrank": 0.01,
}
PREFIX_HIDDEN = {"name": "prefix", "style": "hidden", "prompt_length": 3, "lr": 0.01}
PREFIX_KV = {"name": "prefix", "style": "kv", "prompt_length": 3, "lr": 0.01}
IDPG_MULTI = {
    "name": "idpg",
    "layers": "multi",
    "version": "M",
    "prompt_length": 3,
    "generator_hidden": 8,
    "phm_n": 4,
    "lr": 0.02,
}
IPT_DEEP = {"name": "ipt", "prompt_length": 4, "placement": "deep", "lr": 0.05}

CASES = {
    # encoder: layer hooks of deep prompts must not outlive trial A
    "tiny-bert prefix then PT": ("tiny-bert", PREFIX_HIDDEN, PT, 0),
    # a real checkpoint, same seed: the cached head; IDPG's sentence encoder and layer hooks
    "minilm DePT then IDPG": ("minilm", DEPT, IDPG_MULTI, 0),
    # a real checkpoint, another seed: the head drawn again as from_pretrained draws it
    "minilm PT then DePT, seed 1": ("minilm", PT, DEPT, 1),
    "tiny-t5 PT then DePT": ("tiny-t5", PT, DEPT, 0),  # in fp32 (the others: auto)
    "tiny-gpt2 key/value prefix then deep IPT": ("tiny-gpt2", PREFIX_KV, IPT_DEEP, 0),
    "tiny-llama IDPG then PT": ("tiny-llama", IDPG_MULTI, PT, 0),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow
def test_a_cached_trial_is_the_fresh_process_trial(case):
    """Trial B after trial A in one process (B's backbone from the cache) equals B in a fresh
    process, metric for metric and tensor for tensor; the cached backbone stays pristine."""
    model, method_a, method_b, seed_b = CASES[case]
    precision = "fp32" if model == "tiny-t5" else "auto"
    trial_a = {"model": model, "method": method_a, "seed": 0, "precision": precision}
    trial_b = {"model": model, "method": method_b, "seed": seed_b, "precision": precision}
    cache.clear_backbone_cache()
    trial_outcome(trial_a)
    loaded, pristine = cache.loads(), entry_snapshot()
    cached = trial_outcome(trial_b)
    assert cache.loads() == loaded, "trial B read the backbone again"
    if seed_b == 0:
        after = entry_snapshot()
        assert after.keys() == pristine.keys()
        assert all(torch.equal(after[k], v) for k, v in pristine.items())
    for entry in cache._ENTRIES.values():
        assert hooks_on(entry.model) == 0
        assert cache._pristine(entry)
    assert cached == fresh_process_outcome(trial_b)


def test_bf16_and_fp32_trials_are_cached_apart():
    """fp32 and bf16 trials of one model on one device are keyed by the frozen weights' dtype
    (float32 for both on a CPU, :func:`raypeft.modeling.precision.backbone_dtype`)."""
    cache.clear_backbone_cache()
    cfg = experiment({"model": "tiny-bert", "method": PT})
    task = _labels(2)
    build_model(cfg, task, precision="fp32")
    model = build_model(cfg, task, precision="bf16")
    assert model.precision == "bf16"
    frozen = [p for p in model.backbone.parameters() if not p.requires_grad]
    dtypes = {key.dtype for key in cache.cached_keys()}
    assert dtypes == {str(frozen[0].dtype).removeprefix("torch.")}
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


class _Spec:
    def __init__(self, problem: str):
        self.problem = problem


class _Labels:
    """What build_model reads of a task."""

    def __init__(self, num_labels: int, problem: str = "classification"):
        self.spec = _Spec(problem)
        self.num_labels = num_labels
        self.verbalizers = None


def _labels(num_labels: int, problem: str = "classification") -> _Labels:
    return _Labels(num_labels, problem)


def _cfg(name: str = "tiny-bert", seed: int = 0, max_length: int = 16, method=PT):
    return experiment({"model": name, "method": method, "seed": seed}).model_copy(
        update={"model": ModelConfig(name=name, max_length=max_length)}
    )


def test_key_holds_what_determines_the_module():
    """Same model, head, dtype, device and seed: one load; max_length is no part of the key,
    the head's shape and the seed of a tiny model are."""
    cache.clear_backbone_cache()
    before = cache.loads()
    first = build_model(_cfg(), _labels(2))
    again = build_model(_cfg(max_length=24, method=DEPT), _labels(2))
    assert cache.loads() == before + 1
    assert again.dims.max_length == 24 and first.dims.max_length == 16
    build_model(_cfg(), _labels(3))  # another head shape
    build_model(_cfg(seed=1), _labels(2))  # tiny: every weight drawn from the seed
    assert cache.loads() == before + 3
    assert len(cache.cached_keys()) == cache.MAX_ENTRIES == 2


def test_least_recently_used_entry_goes_first():
    cache.clear_backbone_cache()
    build_model(_cfg(seed=0), _labels(2))
    build_model(_cfg(seed=1), _labels(2))
    build_model(_cfg(seed=0), _labels(2))  # touch seed 0: seed 1 is now the oldest
    build_model(_cfg(seed=2), _labels(2))
    assert [k.seed for k in cache.cached_keys()] == [0, 2]
    before = cache.loads()
    build_model(_cfg(seed=0), _labels(2))
    assert cache.loads() == before


def test_copies_share_frozen_weights_not_heads_or_hooks():
    """Two live models of one key: frozen storage shared, heads their own; a method's layer
    hooks live on its own copy only."""
    cache.clear_backbone_cache()
    a = build_model(_cfg(method=PREFIX_HIDDEN), _labels(2))
    b = build_model(_cfg(), _labels(2))
    frozen_a = dict(a.backbone.named_parameters())
    for name, p in b.backbone.named_parameters():
        assert p is not frozen_a[name] and torch.equal(p, frozen_a[name])
        assert (p.data_ptr() == frozen_a[name].data_ptr()) != p.requires_grad
    with torch.no_grad():
        for p in b.param_groups()["head"]:
            p.add_(1.0)
    heads = zip(a.param_groups()["head"], b.param_groups()["head"], strict=True)
    assert all(not torch.equal(p, q) for p, q in heads)
    assert hooks_on(a.backbone) > 0 and hooks_on(b.backbone) == 0


def test_moving_a_copy_leaves_the_cache_and_other_copies_alone():
    """``.to()`` on one model (here a dtype, as a device move would) replaces its own tensors:
    another live model and the cached entry keep theirs, and the next build reads nothing."""
    cache.clear_backbone_cache()
    a = build_model(_cfg(), _labels(2))
    b = build_model(_cfg(), _labels(2))
    a.to(torch.float64)
    assert all(p.dtype == torch.float32 for p in b.parameters())
    before = cache.loads()
    c = build_model(_cfg(), _labels(2))
    assert cache.loads() == before
    assert all(p.dtype == torch.float32 for p in c.parameters())


def test_a_backbone_changed_in_place_is_loaded_again():
    """Someone writing into a shared frozen tensor: the next build reads the checkpoint again
    and gets the original weights."""
    cache.clear_backbone_cache()
    model = build_model(_cfg(), _labels(2))
    original = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    with torch.no_grad():
        model.backbone.get_input_embeddings().weight.mul_(2.0)
    before = cache.loads()
    again = build_model(_cfg(), _labels(2))
    assert cache.loads() == before + 1
    state = again.backbone.state_dict()
    assert all(torch.equal(state[k], v) for k, v in original.items())


def test_another_seed_draws_the_head_a_fresh_load_draws():
    """A checkpoint's entry serves another seed: the head and the RNG after it equal those of
    a fresh load with that seed (transformers' initialisation replayed)."""
    cache.clear_backbone_cache()
    model_cfg = ModelConfig(name="minilm", max_length=32)
    cache.cached_backbone(model_cfg, 3, "classification", seed=0)
    before = cache.loads()
    cached = cache.cached_backbone(model_cfg, 3, "classification", seed=5)
    rng_cached = torch.get_rng_state()
    assert cache.loads() == before
    fresh = load_backbone(model_cfg, 3, "classification", seed=5)
    assert torch.equal(torch.get_rng_state(), rng_cached)
    fresh_state = fresh.model.state_dict()
    assert all(torch.equal(v, fresh_state[k]) for k, v in cached.model.state_dict().items())
    assert cached.seeded == fresh.seeded and cached.seeded  # MiniLM's checkpoint has no head
