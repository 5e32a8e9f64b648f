"""Assemble and run one search: Ray Tune + Optuna + ASHA over trials that train with Ray.

Flow (see README): validate -> tokenise the task once on the driver -> put it in Ray's
object store -> Tuner with OptunaSearch (define-by-run space) and ASHA -> each trial trains
in-process (one worker) or in a Ray Train TorchTrainer (one or more workers) -> every trial
mirrored to a nested MLflow run -> the best configuration evaluated once on the test split.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule
from ray.tune.search import ConcurrencyLimiter

from raypeft.config.redact import redact_uri
from raypeft.config.schema import ExperimentConfig
from raypeft.data import TokenizedTask, prepare_task
from raypeft.errors import ConfigError
from raypeft.modeling.backbones import backbone_dims, load_config
from raypeft.preflight import check_tracking_store
from raypeft.search.interrupted import (
    CONFIG_HASH_TAG,
    TUNE_PATH_TAG,
    config_hash,
    find_interrupted_search,
)
from raypeft.search.progress import ProgressPrinter
from raypeft.search.publish import open_lineage, publish_best  # issue 16
from raypeft.search.ray_session import init_ray
from raypeft.search.repeats import (
    FixedConfigs,
    RepeatGroup,
    group_repeats,
    repeat_configs,
    top_trials,
)
from raypeft.search.resources import check_fits, cluster_nodes
from raypeft.search.searcher import (
    Constraints,
    PruningAwareSearch,
    ResolvedObjective,
    build_sampler,
    default_storage,
    fail_orphans,
    open_storage,
    pareto_front,
    prepare_study,
    remaining_grid_points,
    resolve_constraints,
    resolve_objectives,
)
from raypeft.search.space import DefineByRun, candidate_methods
from raypeft.search.trial_records import TrialRecordsCallback  # issue 16
from raypeft.search.trial_runners import storage_path, trainable_for, use_ray_train
from raypeft.tracking.callback import (
    MLflowTrialCallback,
    finish_parent_run,
    open_experiment,
    start_parent_run,
)
from raypeft.tracking.runs import DEFAULT_TRACKING_URI, check_store
from raypeft.training.loop import evaluate, load_checkpoint, split_dataset
from raypeft.training.result_keys import FAILURE_KEY


@dataclass
class SearchSummary:
    """What a finished search found, and where its records are."""

    experiment: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    best_trial_id: str
    best_run_id: str | None
    best_params: dict[str, Any]
    metric: str
    best_validation: dict[str, float]
    test: dict[str, float]
    num_trials: int
    num_errors: int
    storage_path: str
    wall_s: float
    trial_run_ids: dict[str, str] = field(default_factory=dict)
    objectives: list[ResolvedObjective] = field(default_factory=list)
    pareto: list[dict[str, Any]] = field(default_factory=list)  # multi-objective searches
    repeats: list[RepeatGroup] = field(default_factory=list)  # search.repeat_best
    num_pruned: int = 0
    optuna_storage: str = ""
    optuna_study: str = ""
    constraints_met: bool = True
    published: Any = None  # issue 16: the chosen model in MLflow (search.publish.Published)


# ----------------------------------------------------------------------------- trials


class TrialNamer:
    """Trial names like ``dept_3f2a1_00004`` in Tune's table and folders (picklable): the
    trial's own method, where the space chooses ``method.name``."""

    def __init__(self, method: str):
        self.method = method

    def __call__(self, trial) -> str:
        return f"{trial.config.get('method.name', self.method)}_{trial.trial_id}"


