"""What one training step of each prompt method costs on a frozen backbone at real shapes, in
each precision, and what K trials sharing one device get done together.

Backbones are built from their configs (written out below: MiniLM-L6-H384, RoBERTa-base,
T5-base, RoBERTa-large) with random weights, so nothing is downloaded: a step's time and
memory do not depend on the weights' values. Inputs are random token ids (no tokenizer) of
the full length ``--seq-len``; IDPG's sentence encodings, computed once per task before any
trial, are random vectors of the backbone's width.

Each step is the training loop's own step: raypeft's model (frozen backbone in the precision's
layout, :mod:`raypeft.modeling.precision`), forward under autocast, loss, backward, gradient
clipping and AdamW (:func:`raypeft.training.optimizer.optimizer_step`, with fp16's loss
scaler). Two tables, every ratio measured in this one run:

1. per backbone, method and precision: step time, samples/s, peak memory (CUDA: the most
   memory allocated during the steps; CPU: not measured in-process, "-"), and the speed
   against fp32 of the same method;
2. K trials sharing one device (``--share``): K separate processes, as Ray runs K trials of
   ``gpus_per_worker: 1/K`` (each its own model and CUDA context), start together and step
   concurrently; their total samples/s against K=1 measured the same way, and each process's
   peak memory (CUDA: allocated; CPU: peak resident set). On a CPU each process gets
   ``threads // K`` threads, as Ray would give each trial its share of the cores.

It imports only torch, transformers, pydantic and raypeft's training core (no Ray, MLflow,
Optuna or datasets), so it runs on a GPU machine that has none of them.

    python -m benchmarks.gpu_step                       # everything, on the GPU if any
    python -m benchmarks.gpu_step --backbones minilm --seq-len 64 --share 1,2
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

from benchmarks.common.devices import (
    device_line,
    peak_mib,
    pick_device,
)
from benchmarks.common.processes import measure_together, together
from benchmarks.common.tables import markdown_table, right_aligned_after
from benchmarks.common.training import Trainee, training_step
from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.backbones import HEAD_MODULE_NAMES, Backbone, backbone_dims, backbone_kind
from raypeft.modeling.precision import backbone_dtype, cast_frozen, resolve_precision
from raypeft.modeling.prompted import PromptedModel
from raypeft.training import step_timing

# Hugging Face configs of the backbones (the fields that set their shapes); MiniLM's is the
# packaged all-MiniLM-L6-v2's config.json. "tiny" is for the benchmark's own test.
BACKBONES: dict[str, dict] = {
    "minilm": dict(
        model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6,
        num_attention_heads=12, intermediate_size=1536, hidden_act="gelu",
        max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12, pad_token_id=0,
    ),
    "roberta-base": dict(
        model_type="roberta", vocab_size=50265, hidden_size=768, num_hidden_layers=12,
        num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
        max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
        bos_token_id=0, eos_token_id=2,
    ),
    "t5-base": dict(
        model_type="t5", vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12,
        num_decoder_layers=12, num_heads=12, relative_attention_num_buckets=32,
        feed_forward_proj="relu", tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0,
    ),
    "roberta-large": dict(
        model_type="roberta", vocab_size=50265, hidden_size=1024, num_hidden_layers=24,
        num_attention_heads=16, intermediate_size=4096, hidden_act="gelu",
        max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1,
        bos_token_id=0, eos_token_id=2,
    ),
    "tiny": dict(
        model_type="bert", vocab_size=1000, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512, pad_token_id=0,
    ),
}  # fmt: skip
REAL_BACKBONES = ["minilm", "roberta-base", "t5-base", "roberta-large"]

# Each method at the size its paper trains (PT l=100; DePT m=60 at PT-100's budget; prefix
# t=10 per layer; IDPG's M-IDPG-PHM defaults; IPT's table on the first 16 tokens).
METHODS: dict[str, dict] = {
    "pt": {"name": "pt", "prompt_length": 100},
    "dept": {"name": "dept", "prompt_length": 60, "budget_prompt_length": 100},
    "prefix": {"name": "prefix", "style": "hidden", "prompt_length": 10},
    "idpg": {"name": "idpg"},
    "ipt": {"name": "ipt", "strategy": "random", "placement": "input", "prompt_length": 16},
}
TINY_METHODS: dict[str, dict] = {
    "pt": {"name": "pt", "prompt_length": 4},
    "dept": {"name": "dept", "prompt_length": 2, "rank": 2},
    "prefix": {"name": "prefix", "prompt_length": 2},
    "idpg": {"name": "idpg", "prompt_length": 2, "generator_hidden": 4, "generator": "dnn"},
    "ipt": {"name": "ipt", "strategy": "random", "prompt_length": 4},
}


@dataclass(frozen=True)
class Setting:
    """What one measurement trains: backbone, method and precision, and the step's shape."""

    backbone: str
    method: str
    precision: str  # resolved: fp32, bf16 or fp16
    batch_size: int
    seq_len: int
    steps: int
    warmup: int
    tiny: bool = False

    def method_config(self) -> dict:
        return (TINY_METHODS if self.tiny else METHODS)[self.method]


