"""Frozen backbones kept loaded between the trials one process trains.

A reused Tune actor, the bare training loop, serving several checkpoints: each builds a model
per trial, and reading the backbone from disk every time is pure overhead. :func:`cached_backbone`
loads a backbone once per :class:`BackboneKey` (what determines the loaded module: model, revision,
head shape, dtype, device, seed) and hands each trial its own copy:

- the copy's modules are new (hooks a method installs die with the copy); its frozen tensors
  are new tensor objects over the cached storage (no memory per trial; moving or casting a copy
  replaces its own tensors, never the cache's), and its head is a fresh tensor;
- the head, and the global RNG after it, are exactly what a fresh process gets for the trial's
  seed: the cached values for the seed the entry was loaded with. A checkpoint's backbone also
  serves other seeds (a search's repeats): transformers' own initialisation of the head weights
  the checkpoint lacked is replayed with the trial's seed (on the CPU, as a fresh load draws
  them). A tiny model's weights are all drawn from the seed: one entry per seed;
- before a copy is handed out, the cached tensors are checked against what they were when
  loaded (storage, dtype, device, in-place version counter, which the copies' tensors share);
  an entry someone changed in place is dropped and loaded again. Only writes through a
  tensor's ``.data`` escape the version counter: nothing in raypeft writes frozen weights so,
  and the tests check every method leaves them bit for bit as loaded.

Bound: at most :data:`MAX_ENTRIES` backbones per process, least recently used dropped first, so
a process that meets several models (a search over ``model.name``) keeps at most two.
Tokenizers are cached by :func:`raypeft.modeling.backbones.load_tokenizer` itself.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from transformers import PreTrainedModel

from raypeft.config.schema import ModelConfig
from raypeft.modeling.backbones import (
    Backbone,
    backbone_dims,
    built_from_config,
    load_backbone,
    resolve_source,
)
from raypeft.modeling.precision import backbone_dtype, cast_frozen

# Two: a search alternating between two backbones (or head shapes) still hits; more would keep
# gigabytes of unused weights in every trial process.
MAX_ENTRIES = 2


@dataclass(frozen=True)
class BackboneKey:
    """What determines a loaded backbone module (``model.max_length`` does not: it only
    changes :class:`~raypeft.methods.BackboneDims`, computed per trial)."""

    source: str  # where from_pretrained reads (aliases resolved), or the tiny model's name
    revision: str | None
    num_labels: int
    problem: str
    dtype: str  # of the frozen weights
    device: str
    seed: int  # draws the head's (a tiny model's: every) initial weights

    @classmethod
    def of(
        cls, cfg: ModelConfig, num_labels: int, problem: str, seed: int, dtype, device
    ) -> BackboneKey:
        return cls(
            source=cfg.name if built_from_config(cfg.name) else resolve_source(cfg.name),
            revision=cfg.revision,
            num_labels=num_labels,
            problem=problem,
            dtype=str(dtype).removeprefix("torch."),
            device=str(_normalised(device)),
            seed=seed,
        )


@dataclass
class _Entry:
    """A loaded backbone, never handed out itself (trials get copies)."""

    model: PreTrainedModel
    head_names: list[str]
    seeded: frozenset[str]  # head weights the checkpoint lacked (drawn from the seed)
    seed: int  # the seed it was loaded with
    rng_after: torch.Tensor  # the CPU RNG right after loading, as a fresh process has it
    reseedable: bool  # serves other seeds: only trainable weights are drawn from the seed
    stamps: dict[str, tuple] = field(default_factory=dict)  # frozen tensor -> its stamp

    def shared_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors every copy shares: frozen parameters and all buffers."""
        frozen = {n: p for n, p in self.model.named_parameters() if n not in self.head_names}
        return {**frozen, **dict(self.model.named_buffers())}


_ENTRIES: OrderedDict[BackboneKey, _Entry] = OrderedDict()
_LOADS = [0]  # backbones read since the process started (tests check hits against it)


def cached_backbone(
    cfg: ModelConfig,
    num_labels: int,
    problem: str,
    *,
    seed: int = 0,
    precision: str = "fp32",
    device: torch.device | str | None = None,
) -> Backbone:
    """The backbone :func:`~raypeft.modeling.backbones.load_backbone` would load with ``seed``,
    frozen weights in ``backbone_dtype(precision, device)`` (``precision`` resolved: fp32, bf16
    or fp16) and everything on ``device`` (default CPU), the head float32; loaded once per key.

    The global RNG is left as that load leaves it (methods draw their initial tensors next).
    """
    device = _normalised(device)
    dtype = backbone_dtype(precision, device)
    key = BackboneKey.of(cfg, num_labels, problem, seed, dtype, device)
    key = _held_key(key)
    if key in _ENTRIES and not _pristine(_ENTRIES[key]):
        del _ENTRIES[key]  # changed in place by someone: load it again
    if key not in _ENTRIES:
        _ENTRIES[key] = _load_entry(cfg, num_labels, problem, seed, dtype, device)
        _LOADS[0] += 1
        while len(_ENTRIES) > MAX_ENTRIES:
            _ENTRIES.popitem(last=False)
    _ENTRIES.move_to_end(key)
    return _copy_for_trial(_ENTRIES[key], cfg, seed)