def _max_concurrent(cfg: ExperimentConfig) -> int:
    if cfg.search.max_concurrent:
        return cfg.search.max_concurrent
    res = cfg.resources
    cluster = ray.cluster_resources()
    fits = cluster.get("CPU", 1) // (res.workers_per_trial * res.cpus_per_worker)
    if res.use_gpu:
        fits = min(fits, cluster.get("GPU", 0) // res.workers_per_trial)
    return max(1, int(fits))


@dataclass
class StudyPlan:
    """Where the Optuna study lives and what is left of its grid."""

    storage_url: str
    storage: Any  # the opened optuna RDBStorage, handed to the searcher
    study_name: str
    points: list[dict[str, Any]]  # grid points still to run (all of them in a new study)
    finished_before: int  # trials of earlier searches of the same study


def plan_study(
    cfg: ExperimentConfig, tracking_uri: str, modes: list[str], resuming: bool = False
) -> StudyPlan:
    """Open (or create) the persisted study; skip grid points an earlier search ran."""
    url = cfg.search.storage or default_storage(tracking_uri)
    name = cfg.search.study_name or cfg.tracking.experiment or cfg.name
    storage = open_storage(url)  # opened once: prepared here, then used by the searcher
    finished = prepare_study(storage, name, modes, resuming=resuming)
    grid = [] if cfg.search.sampler == "grid" else cfg.grid_points()
    return StudyPlan(url, storage, name, remaining_grid_points(grid, finished), len(finished))


def _searcher(
    cfg: ExperimentConfig,
    dims,
    objectives: list[ResolvedObjective],
    constraints: Constraints,
    plan: StudyPlan,
    parent_run_id: str,
):
    multi = len(objectives) > 1
    search = PruningAwareSearch(
        space=DefineByRun(cfg, dims),
        metric=[o.result_key for o in objectives] if multi else objectives[0].result_key,
        mode=[o.mode for o in objectives] if multi else objectives[0].mode,
        sampler=build_sampler(cfg),
        points_to_evaluate=plan.points or None,
        storage=plan.storage,
        study_name=plan.study_name,
        max_steps=cfg.train.max_steps,
        objectives=objectives,
        constraints=constraints,
        parent_run_id=parent_run_id,
    )
    return ConcurrencyLimiter(search, max_concurrent=_max_concurrent(cfg))


def _scheduler(cfg: ExperimentConfig, metric: str, mode: str):
    sched = cfg.search.scheduler
    if sched.type == "none":
        return FIFOScheduler()
    # one Tune iteration = one evaluation (every train.eval_every steps)
    max_t = math.ceil(cfg.train.max_steps / cfg.train.eval_every)
    grace = min(sched.grace_period, max_t)
    if sched.type == "median":
        return MedianStoppingRule(
            time_attr="training_iteration",
            metric=metric,
            mode=mode,
            grace_period=grace,
            min_samples_required=sched.min_samples_required,
            # never pause a trial to let a waiting one run: a paused function trainable would
            # start again from step 0 (its checkpoints keep the best weights, not the
            # optimizer), and could cycle forever
            min_time_slice=math.inf,
        )
    # asha; hyperband = asynchronous HyperBand: ASHA over several brackets. (Ray's synchronous
    # HyperBandScheduler pauses and resumes trials, which needs resumable optimizer state.)
    return ASHAScheduler(
        time_attr="training_iteration",
        metric=metric,
        mode=mode,
        max_t=max_t,
        grace_period=grace,
        reduction_factor=sched.reduction_factor,
        brackets=sched.brackets if sched.type == "hyperband" else 1,
    )


def _quiet_loggers() -> None:
    """Library chatter the user cannot act on (MLflow table creation, new Optuna studies)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)


class SearchFailed(RuntimeError):
    """No trial produced a result (every trial failed); the message says where to look."""


def _build_tuner(cfg, data_ref, search_alg, scheduler, num_samples, callbacks, name: str):
    return tune.Tuner(
        trainable_for(cfg, data_ref),
        tune_config=tune.TuneConfig(
            search_alg=search_alg,
            scheduler=scheduler,
            num_samples=num_samples,
            reuse_actors=not use_ray_train(cfg),
            trial_name_creator=TrialNamer(cfg.method.name),
            trial_dirname_creator=TrialNamer(cfg.method.name),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path(cfg),
            callbacks=callbacks,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            # a trial whose actor dies restarts from its latest checkpoint (full state)
            failure_config=tune.FailureConfig(max_failures=cfg.run.max_failures),
            verbose=0,  # raypeft's own progress table (ProgressPrinter) instead of Tune's
        ),
    )


def _warn_if_storage_not_shared(cfg: ExperimentConfig, say) -> None:
    """Trials on other machines write their checkpoints to their own disks when
    ``run.storage_path`` is a local folder; the driver then cannot read them."""
    if "://" in storage_path(cfg):
        return
    machines = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    if len(machines) > 1:
        say(
            f"  warning: run.storage_path {storage_path(cfg)} is a local folder, but the "
            f"cluster spans {len(machines)} machines: give shared storage (s3://..., NFS)"
        )


def check_batch_fits(cfg: ExperimentConfig, data: TokenizedTask) -> None:
    """Every trial needs at least one full global batch of training examples (the largest
    ``train.batch_size`` the space can sample, when it searches the batch size)."""
    sizes = [cfg.train.batch_size]
    param = cfg.space.get("train.batch_size")
    if param is not None:
        sizes += [v for v in _discrete_values(param) if isinstance(v, int)]
    examples = data.size("train")
    if max(sizes) > examples:
        raise ConfigError(
            f"train.batch_size: `batch_size <= {examples}` (the training examples) must hold, "
            f"but got {max(sizes)}"
        )


def _discrete_values(param) -> list:
    dumped = param.model_dump()
    if "grid" in dumped or "choice" in dumped:
        return list(dumped.get("grid") or dumped.get("choice"))
    if "int" in dumped:
        return [dumped["int"][1]]  # the largest
    return []


def experiment_path(cfg: ExperimentConfig, name: str) -> str:
    """Where Ray Tune keeps the experiment called ``name`` (a folder or a URI)."""
    storage = storage_path(cfg)
    return f"{storage.rstrip('/')}/{name}" if "://" in storage else str(Path(storage) / name)


def _tag_parent(client, parent_run_id, cfg, objectives, plan, name) -> None:
    """What `raypeft report`, `predict`, `--resume` and optuna-dashboard users need."""
    primary = objectives[0]
    tags = {
        "raypeft.metric": primary.name,
        "raypeft.mode": primary.mode,
        "raypeft.optuna_storage": redact_uri(plan.storage_url),
        "raypeft.optuna_study": plan.study_name,
        TUNE_PATH_TAG: redact_uri(experiment_path(cfg, name)),
        CONFIG_HASH_TAG: config_hash(cfg),
    }
    if len(objectives) > 1:
        tags["raypeft.objectives"] = json.dumps(
            [{"metric": o.name, "mode": o.mode} for o in objectives]
        )
    client.log_batch(parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def _fit(cfg, data_ref, make_searcher, make_scheduler, num_samples, callbacks, name, resume):
    """Run a Tune experiment, or with ``resume`` continue the interrupted one of that name:
    finished trials are kept, unfinished ones continue from their latest checkpoints."""
    path = experiment_path(cfg, name)
    if resume and tune.Tuner.can_restore(path):
        tuner = tune.Tuner.restore(
            path,
            trainable=trainable_for(cfg, data_ref),
            resume_unfinished=True,
            resume_errored=False,  # they failed for good (out of retries)
        )
        # Tuner.restore brings back the callbacks pickled when the search started, and Ray
        # 2.60 takes no new ones; the resumed search must log through this process's tracker
        # (it knows the runs adopted from MLflow). Tune then restores their saved state.
        tuner._local_tuner.get_run_config().callbacks = callbacks
    else:
        tuner = _build_tuner(
            cfg, data_ref, make_searcher(), make_scheduler(), num_samples, callbacks, name
        )
    return tuner.fit()


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
            method.warm_up(cfg.model)
    for key, spec in specs.items():
        if key in data.features:
            continue
        start = time.perf_counter()
        data.features[key] = {
            split: spec.compute(data.texts[split], arrays, cfg.model)
            for split, arrays in data.splits.items()
        }
        say(f"  computed {key} once for all trials ({time.perf_counter() - start:.1f} s)")


def score_on_test(cfg: ExperimentConfig, data: TokenizedTask, folder: Path) -> dict[str, float]:
    """Evaluate a checkpoint once on the test split (the chosen configuration only)."""
    torch.set_num_threads(os.cpu_count() or 1)
    trial_cfg, model = load_checkpoint(folder, data)
    scores = evaluate(
        model,
        split_dataset(data, trial_cfg, "test"),
        data.spec.metrics,
        cfg.train.eval_batch_size,
        torch.device("cpu"),
    )
    test = {f"test_{k}": v for k, v in scores.items()}
    if data.spec.problem == "classification":
        # what always answering the most frequent test label scores: the bar to beat
        counts = np.bincount(data.splits["test"]["labels"])
        test["test_majority_class_accuracy"] = float(counts.max() / counts.sum())
    return test


Row = tuple[str, dict, dict]  # (trial id, Tune config, last result)


def _rows(results) -> list[Row]:
    """``(trial id, config, last metrics)`` of every trial that reported anything."""
    return [
        (r.metrics["trial_id"], dict(r.config), dict(r.metrics))
        for r in results
        if r.metrics and "trial_id" in r.metrics
    ]


def choose_best(
    rows: list[Row], objective: ResolvedObjective, constraints: Constraints
) -> tuple[Row | None, bool]:
    """The best row by the primary objective among those meeting the constraints.

    Returns ``(row, constraints_met)``; when no trial meets them, the best of all is returned
    with ``False`` (the summary says so).
    """
    key, sign = objective.result_key, (1 if objective.mode == "max" else -1)
    scored = [
        r for r in rows if isinstance(r[2].get(key), (int, float)) and math.isfinite(r[2][key])
    ]
    feasible = [r for r in scored if constraints.feasible(r[2])]
    pool = feasible or scored
    if not pool:
        return None, False
    return max(pool, key=lambda r: sign * r[2][key]), bool(feasible) or not constraints


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
    say = (lambda *_: None) if quiet else printer
    _quiet_loggers()
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    check_tracking_store(uri, redact_uri(uri))  # first: a dead server fails in seconds
    client = interrupted = None
    if resume:  # resuming needs the store (never create an empty one) and a search in it
        try:
            check_store(uri)
        except ConfigError as exc:
            raise ConfigError(f"--resume: {exc}") from None
        client = MlflowClient(tracking_uri=uri)
        interrupted = find_interrupted_search(client, cfg, source)

    say(f"Preparing task {cfg.task.name!r} for {cfg.model.name} (s={cfg.model.max_length}) ...")
    data = prepare_task(cfg.task, cfg.model)
    check_batch_fits(cfg, data)
    objectives = resolve_objectives(cfg, data.spec.metrics)
    constraints = resolve_constraints(cfg, data.spec.metrics)
    primary = objectives[0]
    metric, tune_metric, mode = primary.name, primary.result_key, primary.mode
    config = load_config(cfg.model, data.num_labels, data.spec.problem)
    dims = backbone_dims(config, cfg.model.max_length, cfg.model.name)
    sizes = "/".join(str(data.size(split)) for split in ("train", "validation", "test"))
    say(f"  train/validation/test: {sizes} examples, {data.num_labels} labels, {metric} ({mode})")
    # shared per-example features and artefacts (IPT's corpus) before anything is recorded:
    # what fails here leaves no store, study or run behind
    precompute_features(cfg, data, say)

    if address:  # a cluster: can it ever place one trial? (locally the CLI checked already)
        init_ray(address, quiet)
        try:
            check_fits(cfg, cluster_nodes(), where=f"the cluster at {address}")
        except ConfigError:
            ray.shutdown()
            raise

    # the MLflow store and the Optuna study are opened (created) from here on
    plan = plan_study(cfg, uri, [o.mode for o in objectives], resuming=interrupted is not None)
    client = client or MlflowClient(tracking_uri=uri)  # creates a sqlite store's file
    if not address:  # a local Ray, once nothing in the input can fail any more
        init_ray(None, quiet)
    if plan.finished_before and not interrupted:
        skipped = len(cfg.grid_points()) - len(plan.points) if cfg.search.sampler != "grid" else 0
        say(
            f"  continuing Optuna study {plan.study_name!r} ({redact_uri(plan.storage_url)}): "
            f"{plan.finished_before} earlier trials"
            + (f", {skipped} grid points already run" if skipped else "")
        )

    if interrupted:
        experiment_id, parent = interrupted
        parent_run_id = parent.info.run_id
        client.update_run(parent_run_id, status="RUNNING")
        tune_path = parent.data.tags[TUNE_PATH_TAG]
        name = tune_path.rstrip("/").rsplit("/", 1)[-1]
        say(f"Resuming search {parent_run_id} from {tune_path} ...")
    else:
        experiment_id = open_experiment(client, cfg.tracking.experiment or cfg.name)
        parent_run_id = start_parent_run(client, experiment_id, cfg, source)
        name = f"{cfg.name}-{parent_run_id[:8]}"
        _tag_parent(client, parent_run_id, cfg, objectives, plan, name)
    tracker = MLflowTrialCallback(client, experiment_id, parent_run_id, cfg, dims)
    if interrupted:
        tracker.adopt_existing_runs()  # its trials continue their own runs

    def callbacks(num_samples: int) -> list:
        """MLflow logging, and the live table unless quiet."""
        if quiet:
            return [tracker, records]
        printer_cb = ProgressPrinter(
            list(cfg.space),
            tune_metric,
            mode,
            num_samples,
            cfg.train.max_steps,
            interval=progress_interval,
            echo=printer,
        )
        return [tracker, records, printer_cb]

    try:
        # issue 16: dataset inputs (the parent now, each trial as it starts), system metrics,
        # the experiment's UI view, and pyfunc models of trials (tracking.log_models: all)
        inputs = open_lineage(client, experiment_id, parent_run_id, cfg, data, objectives)
        records = TrialRecordsCallback(tracker, inputs, cfg.tracking.log_models)
        _warn_if_storage_not_shared(cfg, say)
        data_ref = ray.put(data)  # tokenised once; every trial reads this one copy
        say(
            f"Searching: {cfg.search.num_samples} trials, sampler {cfg.search.sampler}, "
            f"scheduler {cfg.search.scheduler.type} ..."
        )
        results = _fit(
            cfg,
            data_ref,
            lambda: _searcher(cfg, dims, objectives, constraints, plan, parent_run_id),
            lambda: _scheduler(cfg, tune_metric, mode),
            cfg.search.num_samples,
            callbacks(cfg.search.num_samples),
            name,
            resume=interrupted is not None,
        )
        tracker.collect_results(results)
        if interrupted:
            fail_orphans(plan.storage, plan.study_name, parent_run_id)
        rows = _rows(results)
        failed = [r for r in rows if FAILURE_KEY in r[2]]
        errors = len(results.errors) + len(failed)
        rows = [r for r in rows if FAILURE_KEY not in r[2]]
        best, constraints_met = choose_best(rows, primary, constraints)
        if best is None:
            reasons = [str(e).strip().splitlines()[-1] for e in results.errors if str(e).strip()]
            reasons += [str(r[2][FAILURE_KEY]) for r in failed]
            first = reasons[0] if reasons else "no error"
            raise SearchFailed(
                f"no trial reported {tune_metric}: {errors} of {len(results)} trials failed "
                f"(first: {first[:300]}); see MLflow run {parent_run_id}"
            )
        pruned = sum(1 for r in rows if r[2].get("step", 0) < cfg.train.max_steps)
        pareto = _pareto(rows, objectives, constraints, cfg.train.max_steps, tracker)

        repeats: list[RepeatGroup] = []
        if cfg.search.repeat_best:
            repeats = _run_repeats(
                cfg,
                data_ref,
                rows,
                primary,
                constraints,
                callbacks,
                name,
                say,
                tracker,
                resume=interrupted is not None,
            )
            ranked = sorted(repeats, key=lambda g: g.mean, reverse=mode == "max")
            chosen = ranked[0]
            best = next(r for r in rows if r[0] == chosen.trial_id)
        best_trial_id, best_config, best_metrics = best
        best_val = {
            k[len("best_") :]: v
            for k, v in best_metrics.items()
            if k.startswith("best_val_") and isinstance(v, (int, float))
        }
        folder = tracker.best_checkpoint_dir(best_trial_id)
        test = {}
        if folder is not None:
            say("Evaluating the best configuration on the test split ...")
            test = score_on_test(cfg, data, folder)
        if repeats:
            test.update(_test_over_seeds(cfg, data, ranked[0], tracker, say))
        summary = SearchSummary(
            experiment=cfg.tracking.experiment or cfg.name,
            tracking_uri=uri,
            experiment_id=experiment_id,
            parent_run_id=parent_run_id,
            best_trial_id=best_trial_id,
            best_run_id=tracker.run_ids.get(best_trial_id),
            best_params=best_config,
            metric=metric,
            best_validation=best_val,
            test=test,
            num_trials=len(results),
            num_errors=errors,
            storage_path=str(Path(storage_path(cfg)) / name),
            wall_s=time.time() - start,
            trial_run_ids=dict(tracker.run_ids),
            objectives=objectives,
            pareto=pareto,
            repeats=repeats,
            num_pruned=pruned,
            optuna_storage=plan.storage_url,
            optuna_study=plan.study_name,
            constraints_met=constraints_met,
        )
        extra = {
            "num_trials": summary.num_trials,
            "num_failed_trials": errors,
            "num_pruned_trials": pruned,
        }
        for i, group in enumerate(ranked if repeats else []):
            extra[f"repeat_{i}_mean_val_{metric}"] = group.mean
            extra[f"repeat_{i}_std_val_{metric}"] = group.std
        summary.published = publish_best(  # issue 16: pyfunc model, registry version, alias
            client,
            cfg,
            parent_run_id=parent_run_id,
            run_id=summary.best_run_id,
            trial_id=best_trial_id,
            folder=folder,
            objective=primary,
            best_metrics=best_metrics,
            test=test,
            logged=records.models,
            say=say,
        )
        finish_parent_run(
            client,
            parent_run_id,
            {
                "trial_id": best_trial_id,
                "run_id": summary.best_run_id,
                "config": summary.best_params,
                "metrics": {**{f"best_{k}": v for k, v in best_val.items()}, **test, **extra},
                "tables": _tables(summary),
            },
            folder,
        )
        return summary
    except BaseException:
        if client.get_run(parent_run_id).info.status == "RUNNING":
            client.set_terminated(parent_run_id, "FAILED")
        raise


def _pareto(
    rows: list[Row],
    objectives: list[ResolvedObjective],
    constraints: Constraints,
    max_steps: int,
    tracker: MLflowTrialCallback,
) -> list[dict[str, Any]]:
    """Multi-objective searches: the trials on the Pareto front (full-length, feasible)."""
    if len(objectives) < 2:
        return []
    full = [
        r
        for r in rows
        if r[2].get("step", 0) >= max_steps
        and constraints.feasible(r[2])
        and all(isinstance(r[2].get(o.result_key), (int, float)) for o in objectives)
    ]
    front = [full[i] for i in pareto_front([r[2] for r in full], objectives)]
    out = []
    for trial_id, config, metrics in front:
        run_id = tracker.run_ids.get(trial_id)
        if run_id:
            tracker.client.set_tag(run_id, "raypeft.pareto_front", "true")
        out.append(
            {
                "trial_id": trial_id,
                "run_id": run_id,
                "method": config.get("method.name", tracker.base.method.name),
                **{o.name: metrics[o.result_key] for o in objectives},
            }
        )
    return sorted(out, key=lambda p: p[objectives[0].name], reverse=objectives[0].mode == "max")


def _run_repeats(cfg, data_ref, rows, primary, constraints, callbacks, name, say, tracker, resume):
    """Train the top configurations again with more seeds (``search.repeat_best``)."""
    spec = cfg.search.repeat_best
    feasible = [r for r in rows if constraints.feasible(r[2])] or rows
    top = top_trials(feasible, primary.result_key, primary.mode, spec.top_k, cfg.train.max_steps)
    configs = repeat_configs(top, cfg.train.seed, spec.seeds)
    say(f"Repeating the top {len(top)} configurations with {spec.seeds} more seeds each ...")
    results = _fit(
        cfg,
        data_ref,
        lambda: ConcurrencyLimiter(
            FixedConfigs(configs, primary.result_key, primary.mode),
            max_concurrent=_max_concurrent(cfg),
        ),
        FIFOScheduler,  # repeats run to the end: their scores are compared as means
        len(configs),
        callbacks(len(configs)),
        f"{name}-repeats",
        resume=resume,
    )
    tracker.collect_results(results)
    return group_repeats(top, _rows(results), primary.result_key, cfg.train.seed)


def _test_over_seeds(cfg, data, group: RepeatGroup, tracker, say) -> dict[str, float]:
    """Test metrics of every seed of the chosen configuration: mean and std."""
    say(f"Evaluating the chosen configuration's {len(group.trial_ids)} seeds on the test split ...")
    per_seed: dict[str, list[float]] = {}
    for trial_id in group.trial_ids.values():
        folder = tracker.best_checkpoint_dir(trial_id)
        if folder is None:
            continue
        for key, value in score_on_test(cfg, data, folder).items():
            per_seed.setdefault(key, []).append(value)
    out = {}
    for key, values in per_seed.items():
        if key.endswith(("_loss", "samples_per_s", "majority_class_accuracy")):
            continue
        out[f"{key}_mean"] = statistics.fmean(values)
        out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        out[f"{key}_seeds"] = float(len(values))
    return out


def _tables(summary: SearchSummary) -> dict[str, Any]:
    """JSON artefacts of the parent run: the Pareto front and the repeated seeds."""
    tables: dict[str, Any] = {}
    if summary.pareto:
        tables["pareto_front.json"] = summary.pareto
    if summary.repeats:
        tables["repeats.json"] = [
            {
                "trial_id": g.trial_id,
                "mean": g.mean,
                "std": g.std,
                "scores_by_seed": g.scores,
                "trials_by_seed": g.trial_ids,
                "config": g.config,
            }
            for g in summary.repeats
        ]
    return tables
