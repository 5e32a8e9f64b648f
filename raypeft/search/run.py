# Over 500 lines on purpose: a search's five phases, read top to bottom in one module.
"""One search, in five phases: prepare -> open records -> fit -> analyse -> finish.

- prepare: everything that can still fail on the input, before anything is recorded (the
  tracking store answers, the search to resume, the task tokenised once, objectives,
  backbone dimensions, per-example features computed once, a cluster that fits a trial);
- open records: the Optuna study, the MLflow parent run (or the interrupted one), the
  tracker that mirrors every trial to a nested run, a local Ray;
- fit: Ray Tune with Optuna's searcher and the scheduler, the task in Ray's object store,
  each trial training in-process or through Ray Train (:mod:`raypeft.search.tuner`);
- analyse: failures, the best trial, the Pareto front, repeated seeds of the top ones;
- finish: the chosen configuration scored once on the test split, the parent run closed.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
import ray
import yaml
from mlflow.entities import Run, RunTag
from mlflow.tracking import MlflowClient
from ray.tune import ResultGrid

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask, prepare_task
from raypeft.data.tasks import check_batch_fits
from raypeft.errors import ConfigError
from raypeft.methods import BackboneDims
from raypeft.modeling.backbones import backbone_dims, frozen_backbone, load_config
from raypeft.search.gpu_plan import plan_resources, resolved, sharing
from raypeft.search.interrupted import config_hash, find_interrupted_search
from raypeft.search.interrupts import Interrupts, SearchInterrupted
from raypeft.search.objectives import (
    Constraints,
    ResolvedObjective,
    resolve_constraints,
    resolve_objectives,
    stops_on_objective,
)
from raypeft.search.outcome import (
    Outcome,
    SearchSummary,
    choose_best,
    parent_run_record,
    score_on_test,
    score_seeds_on_test,
    tag_pareto_front,
)
from raypeft.search.progress import ProgressPrinter
from raypeft.search.publish import open_lineage, publish_best
from raypeft.search.ray_session import init_ray
from raypeft.search.repeats import run_repeats
from raypeft.search.resources import check_fits, cluster_nodes, describe_placement, local_nodes
from raypeft.search.results import TrialResult, trial_results
from raypeft.search.searcher import StudySearcher
from raypeft.search.seed_means import record_seed_means
from raypeft.search.space import candidate_methods
from raypeft.search.study import (
    UNSNAPSHOTTED,
    Rerun,
    StudyPlan,
    fail_orphans,
    plan_study,
    record_chosen,
    reruns,
    unrecorded_ends,
)
from raypeft.search.trial_records import TrialRecordsCallback
from raypeft.search.trial_runners import storage_path
from raypeft.search.tuner import (
    TuneRunner,
    experiment_path,
    max_concurrent,
    optuna_searcher,
    scheduler,
    warn_if_storage_not_shared,
)
from raypeft.tracking.callback import MLflowTrialCallback
from raypeft.tracking.parent_run import (
    artefacts_on_one_disk,
    finish_parent_run,
    open_experiment,
    start_parent_run,
)
from raypeft.tracking.runs import parent_runs, reopen_run, tracking_uri
from raypeft.tracking.stores import check_store, check_tracking_store, tracking_client
from raypeft.tracking.tags import (
    CONFIG_HASH_TAG,
    INTERRUPTED_TAG,
    METRIC_TAG,
    MODE_TAG,
    OBJECTIVES_TAG,
    OPTUNA_SEED_MEANS_TAG,
    OPTUNA_STORAGE_TAG,
    OPTUNA_STUDY_TAG,
    TUNE_PATH_TAG,
)
from raypeft.training.phases import PhaseTimer, merged
from raypeft.training.result_keys import RESTARTED_KEY


class SearchFailed(RuntimeError):
    """No trial produced a result (every trial failed); the message says where to look."""


@dataclass(frozen=True)
class SearchOptions:
    """How the search was asked for, beside its experiment (the CLI's flags)."""

    address: str | None = None  # a Ray cluster to join; None starts a local Ray
    quiet: bool = False
    source: str = "<memory>"  # the experiment file, as the parent run records it
    printer: Callable[..., None] = print
    progress_interval: float = 30.0  # seconds between two live tables
    resume: bool = False  # continue the experiment's interrupted search

    def say(self, *args) -> None:
        """A line for the user; nothing when quiet."""
        if not self.quiet:
            self.printer(*args)


@dataclass
class Prepared:
    """What the search knows before it records anything: the checked input and its task."""

    cfg: ExperimentConfig
    tracking_uri: str
    data: TokenizedTask  # tokenised once, per-example features included
    objectives: list[ResolvedObjective]
    constraints: Constraints
    dims: BackboneDims
    client: MlflowClient | None  # opened already when resuming (to find the search)
    interrupted: tuple[str, Run] | None  # --resume: (experiment id, its parent run)

    @property
    def primary(self) -> ResolvedObjective:
        return self.objectives[0]


@dataclass
class Records:
    """Where the search is recorded: the Optuna study, the MLflow parent run (new, or the
    interrupted one), the tracker of the trials' runs and what it adds to them (dataset
    inputs, system metrics, models), the Tune experiment's name."""

    study: StudyPlan
    client: MlflowClient
    experiment_id: str
    parent_run_id: str
    tune_name: str  # its folder under run.storage_path
    tracker: MLflowTrialCallback
    resuming: bool
    trial_records: TrialRecordsCallback

    def pause(self, signum: int) -> SearchInterrupted:
        """Record the search as paused by ``signum``: its interrupted trials' runs and the
        parent run KILLED and tagged with the signal, their Optuna trials closed (FAIL, marked
        interrupted); Tune saved its experiment, so ``--resume`` continues all of it."""
        name = signal.Signals(signum).name
        ended, interrupted = self.tracker.pause_runs(name)
        fail_orphans(
            self.study.storage,
            self.study.study_name,
            self.parent_run_id,
            reason=f"interrupted by {name}; `raypeft tune ... --resume` continues it",
            interrupted_by=name,
        )
        self.client.set_tag(self.parent_run_id, INTERRUPTED_TAG, name)
        self.client.set_terminated(self.parent_run_id, "KILLED")
        return SearchInterrupted(signum, ended, interrupted)

    def fail_if_running(self) -> None:
        """A search that ends in an error leaves its parent run FAILED, not RUNNING."""
        if self.client.get_run(self.parent_run_id).info.status == "RUNNING":
            self.client.set_terminated(self.parent_run_id, "FAILED")


@dataclass
class Fitted:
    """The search's Tune results, the runner that trains the repeats (if any), and the
    trials whose end the Optuna study could not record (:func:`_unrecorded`)."""

    runner: TuneRunner
    results: ResultGrid
    unrecorded: list[str] = field(default_factory=list)
    rerun: list[str] = field(default_factory=list)  # _rerun_lines
    # trial id -> the driver's seconds on it (MLflow records, Optuna), from the objects that
    # spent them (raypeft.training.phases.timed_phase)
    driver_phases: dict[str, PhaseTimer] = field(default_factory=dict)


def run_experiment(
    cfg: ExperimentConfig,
    *,
    address: str | None = None,
    quiet: bool = False,
    source: str = "<memory>",
    printer=print,
    progress_interval: float = 30.0,
    resume: bool = False,
) -> SearchSummary:
    """Run the whole search described by ``cfg`` and return its summary.

    ``resume``: continue the experiment's interrupted search (its driver died) instead of
    starting a new one: the same MLflow runs, Tune experiment and Optuna study.
    """
    start = time.time()
    opts = SearchOptions(address, quiet, source, printer, progress_interval, resume)
    records: Records | None = None
    clock = PhaseTimer()  # the search's phases, as a trial times its own
    with Interrupts() as interrupts:  # Ctrl-C or SIGTERM: pause, resumable with --resume
        try:
            with clock.phase("prepare"):
                prep = prepare(cfg, opts)
            with clock.phase("open_records"):
                records = open_records(prep, opts)
            with clock.phase("fit"):
                fitted = fit(prep, records, opts)
            with clock.phase("analyse"):
                outcome = analyse(prep, records, fitted, opts)
            with clock.phase("finish"):
                summary = finish(prep, records, outcome, opts, start)
            summary.phase_s = clock.seconds
            summary.trial_driver_phases = fitted.driver_phases
            return summary
        except (KeyboardInterrupt, SearchInterrupted):
            with interrupts.deferred():
                raise pause(records, interrupts.signum or signal.SIGINT) from None
        except BaseException:
            if records is not None:
                records.fail_if_running()
            raise


# ----------------------------------------------------------------------------- prepare


def pause(records: Records | None, signum: int) -> SearchInterrupted:
    """An interrupted search, recorded as paused where it had records already."""
    if records is None:  # still preparing: nothing was recorded, nothing to resume
        return SearchInterrupted(signum, recorded=False)
    return records.pause(signum)


def prepare(cfg: ExperimentConfig, opts: SearchOptions) -> Prepared:
    """Check what can still fail before any store, study or run is created: the tracking
    store, the search to resume, the task (tokenised once), the objectives and constraints,
    the backbone's dimensions, shared per-example features, and a cluster's room."""
    _quiet_loggers()
    uri = tracking_uri(cfg.tracking.uri)
    check_tracking_store(uri, redact_uri(uri))  # first: a dead server fails in seconds
    cfg = _resolve_resources(cfg, uri, opts)  # use_gpu: auto, the search's first line
    client, interrupted = _find_interrupted(cfg, uri, opts.source) if opts.resume else (None, None)
    opts.say(
        f"Preparing task {cfg.task.name!r} for {cfg.model.name} (s={cfg.model.max_length}) ..."
    )
    data = prepare_task(cfg.task, cfg.model)
    check_batch_fits(cfg, data.size("train"))
    objectives = resolve_objectives(cfg, data.spec.metrics)
    constraints = resolve_constraints(cfg, data.spec.metrics)
    config = load_config(cfg.model, data.num_labels, data.spec.problem)
    dims = backbone_dims(config, cfg.model.max_length, cfg.model.name)
    sizes = "/".join(str(data.size(split)) for split in ("train", "validation", "test"))
    primary = objectives[0]
    opts.say(
        f"  train/validation/test: {sizes} examples, {data.num_labels} labels, "
        f"{primary.name} ({primary.mode})"
    )
    # shared per-example features and artefacts (IPT's corpus) before anything is recorded:
    # what fails here leaves no store, study or run behind
    precompute_features(cfg, data, opts.say)
    if opts.address:  # a cluster: can it ever place one trial? (locally the CLI checked already)
        _join_cluster(cfg, opts)
    return Prepared(cfg, uri, data, objectives, constraints, dims, client, interrupted)


def _resolve_resources(cfg: ExperimentConfig, uri: str, opts: SearchOptions) -> ExperimentConfig:
    """``resources.use_gpu: auto`` resolved on the nodes that will run the trials (a cluster
    is joined, and a local Ray started, for it only where GPUs may be there), said first;
    ``--resume`` takes the interrupted search's resolution. Other files pass unchanged."""
    if not cfg.resources.gpu_auto:
        return cfg
    recorded = _recorded_resources(cfg, uri) if opts.resume else None
    if recorded is not None:
        opts.say("resources: use_gpu auto → as the interrupted search resolved it: "
                 f"{sharing(recorded) if recorded.resources.gpus else 'the CPU'}")  # fmt: skip
        return recorded
    nodes, where = _planning_nodes(opts)
    plan = plan_resources(cfg, nodes, where=where, say=opts.say)
    opts.say(plan.line)
    if not opts.address:  # a cluster is checked once joined (_join_cluster)
        check_fits(plan.cfg, nodes, where)
    return plan.cfg


def _planning_nodes(opts: SearchOptions) -> tuple[list[dict[str, float]], str]:
    """The nodes the trials will run on, and their name: the cluster's (joined now), the
    running Ray's, or this machine's, for which a local Ray starts now only with a GPU (a
    probe runs on it as Ray tasks)."""
    if opts.address:
        init_ray(opts.address, opts.quiet)
        return cluster_nodes(), f"the cluster at {opts.address}"
    if not ray.is_initialized() and not any(n.get("GPU") for n in local_nodes()):
        return local_nodes(), "this machine"
    init_ray(None, opts.quiet)  # started with this machine's GPUs (or the Ray running here)
    return cluster_nodes(), "this machine"


def _recorded_resources(cfg: ExperimentConfig, uri: str) -> ExperimentConfig | None:
    """The interrupted search's resolved resources (its parent run's parameters), applied to
    ``cfg``; None where there is no such search (``--resume`` then says so)."""
    try:
        check_store(uri)
        client = tracking_client(uri)
        experiment = client.get_experiment_by_name(cfg.tracking.experiment or cfg.name)
        runs = parent_runs(client, experiment.experiment_id) if experiment else []
    except ConfigError:
        return None
    params = runs[0].data.params if runs else {}
    keys = ("use_gpu", "gpus_per_worker", "trials_per_worker")
    if not all(f"resources.{k}" in params for k in keys):
        return None
    values = {k: yaml.safe_load(params[f"resources.{k}"]) for k in keys}
    return resolved(cfg, **values)


def _quiet_loggers() -> None:
    """Library chatter the user cannot act on (MLflow table creation, new Optuna studies)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # Tune's own lines on Ctrl-C name `Tuner.restore(...)` and "Trials did not complete":
    # raypeft prints the line a user can act on (`raypeft tune ... --resume`) instead
    logging.getLogger("ray.tune.tune").setLevel(logging.CRITICAL)
    # Ray >= 2.59 warns at every local start that it turned token authentication on, which
    # raypeft wants on (docs/security.md). (RAY_AUTH_MODE=token would silence it too, but
    # then Ray creates no token for a new machine and its GCS server fails to start.)
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)


def _find_interrupted(
    cfg: ExperimentConfig, uri: str, source: str
) -> tuple[MlflowClient, tuple[str, Run]]:
    """``--resume`` needs the store (never create an empty one) and a search in it."""
    try:
        check_store(uri)
    except ConfigError as exc:
        raise ConfigError(f"--resume: {exc}") from None
    client = tracking_client(uri)  # the search records through it (see open_records)
    return client, find_interrupted_search(client, cfg, source)


def precompute_features(cfg: ExperimentConfig, data: TokenizedTask, say=print) -> None:
    """Compute every per-example feature any trial can ask for, once, on the driver.

    IDPG's sentence encodings do not depend on trained parameters, so each distinct one is
    computed here for every split and shipped with the task to all trials; no trial runs
    the extra forward pass. Methods with shared artefacts (IPT's pretrained prompt table)
    build them here too, through ``MethodConfig.warm_up``, before any trial starts.
    """
    specs, warmed = {}, set()
    for method in candidate_methods(cfg):
        for spec in method.feature_specs().values():
            specs[spec.key] = spec
        key = method.model_dump_json()
        if key not in warmed:  # shared artefacts (IPT's pretrained table), built once
            warmed.add(key)
            method.warm_up(frozen_backbone(cfg.model))
    for key, spec in specs.items():
        if key in data.features:
            continue
        start = time.perf_counter()
        data.features[key] = {
            split: spec.compute(data.texts[split], arrays, frozen_backbone(cfg.model))
            for split, arrays in data.splits.items()
        }
        say(f"  computed {key} once for all trials ({time.perf_counter() - start:.1f} s)")


def _join_cluster(cfg: ExperimentConfig, opts: SearchOptions) -> None:
    """Join the cluster at ``--address`` and check it can ever place one trial."""
    init_ray(opts.address, opts.quiet)
    try:
        check_fits(cfg, cluster_nodes(), where=f"the cluster at {opts.address}")
    except ConfigError:
        ray.shutdown()
        raise


# ----------------------------------------------------------------------------- open records


def open_records(prep: Prepared, opts: SearchOptions) -> Records:
    """Open (create) the Optuna study and the MLflow store, start a local Ray, then start the
    parent run, or take up the interrupted one together with its trials' runs."""
    cfg, interrupted = prep.cfg, prep.interrupted
    study = plan_study(cfg, prep.tracking_uri, prep.objectives, resuming=interrupted is not None)
    # creates a sqlite store (once, under a lock: searches started together share it); a
    # server lost mid-search ends the search with TrackingLost, resumable with --resume
    client = prep.client or tracking_client(prep.tracking_uri)
    if not opts.address:  # a local Ray, once nothing in the input can fail any more
        init_ray(None, opts.quiet)
    if study.finished_before and not interrupted:
        _say_continuing(cfg, study, opts.say)
    if interrupted:
        experiment_id, parent_run_id, name = _take_up(client, interrupted, opts.say)
    else:
        experiment_id, parent_run_id, name = _start_parent(
            client, prep, study, opts.source, opts.say
        )
    tracker = MLflowTrialCallback(
        client, experiment_id, parent_run_id, cfg, prep.dims, storage=storage_path(cfg)
    )
    if interrupted:
        tracker.adopt_existing_runs()  # its trials continue their own runs
    # the task's dataset inputs (the parent now, each trial as it starts), the UI's view
    inputs = open_lineage(client, experiment_id, parent_run_id, cfg, prep.data, prep.objectives)
    extras = TrialRecordsCallback(tracker, inputs, cfg.tracking.log_models)
    resuming = interrupted is not None
    return Records(study, client, experiment_id, parent_run_id, name, tracker, resuming, extras)


def _say_continuing(cfg: ExperimentConfig, study: StudyPlan, say) -> None:
    skipped = cfg.grid_size() - len(study.points) if cfg.search.sampler != "grid" else 0
    say(
        f"  continuing Optuna study {study.study_name!r} ({redact_uri(study.storage_url)}): "
        f"{study.finished_before} earlier trials"
        + (f", {skipped} grid points already run" if skipped else "")
    )


def _take_up(client: MlflowClient, interrupted: tuple[str, Run], say) -> tuple[str, str, str]:
    """The interrupted search's parent run, RUNNING again: ``(experiment id, run id, Tune
    experiment name)``."""
    experiment_id, parent = interrupted
    parent_run_id = parent.info.run_id
    reopen_run(client, parent)
    tune_path = parent.data.tags[TUNE_PATH_TAG]
    say(f"Resuming search {parent_run_id} from {tune_path} ...")
    return experiment_id, parent_run_id, tune_path.rstrip("/").rsplit("/", 1)[-1]


def _start_parent(
    client: MlflowClient, prep: Prepared, study: StudyPlan, source: str, say
) -> tuple[str, str, str]:
    """A new parent run, tagged: ``(experiment id, run id, Tune experiment name)``."""
    cfg = prep.cfg
    experiment = cfg.tracking.experiment or cfg.name
    experiment_id = open_experiment(client, experiment, cfg.tracking.artifact_location)
    _warn_if_artefacts_on_one_disk(client, experiment_id, prep.tracking_uri, say)
    parent_run_id = start_parent_run(client, experiment_id, cfg, source)
    name = f"{cfg.name}-{parent_run_id[:8]}"
    _tag_parent(client, parent_run_id, prep, study, name)
    return experiment_id, parent_run_id, name


def _warn_if_artefacts_on_one_disk(client, experiment_id: str, tracking_uri: str, say) -> None:
    """A database server shared by many machines, but artefacts on this one's disk: say so
    (``raypeft predict`` elsewhere would find the runs, not their models)."""
    location = client.get_experiment(experiment_id).artifact_location
    if artefacts_on_one_disk(tracking_uri, location):
        say(
            f"  warning: MLflow's artefacts go to {location} on this machine's disk while its "
            "runs are in a database server; set tracking.artifact_location (s3://...) to keep "
            "them where every machine reads them"
        )


def _tag_parent(client, parent_run_id, prep: Prepared, study: StudyPlan, name: str) -> None:
    """What `raypeft report`, `predict`, `--resume` and optuna-dashboard users need."""
    cfg, objectives = prep.cfg, prep.objectives
    tags = {
        METRIC_TAG: prep.primary.name,
        MODE_TAG: prep.primary.mode,
        OPTUNA_STORAGE_TAG: redact_uri(study.storage_url),
        OPTUNA_STUDY_TAG: study.study_name,
        TUNE_PATH_TAG: redact_uri(experiment_path(cfg, name)),
        CONFIG_HASH_TAG: config_hash(cfg),
    }
    if len(objectives) > 1:
        tags[OBJECTIVES_TAG] = json.dumps([{"metric": o.name, "mode": o.mode} for o in objectives])
    client.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])