def _held_key(key: BackboneKey) -> BackboneKey:
    """``key`` itself when held (or held by nobody), else the key of an entry that differs
    only in its seed and can serve any seed."""
    if key in _ENTRIES:
        return key
    for held, entry in _ENTRIES.items():
        if entry.reseedable and held == replace(key, seed=held.seed):
            return held
    return key


def clear_backbone_cache() -> None:
    """Drop every cached backbone (tests; a process about to load something big)."""
    _ENTRIES.clear()


def cached_keys() -> list[BackboneKey]:
    """The keys held, least recently used first."""
    return list(_ENTRIES)


def loads() -> int:
    """How many backbones this process has read (cache misses), since it started."""
    return _LOADS[0]


def _normalised(device: torch.device | str | None) -> torch.device:
    """``cuda`` and ``cuda:0`` are one device: key by the explicit index."""
    device = torch.device(device or "cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _load_entry(
    cfg: ModelConfig, num_labels: int, problem: str, seed: int, dtype: torch.dtype, device
) -> _Entry:
    """Read the backbone as a fresh process does, then cast and move it once."""
    loaded = load_backbone(cfg, num_labels, problem, seed=seed)
    rng_after = torch.get_rng_state()  # before anything else draws from it
    model = cast_frozen(loaded.model, dtype).to(device)
    head_names = [n for n, p in model.named_parameters() if p.requires_grad]
    # a tiny model's body, or a frozen weight a checkpoint lacked, depends on the seed
    reseedable = not built_from_config(cfg.name) and loaded.seeded <= set(head_names)
    entry = _Entry(model, head_names, loaded.seeded, seed, rng_after, reseedable)
    entry.stamps = {name: _stamp(t) for name, t in entry.shared_tensors().items()}
    return entry


def _stamp(tensor: torch.Tensor) -> tuple:
    """What changes when a tensor is replaced or written in place."""
    return (tensor.data_ptr(), tensor.dtype, tensor.device, tensor._version)


def _pristine(entry: _Entry) -> bool:
    """Whether the cached tensors are still those loaded, unchanged."""
    current = entry.shared_tensors()
    return current.keys() == entry.stamps.keys() and all(
        _stamp(t) == entry.stamps[name] for name, t in current.items()
    )


def _copy_for_trial(entry: _Entry, cfg: ModelConfig, seed: int) -> Backbone:
    """New modules sharing the frozen tensors, with the head a fresh process gets for ``seed``."""
    shared = {id(t): _view(t) for t in entry.shared_tensors().values()}
    model = copy.deepcopy(entry.model, memo=shared)  # the memo puts views in place of copies
    torch.manual_seed(seed)  # every device's generator, as load_backbone seeds them
    if seed == entry.seed:
        torch.set_rng_state(entry.rng_after)  # the head already holds this seed's values
    else:
        _reinitialise(model, entry.seeded)
    params = dict(model.named_parameters())
    dims = backbone_dims(model.config, cfg.max_length, cfg.name)
    head = [params[name] for name in entry.head_names]
    return Backbone(model=model, dims=dims, head_params=head, seeded=entry.seeded)


def _view(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor object over ``tensor``'s storage and version counter (``detach`` shares
    both), a frozen parameter again if it was one."""
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(tensor.detach(), requires_grad=False)
    return tensor.detach()


@torch.no_grad()
def _reinitialise(model: PreTrainedModel, names: frozenset[str]) -> None:
    """Draw the weights ``names`` again from the current RNG, as ``from_pretrained`` draws
    the weights a checkpoint lacks: the same ``initialize_weights`` walk, with every other
    tensor flagged as loaded. On the CPU, because a fresh load draws them there."""
    params = dict(model.named_parameters())
    device = {name: params[name].device for name in names}
    for name in names:
        params[name].data = params[name].data.cpu()
    for module in model.modules():
        module.__dict__.pop("_is_hf_initialized", None)
    for name, tensor in [*params.items(), *model.named_buffers()]:
        tensor._is_hf_initialized = name not in names
    model.initialize_weights()
    for name in names:
        params[name].data = params[name].data.to(device[name])
