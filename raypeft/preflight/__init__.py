"""Checks before anything starts: one pipeline, run by ``raypeft tune`` and ``raypeft validate``.

The stages, in order (each failure is one :class:`~raypeft.errors.ConfigError` line prefixed
with the experiment file's name; nothing is created before all pass):

1. schema: the file parses and validates (done by loading it, :mod:`raypeft.config.schema`);
2. files and data (:mod:`.data`): the task, its files, every row, the batch size;
3. model (:mod:`.model`): the name resolves offline, its config and tokenizer load;
4. method settings (:mod:`.settings`): every setting the space can produce, through the
   hooks of the method's config; with ``trial_runner: replay``, a recorded curve for each
   (:func:`raypeft.search.replay_trials.check_replayable`);
5. stores (:mod:`raypeft.tracking.stores`, :mod:`.storage`): the tracking URI and Optuna
   storage can be opened, a tracking server or database server answers, a study the search
   would continue was created for its directions, and ``run.storage_path`` is a folder or a
   URI Ray Tune can open whose object store answers;
6. resources (:mod:`raypeft.search.resources`): ``--address`` is an address
   (:func:`raypeft.search.ray_session.check_address`); one trial fits this machine, with
   the precision it asks for (a cluster, ``address``, is joined and checked once the search
   connects to it), and how many run at once; ``use_gpu: auto`` is resolved when the search
   starts (:mod:`raypeft.search.gpu_plan`), and what it will do is said here
   (``Checked.gpu_line``).

``tune`` runs this pipeline before anything else, so a file ``validate`` accepts can fail
``tune`` only for what needs the search itself: a cluster that does not answer or cannot
place a trial (joined by ``tune`` only), ``--resume`` without a search to resume.

What passes can still earn a note (:mod:`.export`): which of the search's models
``raypeft export --format peft`` will refuse, and why; ``validate`` and ``tune`` print it
before anything runs. ``validate`` also notes a tpe or gp sampler with too few trials to model
anything (:mod:`.sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.data.tasks import TaskSpec
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.preflight.data import check_task
from raypeft.preflight.export import export_notes
from raypeft.preflight.model import check_model
from raypeft.preflight.settings import distinct_settings
from raypeft.preflight.storage import check_storage_path
from raypeft.search.objectives import resolve_objectives
from raypeft.search.ray_session import check_address
from raypeft.search.replay_trials import check_replayable, load_replay_table
from raypeft.search.resources import auto_gpu_line, check_fits, local_nodes, trials_at_once
from raypeft.search.study import check_existing_study
from raypeft.tracking.runs import tracking_uri
from raypeft.tracking.stores import (
    check_database_answers,
    check_stores,
    check_tracking_store,
    database_server,
    named_tracking_uri,
    search_storage,
)

STAGES = ("schema", "files and data", "model", "method settings", "stores", "resources")

__all__ = ["STAGES", "Checked", "run_checks"]


@dataclass(frozen=True)
class Checked:
    """What the checks established about an experiment."""

    spec: TaskSpec  # the task, with its number of labels
    split_sizes: dict[str, int]  # examples per split, as the search will train and score
    dims: BackboneDims  # the backbone's shapes
    method_settings: int  # distinct method settings of the space, each checked
    resources_checked: bool  # False for a cluster (``address``): checked once connected
    trials_at_once: int | None = None  # on this machine; None for a cluster
    notes: tuple[str, ...] = ()  # what is allowed but worth knowing first (e.g. no export)
    gpu_line: str | None = None  # use_gpu: auto, what it will do (None: the file says)


def run_checks(cfg: ExperimentConfig, source: str, *, address: str | None = None) -> Checked:
    """Run every stage after the schema on a loaded experiment; ``source`` (the file's name)
    prefixes each error. Without ``address`` (the local Ray ``tune`` starts) one trial's
    resources must fit this machine. Raises :class:`ConfigError`."""
    try:
        task = check_task(cfg)
        model = check_model(cfg.model, task.spec)
        settings = distinct_settings(cfg, model, source)
        if cfg.resources.trial_runner == "replay":  # every trial has a recorded curve
            check_replayable(cfg, load_replay_table(cfg))
        _check_stores(cfg, task.spec.metrics)
        at_once, nodes = None, None
        if address is not None:
            check_address(address)
        else:
            nodes = local_nodes()
            check_fits(cfg, nodes)
            # use_gpu: auto with a GPU here: the search decides how many run at once
            auto_on_gpu = cfg.resources.gpu_auto and any(n.get("GPU") for n in nodes)
            at_once = None if auto_on_gpu else trials_at_once(cfg, nodes)
    except ConfigError as exc:
        text = str(exc)
        raise ConfigError(text if text.startswith(f"{source}: ") else f"{source}: {text}") from None
    notes = tuple(export_notes(cfg, model.dims, settings))
    gpu_line = auto_gpu_line(cfg, nodes, address) if cfg.resources.gpu_auto else None
    return Checked(
        task.spec,
        task.sizes,
        model.dims,
        len(settings),
        address is None,
        at_once,
        notes,
        gpu_line,
    )


def _check_stores(cfg: ExperimentConfig, metrics: tuple[str, ...]) -> None:
    """The stores stage: the URIs can be opened, a tracking server or database server
    answers, a study to continue optimises the search's directions (the objectives' modes,
    from the task's ``metrics``), and the object store of ``run.storage_path`` answers."""
    check_stores(cfg)
    if named := named_tracking_uri(cfg.tracking.uri):
        check_tracking_store(named[0], redact_uri(named[0]))
    named = search_storage(cfg)
    if named and database_server(named[0]):
        check_database_answers(*named)
    modes = [o.mode for o in resolve_objectives(cfg, metrics)]
    check_existing_study(cfg, tracking_uri(cfg.tracking.uri), modes)
    check_storage_path(cfg)