# ----------------------------------------------------------------------------- fit


def fit(prep: Prepared, records: Records, opts: SearchOptions) -> Fitted:
    """Ray Tune with Optuna's searcher and the scheduler over the task in Ray's object store
    (or the interrupted Tune experiment, continued); every trial mirrored to MLflow."""
    cfg, primary = prep.cfg, prep.primary
    warn_if_storage_not_shared(cfg, opts.say)
    runner = TuneRunner(
        cfg,
        ray.put(prep.data),  # tokenised once; every trial reads this one copy
        prep.dims,
        records.tracker,
        records.trial_records,
        live_table=None if opts.quiet else _live_table(prep, opts),
        resume=records.resuming,
        say=opts.say,
    )
    if cfg.resources.trial_runner == "replay":
        opts.say(
            f"  replaying {cfg.replay.table} (no training): each evaluation after its recorded "
            f"seconds x {cfg.replay.time_scale:g}"
        )
    opts.say(
        f"Searching: {cfg.search.num_samples} trials, "
        f"{describe_placement(cfg, max_concurrent(cfg))}, sampler {cfg.search.sampler}, "
        f"scheduler {cfg.search.scheduler.type} ..."
    )
    made: list[StudySearcher] = []  # the searcher, when this process made it (not resumed)

    def make_searcher():
        limiter = optuna_searcher(
            cfg, prep.dims, prep.objectives, prep.constraints, records.study, records.parent_run_id
        )
        made.append(limiter.searcher)  # ConcurrencyLimiter's public attribute
        return limiter

    results = runner.fit(
        records.tune_name,
        make_searcher,
        lambda: scheduler(cfg, primary.result_key, primary.mode),
        cfg.search.num_samples,
    )
    stale = _stale_trials(records)
    records.tracker.collect_results(results, reasons=_rerun_reasons(stale))
    # before fail_orphans, which closes what a resumed search left RUNNING
    unrecorded = _unrecorded(records, results, made[0] if made else None)
    if records.resuming:
        fail_orphans(records.study.storage, records.study.study_name, records.parent_run_id)
    searcher_phases = made[0].phase_s if made else {}
    driver = merged(records.tracker.phase_s, records.trial_records.phase_s, searcher_phases)
    return Fitted(runner, results, unrecorded, _rerun_lines(stale), driver)