# ----------------------------------------------------------------------------- model


def build_backbone(name: str, seq_len: int, device: torch.device) -> Backbone:
    """A frozen backbone from its config with random weights (built on ``device``), its
    classification head (if any) trainable, as :func:`raypeft.modeling.backbones.load_backbone`
    leaves a loaded one."""
    spec = dict(BACKBONES[name])
    model_type = spec.pop("model_type")
    config = AutoConfig.for_model(model_type, **spec)
    kind = backbone_kind(config)
    if kind != "seq2seq":
        config.num_labels = 2
    auto = AutoModelForSeq2SeqLM if kind == "seq2seq" else AutoModelForSequenceClassification
    torch.manual_seed(0)
    with device:  # initialise on the device: seconds, not a minute, for RoBERTa-large
        model = auto.from_config(config)
    model.requires_grad_(False)
    model.eval()  # as load_backbone leaves it (PromptedModel.train() runs its dropout)
    head = []
    if kind != "seq2seq":  # T5's labels are text: no head trains
        for param_name, param in model.named_parameters():
            if any(part in HEAD_MODULE_NAMES for part in param_name.split(".")):
                param.requires_grad_(True)
                head.append(param)
    return Backbone(model=model, dims=backbone_dims(config, seq_len), head_params=head)


def experiment(setting: Setting) -> ExperimentConfig:
    """The experiment a trial of ``setting`` would read (the optimizer reads its settings)."""
    steps = setting.warmup + setting.steps
    return ExperimentConfig.model_validate(
        {
            "name": "gpu-step",
            "model": {"name": setting.backbone, "max_length": setting.seq_len},
            "method": setting.method_config(),
            "train": {"batch_size": setting.batch_size, "max_steps": steps, "eval_every": steps},
        }
    )


def build(setting: Setting, device: torch.device) -> tuple[PromptedModel, ExperimentConfig]:
    """The model a trial of ``setting`` trains, laid out as raypeft.modeling.build does it."""
    cfg = experiment(setting)
    backbone = build_backbone(setting.backbone, setting.seq_len, device)
    cast_frozen(backbone.model, backbone_dtype(setting.precision, device))
    torch.manual_seed(cfg.train.seed)
    model = PromptedModel(backbone, cfg.method).to(device)
    model.precision = setting.precision
    return model, cfg


def random_batch(model: PromptedModel, setting: Setting, device: torch.device) -> dict:
    """A full-length batch of random token ids, labels and the method's per-example features
    (:func:`raypeft.training.step_timing.random_batch`, which the search's GPU probe uses)."""
    return step_timing.random_batch(model, setting.batch_size, setting.seq_len, device)


# ----------------------------------------------------------------------------- timing


