"""The model stage: ``model.name`` resolves without waiting on the Hub, its config and
tokenizer load, and what the methods need of it (shapes, position-embedding rows) is known."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PretrainedConfig

from raypeft.config.environment import env_flag
from raypeft.config.schema import ModelConfig
from raypeft.data.tasks import TaskSpec
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.modeling.backbones import (
    TINY_CONFIGS,
    absolute_positions,
    backbone_dims,
    load_config,
    load_tokenizer,
)
from raypeft.modeling.head_pooling import resolve_head_pooling

_ALIASES_HINT = "minilm, tiny-bert, tiny-t5, tiny-gpt2, tiny-llama"


@dataclass(frozen=True)
class CheckedModel:
    """The backbone as the method checks see it."""

    config: PretrainedConfig  # with the task's label settings
    dims: BackboneDims
    max_positions: int | None  # rows of absolute position embeddings (None: no such limit)


def check_model(model: ModelConfig, spec: TaskSpec) -> CheckedModel:
    """The model stage: the name resolves offline, the config and the tokenizer load."""
    check_model_name(model)  # a missing folder or uncached id fails here, not on the Hub
    config = load_config(model, spec.num_labels or 2, spec.problem)
    _check_tokenizer(model)
    dims = backbone_dims(config, model.max_length, model.name)
    resolve_head_pooling(model.head_pooling, dims)  # mean on a decoder or seq2seq model fails
    return CheckedModel(config, dims, absolute_positions(config))


def check_model_name(model: ModelConfig) -> None:
    """``model.name`` is an alias, a local model folder, or a Hugging Face id that can be
    loaded: with ``HF_HUB_OFFLINE`` set it must be in the local cache. Raises ConfigError
    before ``from_pretrained`` would try (and, offline or without a network, wait on) the Hub."""
    name = model.name
    if name in TINY_CONFIGS or name == "minilm":
        return
    must = (
        "it must be a local model folder (with config.json), a Hugging Face model id "
        f"(name or org/name) or an alias ({_ALIASES_HINT})"
    )
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model.name: {name}: no config.json in this folder; {must}")
        return
    # why: huggingface_hub only to check a Hub id offline
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if name.startswith(("/", "./", "../", "~", ".\\")):
            raise HFValidationError("a path")
        validate_repo_id(name)
    except HFValidationError:
        raise ConfigError(f"model.name: {name}: no such folder; {must}") from None
    if env_flag("HF_HUB_OFFLINE") or env_flag("TRANSFORMERS_OFFLINE"):
        # why: huggingface_hub only to check a Hub id offline
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json", revision=model.revision)
        if not isinstance(cached, str):
            raise ConfigError(
                f"model.name: {name!r} is neither a local folder nor in the Hugging Face cache, "
                f"and HF_HUB_OFFLINE is set; {must} (download it first, or go online)"
            )


def _check_tokenizer(model: ModelConfig) -> None:
    """The tokenizer loads (cached: the search reuses it when it tokenises the task)."""
    try:
        load_tokenizer(model.name, model.revision)
    except (OSError, ValueError) as exc:  # missing tokenizer files, an unknown tokenizer class
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"model.name: {model.name}: cannot load its tokenizer ({first[:200]}); the model "
            "must come with its tokenizer files"
        ) from None


def check_positions(prompt_tokens: int, model: ModelConfig, checked: CheckedModel) -> None:
    """Prompt tokens prepended to an input of ``max_length`` tokens must fit the backbone's
    absolute position embeddings; otherwise every trial would fail in its first step.
    Raises ``ValueError`` (the caller names the setting)."""
    limit = checked.max_positions
    if limit and model.max_length + prompt_tokens > limit:
        raise ValueError(
            f"`model.max_length + prompt_length <= {limit}` must hold ({model.name} has {limit} "
            f"positions), but got {model.max_length} + {prompt_tokens} = "
            f"{model.max_length + prompt_tokens}"
        )