def _stale_trials(records: Records) -> list[Rerun]:
    """A resumed search's trials that Tune's snapshot did not know (closed when Tune
    restored the searcher: :meth:`StudySearcher.requeue_unsnapshotted`)."""
    if not records.resuming:
        return []
    study = records.study
    return reruns(study.storage, study.study_name, records.parent_run_id)


def _rerun_reasons(stale: list[Rerun]) -> dict[str, str]:
    """Why each MLflow run of a trial Tune's snapshot did not know was closed (by Tune trial
    id): the study's reason, and the trial that trained its configuration again."""
    out = {}
    for rerun in stale:
        if rerun.tune_trial_id is None:
            continue
        where = f" (trial {rerun.again})" if rerun.again else "; the search ended before it did"
        out[rerun.tune_trial_id] = UNSNAPSHOTTED + where
    return out


def _rerun_lines(stale: list[Rerun]) -> list[str]:
    """The summary's words for the trials ``--resume`` ran again: ``"<stale Tune trial>
    (Optuna trial <n>) as <Tune trial>"``, or that the search ended before it did."""
    return [
        f"{r.tune_trial_id or '?'} (Optuna trial {r.number}) "
        + (f"as {r.again}" if r.again else "not run again: the search ended first")
        for r in stale
    ]


def _unrecorded(records: Records, results: ResultGrid, searcher: StudySearcher | None) -> list[str]:
    """The trials whose end the Optuna study does not hold as Tune ended it, each as
    ``"<Tune trial> (Optuna trial <n>: <why>)"``: the tells this process's searcher saw fail,
    and the trials Tune ended that the study still holds RUNNING (a resumed search's too)."""
    study = records.study
    ended = {t.trial_id for t in trial_results(results)}
    running = unrecorded_ends(study.storage, study.study_name, records.parent_run_id, ended)
    failed = searcher.untold_trials() if searcher is not None else {}
    lines = []
    for number in sorted({*running, *failed}):
        # a tell can also fail unseen: Optuna's sqlite storage drops an end the database
        # refuses with an integrity error, and tell returns as if it had recorded it
        still = "the study still holds it RUNNING"
        tune_id, why = failed.get(number, (running.get(number), still))
        who = tune_id or "a repeat answered from its original"
        lines.append(f"{who} (Optuna trial {number}: {why})")
    return lines