def time_steps(setting: Setting, device: torch.device, barrier=None) -> dict:
    """Build the model, step ``warmup`` times, then time ``steps`` steps. With a ``barrier``
    (a process among K), wait for the others before timing, so all step concurrently."""
    model, cfg = build(setting, device)
    batch = random_batch(model, setting, device)
    trainee = Trainee.of(model, cfg, device)
    model.train()
    for _ in range(setting.warmup):
        training_step(trainee, batch)
    return timed_span(lambda: training_step(trainee, batch), setting, device, barrier) | {
        "samples": setting.steps * setting.batch_size,
        "params": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }


def timed_span(step, setting: Setting, device: torch.device, barrier=None) -> dict:
    """Time ``setting.steps`` calls of ``step`` (after the others at ``barrier``, if any):
    the median step, the span's start and end, and the peak memory during it
    (:func:`raypeft.training.step_timing.time_steps`; on a CPU this process's peak RSS)."""
    wait = barrier.wait if barrier is not None else None
    timed = step_timing.time_steps(step, setting.steps, device, wait)
    if device.type != "cuda":
        timed["peak_mib"] = peak_mib(device)
    return timed


# ----------------------------------------------------------------------------- K trials


def _share_worker(setting: Setting, device: str, threads: int, barrier, results) -> None:
    """One of K trials sharing the device: its own process, model and (CUDA) context."""
    torch.set_num_threads(threads)
    results.put(time_steps(setting, torch.device(device), barrier))


def shared_run(setting: Setting, device: torch.device, k: int, threads: int) -> dict:
    """K processes stepping ``setting`` together: total samples/s over the span from the
    first start to the last end, each process's step time and peak memory."""
    per = max(1, threads // k)  # each trial its share of the cores, as Ray gives it
    got = measure_together(_share_worker, [(setting, str(device), per)] * k)
    return together(got) | {"peak_mib": max((r["peak_mib"] or 0) for r in got) or None}


# ----------------------------------------------------------------------------- tables


def applicable(setting: Setting, device: torch.device) -> str | None:
    """Why ``setting``'s method cannot run on its backbone (None when it can)."""
    backbone = BACKBONES[setting.backbone]
    spec = {k: v for k, v in backbone.items() if k != "model_type"}
    config = AutoConfig.for_model(backbone["model_type"], **spec)
    dims = backbone_dims(config, setting.seq_len)
    method = experiment(setting).method
    try:
        method.resolve(dims).check_backbone(dims)
    except ValueError as exc:
        return str(exc).splitlines()[0]
    return None


def mib_cell(value: float | None) -> str:
    """Memory in MiB, or "-" where it was not measured."""
    return "-" if value is None else f"{value:,.0f}"


STEP_HEADER = (
    "backbone", "method", "precision", "trainable", "step ms", "samples/s", "vs fp32", "peak MiB",
)  # fmt: skip
SHARE_HEADER = (
    "backbone", "method", "precision", "K", "step ms (each)", "total samples/s", "vs K=1",
    "peak MiB (each)",
)  # fmt: skip


def step_table(settings: list[Setting], device: torch.device, say) -> list[dict]:
    """Table 1: one row per setting, each measured in this process (a progress line as each
    is measured, the table at the end)."""
    rows, cells, fp32 = [], [], {}
    for setting in settings:
        names = [setting.backbone, setting.method, setting.precision]
        why = applicable(setting, device)
        if why:
            cells.append([*names, f"n/a: {why}", "", "", "", ""])
            continue
        r = time_steps(setting, device)
        speed = setting.batch_size / r["step_s"]
        key = (setting.backbone, setting.method)
        if setting.precision == "fp32":
            fp32[key] = speed
        ratio = f"{speed / fp32[key]:.2f}×" if key in fp32 else "-"
        peak = r["peak_mib"] if device.type == "cuda" else None  # CPU: RSS of the whole run
        step_ms = f"{1000 * r['step_s']:.1f}"
        cells.append([*names, f"{r['params']:,}", step_ms, f"{speed:.1f}", ratio, mib_cell(peak)])
        say(f"  measured {' '.join(names)}: {step_ms} ms a step")
        rows.append({**setting.__dict__, **r, "samples_per_s": speed})
    say(markdown_table(STEP_HEADER, cells, right_aligned_after(3, len(STEP_HEADER))))
    return rows


def share_table(
    settings: list[Setting], device: torch.device, ks: list[int], threads: int, say
) -> list[dict]:
    """Table 2: K processes sharing the device, against K=1 measured the same way."""
    rows, cells = [], []
    for setting in settings:
        if applicable(setting, device):
            continue
        single = None
        for k in ks:
            r = shared_run(setting, device, k, threads)
            single = single or (r["samples_per_s"] if k == 1 else None)
            ratio = f"{r['samples_per_s'] / single:.2f}×" if single else "-"
            names = [setting.backbone, setting.method, setting.precision, str(k)]
            speed = f"{r['samples_per_s']:.1f}"
            cells.append(
                [*names, f"{1000 * r['step_s']:.1f}", speed, ratio, mib_cell(r["peak_mib"])]
            )
            say(f"  measured {' '.join(names[:3])} K={k}: {speed} samples/s in all")
            rows.append({**setting.__dict__, "k": k, **r})
    say(markdown_table(SHARE_HEADER, cells, right_aligned_after(3, len(SHARE_HEADER))))
    return rows


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbones", default=",".join(REAL_BACKBONES))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--precisions", default=None, help="default: fp32,bf16 (+fp16 on CUDA)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128, help="input tokens (prompts come on top)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--share", default="1,2,4", help="K values for table 2; empty: skip it")
    p.add_argument("--share-precisions", default=None, help="default: as --precisions")
    p.add_argument("--share-methods", default=None, help="default: as --methods")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all)")
    p.add_argument("--tables", default="steps,share", help="which tables: steps, share or both")
    p.add_argument("--tiny", action="store_true", help="tiny backbone and methods (tests)")
    return p.parse_args(argv)


