"""What every prompt method provides, and the registry methods add themselves to.

A method is one module: a pydantic config (its knobs, learning rates, closed-form count and
budget options), an ``nn.Module`` that turns a batch into the backbone's keyword inputs, and
optional hooks (a peft export, figure hints for the report). Shared code looks methods up by
name in :data:`METHODS` (in registration order, the order listings use); it never branches on
a method's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from raypeft.config.method_configs import MethodConfigBase, config_name, register_method_config
from raypeft.methods.fusing import FusedBatch, FusedInputs

# The key under which a method's inputs hold its key/value prefix (a DynamicCache). The model
# hands it to the backbone under the argument name the installed transformers declares
# (raypeft.modeling.backbones.backbone_arguments): ``cache`` from 5.24, this name before.
PREFIX_CACHE = "past_key_values"

BackboneKind = Literal["encoder", "seq2seq", "decoder"]


@dataclass(frozen=True)
class BackboneDims:
    """The backbone facts a method needs: hidden size ``d``, layers ``N``, vocab ``V``, ``s``.

    ``kind`` says where prompts go: ``encoder`` (BERT/RoBERTa, classification head),
    ``seq2seq`` (T5: prompts on the encoder input, labels as text) or ``decoder``
    (GPT-2/LLaMA, classification head on the last token). ``num_layers`` counts the layers
    prompts can enter (a seq2seq model's encoder layers). ``kv_size`` is the width of one
    layer's keys (``heads_kv · head_dim``; smaller than ``d`` with grouped-query attention).
    """

    hidden_size: int
    num_layers: int
    vocab_size: int
    max_length: int
    kind: BackboneKind = "encoder"
    num_heads: int = 1
    kv_heads: int | None = None
    model_name: str | None = None  # model.name: keys caches tied to the backbone (IPT tables)
    # whose tokenizer gives the ids: model.name, or the model it borrows its tokenizer from
    # (the tiny test models borrow MiniLM's); keys IPT's pretrained tables
    tokenizer_name: str | None = None
    # how the backbone pools token states into a sentence vector when it is a sentence encoder
    # that says so (sentence-transformers' pooling config): first, mean, last; None otherwise
    sentence_pooling: str | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_size(self) -> int:
        return (self.kv_heads or self.num_heads) * self.head_dim


class BackboneAccess(Protocol):
    """The frozen backbone, for work a method does beside its module (IDPG's sentence
    encodings, IPT's pretrained table).

    :mod:`raypeft.modeling` provides it: methods sit below modeling and load no backbone
    themselves. ``modeling.backbones.Backbone`` (loaded) and ``FrozenBackbone`` (each part
    loaded on first use, for the driver) both are one.
    """

    @property
    def dims(self) -> BackboneDims: ...

    @property
    def model(self) -> nn.Module:
        """The frozen Hugging Face model."""

    def tokenizer(self) -> Any:
        """The backbone's tokenizer (a transformers ``PreTrainedTokenizerBase``)."""


class MethodConfig(MethodConfigBase):
    """Base of every method's config. Subclasses set ``name: Literal["..."]``.

    ``budget_params`` (a trainable-parameter budget, task head excluded) makes the method
    derive its size knob in :meth:`resolve`: the largest setting whose count fits the budget
    (PT's ``l``, DePT's ``r``, deep prompts' ``t``, IDPG's generator width, IPT's encoder
    width). :meth:`budget_options` lists the settings that fit, for ``raypeft budget``.

    Optional hooks: :meth:`peft_type` (with :meth:`PromptMethod.peft_adapter`) for
    ``raypeft export``; :attr:`figure_hints` for the report's learning-rate heat map and its
    size-vs-rank figure.
    """

    # raypeft export: what the method exports as, as messages put it after the method's name
    # (e.g. "(PROMPT_TUNING)"); None: peft has no equivalent
    peft_export_note: ClassVar[str | None] = None
    # the report's method figures: which knobs they read (None: the method has none)
    figure_hints: ClassVar[FigureHints | None] = None

    @classmethod
    def examples(cls) -> dict[str, MethodConfig]:
        """Small valid configs, one per variant of the method, by name. The method contract
        tests (tests/contract) run every one on every backbone kind it supports."""
        return {"default": cls()}

    def resolve(self, dims: BackboneDims) -> MethodConfig:
        """Return a copy with derived knobs filled in (e.g. DePT's rank from its budget)."""
        return self

    def learning_rates(self) -> dict[str, float]:
        """Learning rate of each named parameter group of the method."""
        raise NotImplementedError

    def num_params(self, dims: BackboneDims) -> int:
        """Closed-form trainable-parameter count (a function beside the method's config)."""
        raise NotImplementedError

    def derived(self) -> dict[str, Any]:
        """Knobs computed by :meth:`resolve` rather than chosen (logged as params)."""
        return {}

    def feature_specs(self) -> dict[str, FeatureSpec]:
        """Per-example inputs computed once per experiment, before any trial (by name)."""
        return {}

    def check_backbone(self, dims: BackboneDims) -> None:
        """Raise ``ValueError`` (one line) if the method cannot run on this backbone."""

    def pack_limitation(self, kind: BackboneKind) -> str | None:
        """Why this config cannot train in a pack on a ``kind`` backbone (several trials in one
        forward pass: :mod:`raypeft.modeling.packed`), or None when it can. A method packs when
        all it does to the backbone goes through :meth:`PromptMethod.prepare_inputs` (its
        keyword inputs: ``inputs_embeds``, ``attention_mask``, ``token_type_ids``,
        ``past_key_values``) and :meth:`PromptMethod.layer_prompt`: every built-in method
        does. A method that changes the backbone otherwise (hooks or weights of its own) says
        why here."""
        return None

    def prompt_positions(self) -> int:
        """Positions this (resolved) config prepends to every input: its prompt tokens, 0 if
        it prepends none (e.g. keys and values only). Before anything starts, preflight checks
        that they fit the backbone's absolute position embeddings with ``model.max_length``."""
        return 0

    def prefix_length(self) -> int:
        """Key/value slots this (resolved) config prepends in every attention layer (deep
        prompts' ``kv`` style), 0 if it prepends none. A pack pads its members' prefixes to the
        longest, so its registry seats configurations of one length together."""
        return 0

    def check_inputs(self) -> None:
        """Cheap checks of what the method reads before trials start (e.g. IPT's pretraining
        corpus exists), run by ``raypeft validate`` and ``tune`` for every setting the space
        can produce. Raise ``ValueError`` or :class:`~raypeft.errors.ConfigError` (one line)."""

    def budget_options(self, budget: int, dims: BackboneDims) -> list[BudgetOption]:
        """Settings of this method's size knob whose count fits ``budget`` (others as in self).

        :meth:`resolve` with ``budget_params=budget`` picks the option that matches the
        config's fixed knobs (e.g. DePT's ``m``) with the largest size knob.
        """
        raise NotImplementedError

    def budget_length(self) -> int | None:
        """The budget this config sets as a PT prompt length ``l`` (``l·d`` parameters), if
        it sets it that way (``raypeft budget --space`` reads it); None otherwise."""
        return None

    def budget_options_at(
        self, budget: int, dims: BackboneDims, prompt_lengths: list[int]
    ) -> list[BudgetOption] | None:
        """``raypeft budget -m``: the options for exactly these prompt lengths, or None when
        the method's options are not chosen by prompt length (then -m leaves it alone)."""
        return None

    def peft_type(self) -> str:
        """The Hugging Face peft type this config is an exact equivalent of (e.g.
        ``PROMPT_TUNING``), for ``raypeft export``; the module's
        :meth:`PromptMethod.peft_adapter` gives the tensors. Raises ``ValueError`` (one line,
        saying why) when peft has no equivalent."""
        raise ValueError(no_peft_equivalent(self.name))

    def warm_up(self, backbone: BackboneAccess) -> None:
        """Build shared artefacts the method's module reads (e.g. IPT's pretrained prompt
        table, cached on disk). The driver calls it once before trials start; the prompted
        model calls it again before building the module, so a trial on a machine that lacks
        them builds them. Most methods need nothing."""


@dataclass(frozen=True)
class FigureHints:
    """The knobs the report's method figures read from a method's trials (config field names,
    logged as ``method.<name>``) and how their titles name them.

    The heat map draws the best score per pair of the two learning rates, one panel per
    prompt length; the size-vs-rank figure draws the score per prompt length with the rank
    the budget derived for it.
    """

    label: str  # the method in titles, e.g. "DePT"
    learning_rates: tuple[str, str]  # heat map x and y, e.g. ("lr_prompt", "lr_lowrank")
    lr_symbols: tuple[str, str]  # their symbols in titles, e.g. ("α1", "α2")
    length: str  # one panel per value, e.g. "prompt_length"
    length_symbol: str  # e.g. "m"
    rank: str  # derived from the budget for each length (logged as derived.<rank>)
    rank_symbol: str  # e.g. "r"
    budget_length: str | None = None  # the budget as a PT length, e.g. "budget_prompt_length"


@dataclass(frozen=True)
class PeftAdapter:
    """A trained method in Hugging Face peft's terms (see :meth:`MethodConfig.peft_type`)."""

    prompt_embeddings: torch.Tensor  # peft's prompt embedding weight, (virtual tokens, width)
    settings: dict[str, Any]  # peft config arguments beyond task, base model and layers
    what: str  # what the tensor holds, for the export's report, e.g. "prompt"


def no_peft_equivalent(name: str, why: str = "") -> str:
    """The one-line message for a method without a peft equivalent, naming those with one."""
    supported = " and ".join(
        f"{other} {method.config_cls.peft_export_note}"
        for other, method in METHODS.items()
        if method.config_cls.peft_export_note
    )
    because = f" ({why})" if why else ""
    return f"method {name!r} has no peft equivalent{because}; peft export supports {supported}"


@dataclass(frozen=True)
class BudgetOption:
    """One setting of a method that fits a trainable-parameter budget."""

    method: str
    settings: dict[str, Any]  # the size knobs, e.g. {"prompt_length": 40, "rank": 45}
    params: int
    budget: int

    @property
    def slack(self) -> int:
        """What the setting leaves unused of the budget (>= 0)."""
        return self.budget - self.params


class FeatureSpec(BaseModel):
    """A per-example array that does not depend on trained parameters (IDPG's ``M(x)``).

    ``key`` identifies the computation: trials whose specs share a key share one array,
    computed once on the driver. Subclasses implement :meth:`compute`.
    """

    model_config = ConfigDict(frozen=True)

    @property
    def key(self) -> str:
        return f"{type(self).__name__}:{self.model_dump_json()}"

    def compute(self, texts: list[str], arrays: dict[str, Any], backbone: BackboneAccess) -> Any:
        """A ``(n, width)`` float32 array for one split: its texts and tokenised arrays
        (``backbone``: the frozen backbone, for specs that encode with it)."""
        raise NotImplementedError


class PromptMethod(nn.Module):
    """A prompt method's trainable tensors and how they enter the frozen backbone.

    Built from the resolved config, the backbone's dims and word embeddings, and its
    tokenizer (``None`` for a method built by hand): prompts that start from vocabulary rows
    or a text read it (:mod:`raypeft.methods.prompt_init`).
    """

    config_cls: ClassVar[type[MethodConfig]]

    def __init__(
        self,
        config: MethodConfig,
        dims: BackboneDims,
        word_embeddings: nn.Embedding,
        tokenizer: Any | None = None,
    ):
        super().__init__()
        self.config = config
        self.dims = dims

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters by group name; names match ``config.learning_rates()``."""
        raise NotImplementedError

    def prepare_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        embed: nn.Embedding,
        features: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for the backbone's forward (``inputs_embeds``, masks...).

        ``features`` holds the per-example tensors the config asked for in
        :meth:`MethodConfig.feature_specs` (e.g. IDPG's cached sentence encodings).
        """
        raise NotImplementedError

    def layer_prompt(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Vectors ``(batch or 1, t, d)`` that replace positions ``[0, t)`` at the input of
        transformer layer ``layer`` (1..N-1), or None to leave the layer alone.

        Only called when the class sets ``uses_layer_prompts``; positions ``[0, t)`` hold the
        prompt this method prepended at the input layer. ``hidden_states`` is that layer's
        input, for methods that generate from the previous layer's output.
        """
        return None

    uses_layer_prompts: ClassVar[bool] = False

    # A fused pack (raypeft.modeling.fused) computes several members' inputs in one go from
    # their tensors stacked along a leading slot axis, zero-padded to the largest member's
    # shape (raypeft.methods.fusing). A method that can be computed that way sets
    # ``fused_constants`` (its members' non-trainable per-slot values, by name, as ``(K, ...)``
    # tensors) and ``fused_parts`` (its batched ``prepare_inputs``), see PromptTuning; None:
    # its members pack, but through their own modules one by one.
    fused_constants: ClassVar[Callable[[Sequence[PromptMethod | None]], dict] | None] = None
    fused_parts: ClassVar[Callable[[FusedBatch], FusedInputs] | None] = None
    # A method with layer prompts fuses when it also gives every row's prompt at the input
    # of a layer: ``(batch, layer, hidden) -> (rows, t, d)`` (its slot's, zero-padded to the
    # longest; ``hidden``: the layer's input), or None to leave the layer alone
    fused_layer_prompts: ClassVar[
        Callable[[FusedBatch, int, torch.Tensor], torch.Tensor | None] | None
    ] = None
    # A method with key/value prefixes fuses when it also gives every layer's prefix of
    # every row: ``[(keys, values)]`` per layer, each ``(rows, heads, P, head_dim)`` (its
    # slot's, zero-padded after it to the longest, ``P``)
    fused_prefix: ClassVar[
        Callable[[FusedBatch], list[tuple[torch.Tensor, torch.Tensor]]] | None
    ] = None

    @staticmethod
    def fusing_limitation(members: Sequence[PromptMethod]) -> str | None:
        """Why these members of the method cannot step fused (one line; None: they can),
        beyond what every fused pack checks (the same trainable tensors' names and ranks):
        e.g. a variant without a fused form, or members whose structures differ."""
        return None

    def peft_adapter(self) -> PeftAdapter:
        """The trained tensors in peft's layout, for configs whose
        :meth:`MethodConfig.peft_type` names a peft type."""
        raise NotImplementedError(f"{type(self).__name__} has no peft equivalent")

    def num_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


METHODS: dict[str, type[PromptMethod]] = {}


def register_method(method_cls: type[PromptMethod]) -> type[PromptMethod]:
    """Class decorator: make a method available under its config's ``name`` literal (its
    config joins the experiment schema's ``method`` section)."""
    register_method_config(method_cls.config_cls)  # raises if the name is taken
    METHODS[config_name(method_cls.config_cls)] = method_cls
    return method_cls


def build_method(
    config: MethodConfig,
    dims: BackboneDims,
    word_embeddings: nn.Embedding,
    tokenizer: Any | None = None,
) -> PromptMethod:
    """Instantiate the registered method for a resolved config (``tokenizer``: the
    backbone's, which vocabulary and text initialisations read)."""
    return METHODS[config.name](config, dims, word_embeddings, tokenizer)


def prepend_prompt(
    prompt: torch.Tensor,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """Prepend a prompt to every sequence; extend the masks with ones/zeros.

    ``prompt`` is ``(l, d)`` (one prompt for all, PT) or ``(batch, l, d)`` (one per example,
    IDPG and IPT).
    """
    batch = inputs_embeds.shape[0]
    if prompt.dim() == 2:
        prompt = prompt.unsqueeze(0).expand(batch, -1, -1)
    length = prompt.shape[1]
    out = {
        "inputs_embeds": torch.cat([prompt.to(inputs_embeds.dtype), inputs_embeds], 1),
        "attention_mask": torch.cat([attention_mask.new_ones(batch, length), attention_mask], 1),
    }
    if token_type_ids is not None:
        pad = token_type_ids.new_zeros(batch, length)
        out["token_type_ids"] = torch.cat([pad, token_type_ids], 1)
    return out