def _live_table(prep: Prepared, opts: SearchOptions) -> Callable[[int], ProgressPrinter]:
    """The live trial table of a Tune experiment, given its number of trials."""
    return functools.partial(
        ProgressPrinter,
        list(prep.cfg.space),
        prep.primary.result_key,
        prep.primary.mode,
        interval=opts.progress_interval,
        echo=opts.printer,
    )


# ----------------------------------------------------------------------------- analyse


def analyse(prep: Prepared, records: Records, fitted: Fitted, opts: SearchOptions) -> Outcome:
    """Count the failures, choose the best trial (among those meeting the constraints), tag
    the Pareto front, and train the top configurations again with more seeds
    (``search.repeat_best``): the best mean then wins."""
    cfg, primary, results = prep.cfg, prep.primary, fitted.results
    reported = trial_results(results)
    failed = [t for t in reported if t.failed]
    errors = len(results.errors) + len(failed)
    trials = [t for t in reported if not t.failed]
    best, constraints_met = choose_best(
        trials, primary, prep.constraints, stops_on_objective(cfg, primary)
    )
    if best is None:
        raise _no_result(results, failed, errors, primary.result_key, records.parent_run_id)
    pruned = sum(1 for t in trials if not t.ran_to_end)
    pareto = tag_pareto_front(trials, prep.objectives, prep.constraints, records.tracker)
    started_over = [t.trial_id for t in trials if RESTARTED_KEY in t.metrics]
    outcome = Outcome(best, constraints_met, len(results), errors, pruned, pareto, started_over)
    outcome.unrecorded = fitted.unrecorded
    outcome.rerun = fitted.rerun
    if cfg.search.repeat_best:
        outcome.repeats = run_repeats(
            fitted.runner, trials, primary, prep.constraints, records.tune_name, opts.say
        )
        outcome.ranked_repeats = sorted(
            outcome.repeats, key=lambda g: g.mean, reverse=primary.mode == "max"
        )
        chosen = outcome.ranked_repeats[0]
        outcome.best = next(t for t in trials if t.trial_id == chosen.trial_id)
    return outcome