def settings_for(args, methods: str, precisions: list[str]) -> list[Setting]:
    """Every backbone × method × precision asked for, in that order."""
    backbones = ["tiny"] if args.tiny else args.backbones.split(",")
    return [
        Setting(b, m, p, args.batch_size, args.seq_len, args.steps, args.warmup, args.tiny)
        for b in backbones
        for m in methods.split(",")
        for p in precisions
    ]


def say_flushed(*args) -> None:
    """Print at once: rows appear as they are measured, also when redirected."""
    print(*args, flush=True)


def main(argv: list[str] | None = None, say=say_flushed) -> dict:
    """Run the tables asked for; return what they measured."""
    args = parse_args(argv)
    device = pick_device(args.device)
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    default = "fp32,bf16,fp16" if device.type == "cuda" else "fp32,bf16"
    precisions = [resolve_precision(p, device) for p in (args.precisions or default).split(",")]
    say(f"Device: {device_line(device, threads)}")
    say(
        f"Batch {args.batch_size} × {args.seq_len} tokens (+ prompts), median of {args.steps} "
        f"steps after {args.warmup}\n"
    )
    tables = args.tables.split(",")
    steps, shared = [], []
    if "steps" in tables:
        steps = step_table(settings_for(args, args.methods, precisions), device, say)
    if args.share and "share" in tables:
        say("\nK trials sharing the device: K processes stepping together\n")
        share_p = (args.share_precisions or ",".join(precisions)).split(",")
        ks = [int(k) for k in args.share.split(",")]
        methods = args.share_methods or args.methods
        share_settings = settings_for(
            args, methods, [resolve_precision(p, device) for p in share_p]
        )
        shared = share_table(share_settings, device, ks, threads, say)
    return {"device": device_line(device, threads), "steps": steps, "shared": shared}


if __name__ == "__main__":
    main()
