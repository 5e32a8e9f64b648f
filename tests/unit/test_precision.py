"""train.precision: how it resolves, what computes in it, and what stays float32."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import yaml

from raypeft.config.loading import validate_experiment
from raypeft.config.schema import ExperimentConfig, ModelConfig, TrainConfig
from raypeft.data.tasks import TaskSpec
from raypeft.data.tokenize import TokenizedTask
from raypeft.errors import ConfigError
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling import precision as precision_mod
from raypeft.modeling.precision import (
    autocast,
    backbone_dtype,
    cast_frozen,
    compute_dtype,
    resolve_precision,
)
from raypeft.training.checkpoints import CONFIG_FILE, load_checkpoint
from raypeft.training.loop import train
from raypeft.training.optimizer import loss_scaler, optimizer_step
from raypeft.training.result_keys import PRECISION_KEY


@pytest.fixture
def cpu_with(monkeypatch):
    """Pretend the CPU reports exactly the given /proc/cpuinfo flags."""

    def set_flags(*flags: str) -> None:
        monkeypatch.setattr(precision_mod, "cpu_flags", lambda: frozenset(flags))

    return set_flags


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("avx2", "amx_tile", "amx_bf16"), "bf16"),
        # measured here both faster (0.71x) and slower (1.46x) than fp32: not counted on
        (("avx2", "avx512f", "avx512_bf16"), "fp32"),
        (("avx2", "avx512f"), "fp32"),  # bf16 would be emulated: slower than fp32
        ((), "fp32"),  # no /proc/cpuinfo: nothing detected, nothing assumed
    ],
)
def test_auto_picks_bf16_only_on_a_cpu_with_amx(cpu_with, flags, expected):
    cpu_with(*flags)
    assert resolve_precision("auto", "cpu") == expected


def test_explicit_precisions_are_kept_or_refused(cpu_with):
    cpu_with()
    assert resolve_precision("fp32", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"  # asked for: runs, if slowly
    with pytest.raises(ConfigError, match=r"^train.precision: fp16 needs a CUDA GPU"):
        resolve_precision("fp16", "cpu")
    # evaluating elsewhere a model trained in fp16 falls back to what auto picks
    assert resolve_precision("fp16", "cpu", strict=False) == "fp32"
    with pytest.raises(ConfigError, match="train.precision: must be one of"):
        resolve_precision("fp8", "cpu")


def test_frozen_weights_dtype_and_compute_dtype():
    assert backbone_dtype("bf16", "cpu") == torch.float32  # autocast does the bf16 products
    assert backbone_dtype("bf16", "cuda") == torch.bfloat16
    assert backbone_dtype("fp16", "cuda") == torch.float16
    assert backbone_dtype("fp32", "cuda") == torch.float32
    assert compute_dtype("bf16") == torch.bfloat16
    with pytest.raises(ValueError, match="resolved precision"):
        compute_dtype("auto")


def test_autocast_runs_products_in_the_precision():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast("fp32", "cpu"):
        assert (a @ b).dtype == torch.float32
    with autocast("bf16", torch.device("cpu")):
        assert (a @ b).dtype == torch.bfloat16


def test_cast_frozen_leaves_trainable_parameters_and_buffers_alone():
    module = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    module[0].requires_grad_(False)
    cast_frozen(module, torch.bfloat16)
    assert module[0].weight.dtype == torch.bfloat16
    assert module[1].weight.dtype == torch.float32  # it trains
    assert module[1].running_mean.dtype == torch.float32  # a buffer


def test_a_loss_scaler_skips_an_overflowing_step_and_holds_the_schedule():
    param = torch.nn.Parameter(torch.ones(3))
    model = torch.nn.ParameterList([param])
    optimizer = torch.optim.AdamW([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = loss_scaler("fp16", torch.device("cpu"))
    assert scaler.is_enabled() and not loss_scaler("bf16", torch.device("cpu")).is_enabled()
    assert not optimizer_step(
        (param * float("inf")).sum(), model, optimizer, scheduler, 1.0, scaler
    )
    assert torch.equal(param.detach(), torch.ones(3)) and scheduler.last_epoch == 0
    assert optimizer_step(param.sum(), model, optimizer, scheduler, 1.0, scaler)
    assert not torch.equal(param.detach(), torch.ones(3)) and scheduler.last_epoch == 1


def _task() -> TokenizedTask:
    rng = np.random.default_rng(0)

    def split(n: int) -> dict[str, np.ndarray]:
        labels = rng.integers(0, 2, n)
        ids = rng.integers(1000, 5000, (n, 12))
        ids[:, 0], ids[:, 1] = 101, np.where(labels == 1, 3000, 2000)
        ones = np.ones((n, 12), np.int64)
        return {
            "input_ids": ids,
            "attention_mask": ones,
            "token_type_ids": 0 * ones,
            "labels": labels,
        }

    spec = TaskSpec("synthetic", "text", num_labels=2, metrics=("accuracy",))
    splits = {"train": split(32), "validation": split(16), "test": split(16)}
    return TokenizedTask(spec=spec, label_names=None, splits=splits)


def _experiment(precision: str) -> ExperimentConfig:
    return ExperimentConfig(
        name="unit",
        model=ModelConfig(name="tiny-bert", max_length=12),
        method=PromptTuningConfig(prompt_length=4, lr=0.05),
        train=TrainConfig(max_steps=6, eval_every=3, batch_size=8, precision=precision),
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loop_reports_the_precision_it_resolved(precision):
    calls = []
    train(_experiment(precision), _task(), lambda metrics, folder: calls.append(metrics))
    assert [m[PRECISION_KEY] for m in calls] == [precision, precision]
    assert all(np.isfinite(m["train_loss"]) for m in calls)


@pytest.mark.parametrize("flags", [("avx512_bf16",), ("amx_tile", "amx_bf16")])
def test_a_checkpoint_keeps_the_precision_auto_resolved_to(tmp_path, cpu_with, flags):
    """`auto` is resolved once, where the trial trains; its checkpoint records the result, so
    a machine (or a day) that would resolve `auto` otherwise evaluates it as it trained."""
    cpu_with(*flags)
    trained_in = resolve_precision("auto", "cpu")
    best = tmp_path / "best"

    def keep(metrics, folder):
        if folder is not None:
            shutil.rmtree(best, ignore_errors=True)
            shutil.copytree(folder, best)

    train(_experiment("auto"), _task(), keep)
    assert yaml.safe_load((best / CONFIG_FILE).read_text())["train"]["precision"] == trained_in
    cpu_with("avx512_bf16" if trained_in == "bf16" else "amx_bf16")  # auto now says otherwise
    cfg, model = load_checkpoint(best, _task())
    assert cfg.train.precision == model.precision == trained_in
    assert not model.training  # ready to evaluate, as from_pretrained returns models


def test_the_loop_refuses_fp16_on_a_cpu():
    # a configuration for GPU trials whose trial landed on a CPU (validation refuses fp16
    # without a GPU request, so the config is copied past it)
    cfg = _experiment("fp32")
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"precision": "fp16"})})
    with pytest.raises(ConfigError, match="train.precision: fp16 needs a CUDA GPU"):
        train(cfg, _task(), lambda metrics, folder: None)


def test_precision_defaults_to_auto():
    assert TrainConfig().precision == "auto"


def test_validation_refuses_fp16_for_cpu_trials():
    base = {"name": "x", "method": {"name": "pt"}, "train": {"precision": "fp16"}}
    cpu = {**base, "resources": {"use_gpu": False}}
    with pytest.raises(ConfigError, match=r"^x.yaml: train.precision: fp16 needs a GPU"):
        validate_experiment(cpu, "x.yaml")
    assert validate_experiment({**base, "resources": {"use_gpu": True}}, "x.yaml")
    # use_gpu: auto (the default) may find a GPU: the search refuses fp16 where it finds none
    # (tests/unit/test_gpu_auto.py)
    assert validate_experiment(base, "x.yaml")