def _no_result(
    results: ResultGrid, failed: list[TrialResult], errors: int, key: str, parent_run_id: str
) -> SearchFailed:
    """Every trial failed: how many, the first reason, and where to look."""
    reasons = [str(e).strip().splitlines()[-1] for e in results.errors if str(e).strip()]
    reasons += [t.failure for t in failed]
    first = reasons[0] if reasons else "no error"
    return SearchFailed(
        f"no trial reported {key}: {errors} of {len(results)} trials failed "
        f"(first: {first[:300]}); see MLflow run {parent_run_id}"
    )


# ----------------------------------------------------------------------------- finish


def finish(
    prep: Prepared, records: Records, outcome: Outcome, opts: SearchOptions, start: float
) -> SearchSummary:
    """Score the chosen configuration once on the test split (every seed of it, with
    repeats), publish its model (a pyfunc model, a registry version), then close the parent
    run with the best configuration, its metrics and model."""
    cfg, data, tracker = prep.cfg, prep.data, records.tracker
    folder = tracker.best_checkpoint_dir(outcome.best.trial_id)
    test, test_split_s = {}, 0.0
    if cfg.resources.trial_runner == "replay":  # its checkpoints hold untrained models
        opts.say("Replayed trials: the test split is not scored (the table records validation)")
    elif folder is not None:
        opts.say("Evaluating the best configuration on the test split ...")
        scoring = time.perf_counter()
        test = score_on_test(cfg, data, folder)
        test_split_s = time.perf_counter() - scoring
    if outcome.repeats and cfg.resources.trial_runner != "replay":
        chosen = outcome.ranked_repeats[0]
        test.update(score_seeds_on_test(cfg, data, chosen, tracker, opts.say))
    summary = _summary(prep, records, outcome, test, wall_s=time.time() - start)
    summary.test_split_s = test_split_s
    summary.published = publish_best(
        records.client, cfg, summary, outcome.best, folder, records.trial_records.models, opts.say
    )
    if outcome.repeats:  # the choice by mean, as a study whose best trial it is
        summary.seed_means_study = _record_seed_means(prep, records, outcome)
    record = parent_run_record(summary, outcome.ranked_repeats)
    finish_parent_run(records.client, records.parent_run_id, record, folder)
    study = records.study
    record_chosen(study.storage, study.study_name, records.parent_run_id, outcome.best.trial_id)
    return summary


