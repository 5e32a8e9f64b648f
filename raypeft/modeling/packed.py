# Over 500 lines on purpose: PackedBackbone and the padding, masks and caches its one pass needs.
"""Several prompted models on one frozen backbone: their batches in one forward pass.

A pack's members are :class:`~raypeft.modeling.prompted.PromptedModel` s built as trials of
their own are (each with its own method, head and modules, over the same frozen tensors).
:class:`PackedBackbone` runs their batches through one more copy of the backbone, concatenated
along the batch axis, so that each member computes what it would alone:

- each member's method prepares its own batch (``PromptedModel.backbone_inputs``): it sees
  the rows it would see alone, and draws from its own random state (:class:`MemberRNG`);
- members' sequences (prompt + input) differ in length when their prompts do. Each is padded
  to the pack's longest with masked slots, placed where the positions the backbone gives the
  real slots stay those they have alone: after the sequence for encoders and seq2seq encoders
  (their positions count from the first slot; T5's are relative), before it for decoders
  (their head reads the last position, and their position ids are explicit, counted over the
  real slots only, as alone);
- key/value prefixes (deep prompts' ``kv`` style) are padded to the longest with masked zero
  keys and values. When members' prefixes differ in length, an encoder gets each row's position
  ids explicitly, as its embeddings compute them alone for that prefix (BERT counts on after
  the prefix, RoBERTa does not): probed once per shape from the embeddings module;
- the layer hooks hand each member's rows, padding cut off, to its own ``layer_prompt``;
- the task head is routed: each member's rows go through its own head.

Nothing in a transformer mixes rows (attention stays within a sequence, the rest works per
position), so a member's loss depends on its own tensors only: the sum of the members' losses,
back-propagated once, gives each member exactly its own gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from raypeft.methods import MethodConfig
from raypeft.methods.base import PREFIX_CACHE, BackboneKind
from raypeft.modeling.backbones import (
    backbone_arguments,
    cache_length_argument,
    transformer_layers,
)
from raypeft.modeling.dropout import set_dropout_rate, trains_with_dropout
from raypeft.modeling.head_pooling import head_style, input_mean, pooled_logits
from raypeft.modeling.precision import autocast
from raypeft.modeling.prompted import PromptedModel, PromptedOutput, head_loss

# The keyword inputs a pack knows how to fuse: what methods' prepare_inputs return, plus the
# decoder position ids PromptedModel adds.
PACKABLE_INPUTS = frozenset(
    {"inputs_embeds", "attention_mask", "token_type_ids", PREFIX_CACHE, "position_ids"}
)


def packable(method: MethodConfig, kind: BackboneKind) -> str | None:
    """Why trials of ``method`` cannot train in a pack on a ``kind`` backbone (None: they can).

    Every built-in method packs on every backbone kind it runs on alone: all a method does to
    the backbone goes through its keyword inputs and layer prompts, which the pack fuses. A
    method that does more says why (:meth:`~raypeft.methods.base.MethodConfig.pack_limitation`).
    Whether a method runs on a backbone at all is its own ``check_backbone``'s business, and
    whether two trials share a backbone is :meth:`PackedBackbone.check_member`'s.
    """
    return method.pack_limitation(kind)


class MemberRNG:
    """A member's own random state: the global generators (the CPU's, and its CUDA device's)
    as they would be in a process training that member alone. Work done for the member runs
    inside :meth:`active`; everything else sees the process's own state."""

    def __init__(self, device: torch.device | str = "cpu"):
        device = torch.device(device)
        self.cuda = device if device.type == "cuda" else None
        self.state = self._read()  # the current state becomes the member's

    def _read(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = None if self.cuda is None else torch.cuda.get_rng_state(self.cuda)
        return torch.get_rng_state(), cuda

    def _write(self, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.cuda)

    @contextmanager
    def active(self) -> Iterator[None]:
        """Inside, the global generators are the member's; its draws are kept on exit."""
        outer = self._read()
        self._write(self.state)
        try:
            yield
        finally:
            self.state = self._read()
            self._write(outer)


def _scope(rng: MemberRNG | None):
    return nullcontext() if rng is None else rng.active()


@dataclass
class PackEntry:
    """One member's part of a packed forward: its model, its batch (the keys its model's
    ``forward`` takes) and its random state."""

    model: PromptedModel
    batch: dict
    rng: MemberRNG | None = None


@dataclass(frozen=True)
class PackShape:
    """How much of a fused batch is padding (sums over the forwards a pack ran with ``+``)."""

    rows: int = 0
    slots: int = 0  # rows × (key/value prefix + sequence), padding included
    padded: int = 0  # slots that are padding
    prompt_slots: int = 0  # the members' own prompt positions and prefixes (no padding)

    @property
    def padding_waste(self) -> float:
        """The share of the prompt slots (prepended positions and key/value prefixes, over all
        rows) that are padding: 0 when the members' prompts have one length."""
        total = self.padded + self.prompt_slots
        return self.padded / total if total else 0.0

    def __add__(self, other: PackShape) -> PackShape:
        return PackShape(
            self.rows + other.rows,
            self.slots + other.slots,
            self.padded + other.padded,
            self.prompt_slots + other.prompt_slots,
        )


@dataclass(frozen=True)
class _Placement:
    """Where one member's rows sit in a fused batch."""

    entry: PackEntry
    start: int  # its first row
    stop: int
    offset: int  # the column its sequence starts at (decoders: after the padding in front)
    length: int  # its sequence: prompt positions + input
    past: int  # its key/value prefix

    @property
    def rows(self) -> int:
        return self.stop - self.start


class PackedBackbone(nn.Module):
    """A frozen backbone that runs several members' batches in one forward pass.

    ``model`` is the pack's own copy of the backbone (from the backbone cache, or
    :func:`shared_copy`): its head modules are replaced by routers to the members' heads,
    and its transformer layers get the hooks that insert each member's layer prompts.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        kind: BackboneKind,
        precision: str = "fp32",
        backbone_dropout: float | str = "config",
        head_pooling: str = "first",
    ):
        super().__init__()
        self.backbone = model
        self.kind = kind
        self.precision = precision
        # the members' resolved model.head_pooling (first or mean): one head path for all;
        # the head's style is read before its modules are replaced by routers
        self.head_pooling = head_pooling
        self.head_style = head_style(model) if head_pooling == "mean" else None
        # the members' train.backbone_dropout: one backbone runs one dropout for all of them
        self.backbone_dropout = backbone_dropout
        if isinstance(backbone_dropout, float) and trains_with_dropout(backbone_dropout):
            set_dropout_rate(model, backbone_dropout)
        self._heads = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
        self._frozen = _shared_tensors(model)
        self._placements: list[_Placement] | None = None
        # a fused pack's heads (raypeft.modeling.fused), by path, and what puts its members'
        # layer prompts in place (layer index, hidden states -> hidden states), while one of
        # its passes runs
        self._fused_heads: dict[str, nn.Module] | None = None
        self._fused_layers: Callable[[int, torch.Tensor], torch.Tensor] | None = None
        self._deep = False
        self._probed: dict[tuple[int, int], torch.Tensor] = {}
        for path in _head_modules(model, set(self._heads)):
            parent, _, name = path.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, name, _RoutedHead(path, self._current, self._fused_head))
        for index, layer in enumerate(transformer_layers(model)):
            if index > 0:  # layer 0's prompt is prepended by prepare_inputs
                layer.register_forward_pre_hook(self._layer_hook(index), with_kwargs=True)
        self.train()

    def _current(self) -> list[_Placement] | None:
        return self._placements

    def _fused_head(self, path: str) -> nn.Module | None:
        return None if self._fused_heads is None else self._fused_heads[path]

    @property
    def head_paths(self) -> list[str]:
        """The head modules each member has its own of (routed to the members' rows)."""
        return [p for p, m in self.backbone.named_modules() if isinstance(m, _RoutedHead)]

    @contextmanager
    def fused_pass(
        self,
        heads: dict[str, nn.Module],
        layers: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """Inside, every head path runs ``heads[path]`` on all rows at once (a fused pack's
        stacked heads, :mod:`raypeft.modeling.fused`) instead of routing rows to members,
        and ``layers(index, hidden)`` (if given) puts every member's prompt of layer
        ``index`` in place."""
        self._fused_heads, self._fused_layers = heads, layers
        try:
            yield
        finally:
            self._fused_heads, self._fused_layers = None, None

    def train(self, mode: bool = True) -> PackedBackbone:
        # as PromptedModel.train: training mode reaches the frozen backbone only to run its
        # dropout (the members' backbone_dropout); 0 keeps it in eval mode. A fused batch
        # draws its masks as one from the process's generator, so with dropout on a member
        # sees other masks than alone (the same rate): packs are exact with dropout off.
        super().train(mode)
        if not trains_with_dropout(self.backbone_dropout):
            self.backbone.eval()
        return self

    def check_member(self, model: PromptedModel) -> None:
        """Raise ``ValueError`` (one line) unless ``model`` can join the pack: a backbone of the
        same kind and class in the same precision, a head of the same shape, and the pack's
        frozen tensors (for a randomly initialised test model: the same ``train.seed``)."""
        mine = f"{self.kind} {type(self.backbone).__name__} in {self.precision}"
        theirs = f"{model.kind} {type(model.backbone).__name__} in {model.precision}"
        if mine != theirs:
            raise ValueError(f"a {theirs} cannot join a pack of a {mine}")
        if model.backbone_dropout != self.backbone_dropout:
            raise ValueError(
                f"its train.backbone_dropout {model.backbone_dropout!r} differs from the "
                f"pack's {self.backbone_dropout!r} (the members share the backbone's dropout)"
            )
        if model.head_pooling != self.head_pooling:
            raise ValueError(
                f"its model.head_pooling {model.head_pooling!r} differs from the pack's "
                f"{self.head_pooling!r}"
            )
        heads = {n: p.shape for n, p in model.backbone.named_parameters() if p.requires_grad}
        if heads != self._heads:
            raise ValueError(f"its head {heads} differs from the pack's {self._heads}")
        own = _shared_tensors(model.backbone)
        for name, tensor in self._frozen.items():
            if name not in own or not _same_tensor(own[name], tensor):
                raise ValueError(
                    f"its frozen backbone differs from the pack's ({name}): a pack's members "
                    "share one backbone (same model, revision, precision and device; for a "
                    "randomly initialised test model also the same train.seed)"
                )

    # ------------------------------------------------------------------ forward passes

    def forward(self, entries: Sequence[PackEntry]) -> tuple[list[PromptedOutput], PackShape]:
        """Each entry's outputs, as its model's own ``forward`` gives them for its batch, and
        the fused batch's shape."""
        inputs, placements, shape = self.pack_inputs(entries)
        with self._placed(placements):
            if self.kind == "seq2seq":
                return self._seq2seq_outputs(inputs, placements), shape
            logits = self._head_logits(inputs, placements)
        outputs = []
        for p in placements:
            own, labels = logits[p.start : p.stop], p.entry.batch.get("labels")
            outputs.append(PromptedOutput(own, None if labels is None else head_loss(own, labels)))
        return outputs, shape

    @torch.no_grad()
    def predict(self, entries: Sequence[PackEntry]) -> list[np.ndarray]:
        """Each entry's predictions, as its model's own ``predict`` gives them."""
        if self.kind == "seq2seq" and any(e.model.ranks() for e in entries):
            # rank scoring asks every verbalizer's likelihood of each member's rows: each
            # member scores its own batch through its own model (exact, not fused)
            return [e.model.predict(**e.batch) for e in entries]
        inputs, placements, _ = self.pack_inputs(entries)
        with self._placed(placements):
            if self.kind != "seq2seq":
                logits = self._head_logits(inputs, placements).cpu().numpy()
                return [logits[p.start : p.stop] for p in placements]
            with autocast(self.precision, inputs["inputs_embeds"].device):
                generated = self.backbone.generate(
                    **inputs,
                    max_new_tokens=max(p.entry.model.new_tokens() for p in placements),
                    do_sample=False,
                    num_beams=1,
                )
        # each member's rows as long as they would be alone: the decoder's start token plus
        # its own new tokens (greedy decoding is the same per row, whatever the batch)
        return [
            p.entry.model.generated_predictions(
                generated[p.start : p.stop, : 1 + p.entry.model.new_tokens()]
            )
            for p in placements
        ]

    def _head_logits(self, inputs: dict, placements: list[_Placement]) -> torch.Tensor:
        with autocast(self.precision, inputs["inputs_embeds"].device):
            arguments = backbone_arguments(self.backbone, inputs)
            if self.head_style is None:
                return self.backbone(**arguments).logits.float()
            # mean: each member pools its own rows' input tokens (its sequence, padding cut)
            hidden = self.backbone.base_model(**arguments)[0]
            pooled = torch.cat(
                [
                    input_mean(
                        hidden[p.start : p.stop, p.offset : p.offset + p.length],
                        p.entry.batch["attention_mask"],
                    )
                    for p in placements
                ]
            )
            return pooled_logits(self.backbone, self.head_style, pooled).float()

    def _seq2seq_outputs(self, inputs: dict, placements: list[_Placement]) -> list[PromptedOutput]:
        """Logits and loss per member: the loss is each member's own mean over its target
        tokens (the backbone's loss would average over the whole fused batch)."""
        pad = self.backbone.config.pad_token_id
        targets = [p.entry.batch["target_ids"] for p in placements]
        targets = [t.masked_fill(t == pad, -100) for t in targets]
        longest = max(t.shape[1] for t in targets)
        labels = torch.cat([F.pad(t, (0, longest - t.shape[1]), value=-100) for t in targets])
        decoder_ids = self.backbone.prepare_decoder_input_ids_from_labels(labels)
        outputs = []
        with autocast(self.precision, labels.device):  # the loss is fp32 under autocast
            logits = self.backbone(**inputs, decoder_input_ids=decoder_ids).logits
            for p, own_targets in zip(placements, targets, strict=True):
                own = logits[p.start : p.stop, : own_targets.shape[1]]
                loss = F.cross_entropy(
                    own.reshape(-1, own.shape[-1]), own_targets.reshape(-1), ignore_index=-100
                )
                outputs.append(PromptedOutput(logits=own, loss=loss.float()))
        return outputs

    @contextmanager
    def _placed(self, placements: list[_Placement]) -> Iterator[None]:
        """Where the members' rows are, for the head routers and layer hooks, during a pass."""
        self._placements = placements
        self._deep = any(p.entry.model.method.uses_layer_prompts for p in placements)
        try:
            yield
        finally:
            self._placements = None

    def _layer_hook(self, index: int):
        def hook(module, args, kwargs):
            if self._fused_heads is not None:  # a fused pack's pass: all members at once
                if self._fused_layers is None:
                    return None
                hidden = self._fused_layers(index, args[0] if args else kwargs["hidden_states"])
                if args:
                    return (hidden, *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": hidden}
            if not self._deep:
                return None
            hidden = args[0] if args else kwargs["hidden_states"]
            blocks, changed = [], False
            for p in self._placements:
                rows = hidden[p.start : p.stop]
                method = p.entry.model.method
                if method.uses_layer_prompts:
                    with _scope(p.entry.rng):  # the member's rows as it sees them alone
                        prompt = method.layer_prompt(index, rows[:, p.offset : p.offset + p.length])
                    if prompt is not None:  # as PromptedModel's hook: replace [0, t)
                        t, start = prompt.shape[1], p.offset
                        prompt = prompt.to(hidden.dtype).expand(p.rows, -1, -1)
                        rows = torch.cat([rows[:, :start], prompt, rows[:, start + t :]], 1)
                        changed = True
                blocks.append(rows)
            if not changed:
                return None
            hidden = torch.cat(blocks)
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        return hook

    # ------------------------------------------------------------------ fusing the inputs

    def pack_inputs(self, entries: Sequence[PackEntry]) -> tuple[dict, list[_Placement], PackShape]:
        """The backbone's keyword inputs for every entry's batch in one, where each entry's
        rows are, and how much of it is padding."""
        prepared = [_member_inputs(e) for e in entries]
        lengths = [k["inputs_embeds"].shape[1] for k in prepared]
        pasts = [_past_length(k) for k in prepared]
        length, past = max(lengths), max(pasts)
        front = self.kind == "decoder"  # a decoder's head reads the last position
        placements, start = [], 0
        for entry, kwargs, own, own_past in zip(entries, prepared, lengths, pasts, strict=True):
            rows = kwargs["inputs_embeds"].shape[0]
            offset = length - own if front else 0
            placements.append(_Placement(entry, start, start + rows, offset, own, own_past))
            start += rows
        inputs = {
            "inputs_embeds": torch.cat([_pad(k["inputs_embeds"], length, front) for k in prepared]),
            "attention_mask": torch.cat(
                [
                    _mask(k["attention_mask"], p, past, length, front)
                    for k, p in zip(prepared, pasts, strict=True)
                ]
            ),
        }
        if any("token_type_ids" in k for k in prepared):
            segments = [
                k["token_type_ids"] if "token_type_ids" in k else _no_segments(k) for k in prepared
            ]
            inputs["token_type_ids"] = torch.cat([_pad(s, length, front) for s in segments])
        positions = self._position_ids(prepared, placements, length)
        if positions is not None:
            inputs["position_ids"] = positions
        if past:
            inputs[PREFIX_CACHE] = _packed_cache(prepared, past)
        return inputs, placements, _shape(placements, length, past)

    def _position_ids(
        self, prepared: list[dict], placements: list[_Placement], length: int
    ) -> torch.Tensor | None:
        """Explicit position ids where the backbone's own would differ from each member's alone
        (None elsewhere: padding after the sequence leaves them as they are)."""
        if self.kind == "decoder":  # explicit alone too; the padding in front gets 0
            return torch.cat([_pad(k["position_ids"], length, front=True) for k in prepared])
        if len({p.past for p in placements}) <= 1:
            return None
        return torch.cat(
            [self.alone_positions(length, p.past).expand(p.rows, -1) for p in placements]
        )

    def alone_positions(self, length: int, past: int) -> torch.Tensor:
        """``(1, length)``: the position ids the encoder's embeddings give a sequence after a
        key/value prefix of ``past`` slots, read from the embeddings themselves."""
        if (length, past) not in self._probed:
            self._probed[length, past] = _probe_positions(self.backbone, length, past)
        return self._probed[length, past]


class _RoutedHead(nn.Module):
    """Stands in for one head module of the packed backbone: each member's rows go through
    that member's own head (the module at ``path`` in its own backbone)."""

    def __init__(
        self,
        path: str,
        placements: Callable[[], list[_Placement] | None],
        fused: Callable[[str], nn.Module | None],
    ):
        super().__init__()
        self.path = path
        self._placements = placements
        self._fused = fused

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        fused = self._fused(self.path)
        if fused is not None:  # every member's rows at once, through their stacked heads
            return fused(x, *args, **kwargs)
        placements = self._placements()
        if placements is None:
            raise RuntimeError("a packed backbone's head runs inside PackedBackbone only")
        return torch.cat(
            [
                p.entry.model.backbone.get_submodule(self.path)(
                    x[p.start : p.stop], *args, **kwargs
                )
                for p in placements
            ]
        )


def shared_copy(model: PreTrainedModel) -> PreTrainedModel:
    """New modules over ``model``'s frozen tensors (no memory for them), its trainable tensors
    copied: one more member, or the pack's own copy, on a backbone built in place (a
    benchmark's). Trials get theirs from :func:`raypeft.modeling.cache.cached_backbone`."""
    memo = {}
    for tensor in _shared_tensors(model).values():
        view = tensor.detach()  # a new tensor object over the same storage
        memo[id(tensor)] = (
            nn.Parameter(view, requires_grad=False) if isinstance(tensor, nn.Parameter) else view
        )
    return copy.deepcopy(model, memo)


# ----------------------------------------------------------------------------- helpers


def _shared_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a pack's members share: frozen parameters and buffers."""
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    return {**frozen, **dict(model.named_buffers())}


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same storage (members from the backbone cache), or equal values."""
    if (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device):
        return False
    return a.data_ptr() == b.data_ptr() or torch.equal(a, b)


def _head_modules(model: nn.Module, head: set[str]) -> list[str]:
    """The topmost modules whose parameters all train (the task head's), which together hold
    every trainable parameter."""
    chosen: list[str] = []
    for path, module in model.named_modules():
        if not path or any(path.startswith(f"{c}.") for c in chosen):
            continue
        names = [f"{path}.{n}" for n, _ in module.named_parameters()]
        if names and all(n in head for n in names):
            chosen.append(path)
    covered = {n for n in head if any(n.startswith(f"{c}.") for c in chosen)}
    if covered != head:
        raise ValueError(f"cannot route the head to the members: {sorted(head - covered)}")
    return chosen


def _member_inputs(entry: PackEntry) -> dict:
    """The backbone's keyword inputs for one member's batch, as its model prepares them."""
    batch = entry.batch
    with _scope(entry.rng):
        kwargs = entry.model.backbone_inputs(
            batch["input_ids"],
            batch["attention_mask"],
            batch.get("token_type_ids"),
            batch.get("features"),
        )
    unknown = set(kwargs) - PACKABLE_INPUTS
    if unknown:
        raise ValueError(
            f"method {entry.model.method.config.name!r} gives the backbone {sorted(unknown)}; "
            f"a pack fuses only {sorted(PACKABLE_INPUTS)}"
        )
    return kwargs


def _past_length(kwargs: dict) -> int:
    cache = kwargs.get(PREFIX_CACHE)
    past = 0 if cache is None else cache.get_seq_length()
    if kwargs["attention_mask"].shape[1] != past + kwargs["inputs_embeds"].shape[1]:
        raise ValueError("the attention mask must cover the key/value prefix and the sequence")
    return past


def _pad(tensor: torch.Tensor, size: int, front: bool, dim: int = 1) -> torch.Tensor:
    """``tensor`` padded with zeros along ``dim`` to ``size``, in front or after."""
    missing = size - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    zeros = tensor.new_zeros(shape)
    return torch.cat([zeros, tensor] if front else [tensor, zeros], dim)


def _mask(mask: torch.Tensor, own_past: int, past: int, length: int, front: bool) -> torch.Tensor:
    """A member's attention mask with its prefix padded after it (as its keys and values are)
    and its sequence padded like its embeddings."""
    prefix, sequence = mask[:, :own_past], mask[:, own_past:]
    return torch.cat([_pad(prefix, past, front=False), _pad(sequence, length, front)], 1)


def _no_segments(kwargs: dict) -> torch.Tensor:
    """Segment ids for a member that passes none: zeros, what the backbone would assume."""
    embeds = kwargs["inputs_embeds"]
    return torch.zeros(embeds.shape[:2], dtype=torch.long, device=embeds.device)


def _packed_cache(prepared: list[dict], past: int) -> DynamicCache:
    """One key/value cache for the fused batch: each member's prefix padded after it with
    zeros to ``past`` slots (masked), members without a prefix all zeros."""
    caches = [k.get(PREFIX_CACHE) for k in prepared]
    reference = next(c for c in caches if c is not None)
    cache = DynamicCache()
    for index, layer in enumerate(reference.layers):
        keys, values = [], []
        for kwargs, own in zip(prepared, caches, strict=True):
            rows = kwargs["inputs_embeds"].shape[0]
            if own is None:
                keys.append(_blank(layer.keys, rows, past))
                values.append(_blank(layer.values, rows, past))
            else:
                keys.append(_pad(own.layers[index].keys, past, front=False, dim=2))
                values.append(_pad(own.layers[index].values, past, front=False, dim=2))
        cache.update(torch.cat(keys), torch.cat(values), index)
    return cache


def _blank(like: torch.Tensor, rows: int, past: int) -> torch.Tensor:
    return like.new_zeros((rows, like.shape[1], past, like.shape[3]))


def _probe_positions(model: PreTrainedModel, length: int, past: int) -> torch.Tensor:
    """Run the encoder's embeddings on a zero sequence of ``length`` after a prefix of ``past``
    slots, as the encoder runs them alone, and read the position ids they look up."""
    embeddings = getattr(model.base_model, "embeddings", None)
    table = getattr(embeddings, "position_embeddings", None)
    argument = cache_length_argument(embeddings) if embeddings is not None else None
    if not isinstance(table, nn.Embedding) or argument is None:
        raise ValueError(
            f"cannot pack key/value prefixes of different lengths on a {model.config.model_type} "
            "encoder (its embeddings have no position table or take no prefix length); pack "
            "members whose prefixes have one length"
        )
    seen: list[torch.Tensor] = []
    handle = table.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    weight = model.get_input_embeddings().weight
    zeros = torch.zeros(1, length, weight.shape[1], dtype=weight.dtype, device=weight.device)
    try:
        with torch.no_grad():
            embeddings(inputs_embeds=zeros, **{argument: past})
    finally:
        handle.remove()
    return seen[0].reshape(1, length)


def _shape(placements: list[_Placement], length: int, past: int) -> PackShape:
    rows = placements[-1].stop
    real, prompts = 0, 0
    for p in placements:
        inputs = p.entry.batch["input_ids"].shape[1]
        real += p.rows * (p.past + p.length)
        prompts += p.rows * (p.past + p.length - inputs)
    slots = rows * (past + length)
    return PackShape(rows=rows, slots=slots, padded=slots - real, prompt_slots=prompts)
