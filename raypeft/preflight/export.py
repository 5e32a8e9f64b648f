"""Notes, not errors: which of a search's models ``raypeft export --format peft`` will refuse.

A search may train models that predict and serve but have no peft form: a method without a
peft equivalent (DePT's low-rank update of the input embeddings, prefix's hidden style, IDPG,
IPT), or a method with one whose head mean-pools (``model.head_pooling`` resolving to
``mean``: peft's heads read the first position). ``validate`` and ``tune`` print these before
anything runs, so nobody learns it from ``export`` after a long search. Each method says
itself why it has no equivalent (``MethodConfig.peft_type`` raises); nothing here names one.
"""

from __future__ import annotations

from collections.abc import Iterable

from raypeft.config.schema import ExperimentConfig
from raypeft.methods import BackboneDims
from raypeft.methods.base import MethodConfig
from raypeft.modeling.head_pooling import resolve_head_pooling

REFUSES = "`raypeft export --format peft` will refuse"


def export_notes(
    cfg: ExperimentConfig, dims: BackboneDims, methods: Iterable[MethodConfig]
) -> list[str]:
    """One note per reason some of the search's models will not export as peft adapters,
    over every method setting the space can produce (``methods``); empty when all export."""
    refused: dict[str, int] = {}  # the method's reason -> how many settings it covers
    exportable = 0
    settings = list(methods) or [cfg.method]
    for method in settings:
        try:
            method.peft_type()
        except ValueError as exc:
            refused[str(exc)] = refused.get(str(exc), 0) + 1
            continue
        exportable += 1
    notes = [
        f"{REFUSES} {_whose(count, len(settings))}, which predict and serve: {reason}"
        for reason, count in refused.items()
    ]
    if exportable and resolve_head_pooling(cfg.model.head_pooling, dims) == "mean":
        notes.append(
            f"model.head_pooling: {cfg.model.head_pooling} resolves to mean on "
            f"{cfg.model.name}: {REFUSES} {_whose(exportable, len(settings))} (peft's heads "
            "read the first position); set model.head_pooling: first to export"
        )
    return notes


def _whose(count: int, total: int) -> str:
    """The search's models a reason covers: all of them, or some."""
    return "this search's models" if count == total else "some of this search's models"