def _record_seed_means(prep: Prepared, records: Records, outcome: Outcome) -> str:
    """The repeated configurations in the seed-means study (its name tagged on the parent)."""
    study = records.study
    name = record_seed_means(
        study.storage,
        study.study_name,
        records.parent_run_id,
        outcome.repeats,
        prep.primary,
        outcome.best.trial_id,
    )
    records.client.set_tag(records.parent_run_id, OPTUNA_SEED_MEANS_TAG, name)
    return name


def _summary(
    prep: Prepared, records: Records, outcome: Outcome, test: dict[str, float], wall_s: float
) -> SearchSummary:
    cfg, best, run_ids = prep.cfg, outcome.best, records.tracker.run_ids
    return SearchSummary(
        experiment=cfg.tracking.experiment or cfg.name,
        tracking_uri=prep.tracking_uri,
        experiment_id=records.experiment_id,
        parent_run_id=records.parent_run_id,
        best_trial_id=best.trial_id,
        best_run_id=run_ids.get(best.trial_id),
        best_params=best.config,
        metric=prep.primary.name,
        best_validation=best.best_validation(),
        test=test,
        num_trials=outcome.num_trials,
        num_errors=outcome.num_errors,
        storage_path=experiment_path(cfg, records.tune_name),  # a URI (s3://) kept whole
        wall_s=wall_s,
        trial_run_ids=dict(run_ids),
        objectives=prep.objectives,
        pareto=outcome.pareto,
        repeats=outcome.repeats,
        num_pruned=outcome.num_pruned,
        optuna_storage=records.study.storage_url,
        optuna_study=records.study.study_name,
        constraints_met=outcome.constraints_met,
        started_over=outcome.started_over,
        unrecorded=outcome.unrecorded,
        rerun=outcome.rerun,
    )
