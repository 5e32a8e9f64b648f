"""What the step benchmarks share (:mod:`~benchmarks.device.gpu_step`,
:mod:`~benchmarks.device.packing`, :mod:`~benchmarks.device.pack_dispatch`): the backbones
(configs written out, random weights: nothing downloaded) and methods they step, one
:class:`Setting`, the model and a random batch built from it, a pack of K members on one
frozen backbone, and the timed span of steps.

It imports only torch, transformers, pydantic and raypeft's training core (no Ray, MLflow,
Optuna or datasets), so it runs on a GPU machine that has none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

from benchmarks.common.devices import peak_mib
from benchmarks.common.training import Trainee, training_step
from raypeft.config.schema import ExperimentConfig
from raypeft.modeling.backbones import HEAD_MODULE_NAMES, Backbone, backbone_dims, backbone_kind
from raypeft.modeling.packed import PackedBackbone, shared_copy
from raypeft.modeling.precision import backbone_dtype, cast_frozen
from raypeft.modeling.prompted import PromptedModel
from raypeft.training import step_timing
from raypeft.training.pack_step import Learner

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
    "prefix-kv": {"name": "prefix", "style": "kv", "prompt_length": 10},
    "idpg": {"name": "idpg"},
    "ipt": {"name": "ipt", "strategy": "random", "placement": "input", "prompt_length": 16},
}
TINY_METHODS: dict[str, dict] = {
    "pt": {"name": "pt", "prompt_length": 4},
    "dept": {"name": "dept", "prompt_length": 2, "rank": 2},
    "prefix": {"name": "prefix", "prompt_length": 2},
    "prefix-kv": {"name": "prefix", "style": "kv", "prompt_length": 2},
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


def build_pack(setting: Setting, k: int, device: torch.device) -> tuple[PackedBackbone, list]:
    """One frozen backbone (random weights, in the precision's layout) and K members on it,
    each with its own modules, head, method tensors and optimizer, as trials have them."""
    cfg = experiment(setting)
    base = build_backbone(setting.backbone, setting.seq_len, device)
    cast_frozen(base.model, backbone_dtype(setting.precision, device))
    learners = []
    for index in range(k):
        model = shared_copy(base.model)  # new modules over the same frozen tensors
        head = [p for p in model.parameters() if p.requires_grad]
        torch.manual_seed(cfg.train.seed + index)
        member = PromptedModel(Backbone(model, base.dims, head), cfg.method).to(device)
        member.precision = setting.precision
        member.train()
        learners.append(Learner.of(member, cfg, device))
    pack = PackedBackbone(shared_copy(base.model), base.dims.kind, setting.precision)
    del base  # the pack and the members hold the frozen tensors
    for learner in learners:
        pack.check_member(learner.model)
    return pack, learners


def say_flushed(*args) -> None:
    """Print at once: rows appear as they are measured, also when redirected."""
    print(*args, flush=True)
