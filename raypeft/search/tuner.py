"""The Ray Tune side of a search: the searcher, the scheduler, the Tuner, and running it.

A search runs one Tune experiment (Optuna's searcher and the configured scheduler), and with
``search.repeat_best`` a second one (fixed configurations, run to the end). Both train over
the one copy of the task in Ray's object store and log through the one MLflow tracker; with
``--resume`` each continues the interrupted experiment of its name.
"""

from __future__ import annotations

import math
import pickletools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune
from ray.tune import Callback, ResultGrid
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    MedianStoppingRule,
    TrialScheduler,
)
from ray.tune.search import ConcurrencyLimiter, Searcher

from raypeft.config.schema import ExperimentConfig
from raypeft.methods import BackboneDims
from raypeft.search.interrupts import TuneSignals, raise_if_interrupted
from raypeft.search.objectives import (
    Constraints,
    ResolvedObjective,
    scheduler_target,
    stops_on_objective,
)
from raypeft.search.packs import open_packs, packed_trainable
from raypeft.search.resources import trials_at_once
from raypeft.search.searcher import StudySearcher, discrete_space
from raypeft.search.space import DefineByRun
from raypeft.search.study import StudyPlan, build_sampler
from raypeft.search.superseded import SupersededCheckpoints
from raypeft.search.trial_runners import storage_path, trainable_for, use_ray_train
from raypeft.tracking.callback import MLflowTrialCallback
from raypeft.training.result_keys import EVALUATION_KEY


class TrialNamer:
    """Trial names like ``dept_3f2a1_00004`` in Tune's table and folders (picklable): the
    trial's own method, where the space chooses ``method.name``."""

    def __init__(self, method: str):
        self.method = method

    def __call__(self, trial) -> str:
        return f"{trial.config.get('method.name', self.method)}_{trial.trial_id}"


def max_concurrent(cfg: ExperimentConfig) -> int:
    """``search.max_concurrent``, else as many trials as the cluster's CPUs and (fractional)
    GPUs hold."""
    if cfg.search.max_concurrent:
        return cfg.search.max_concurrent
    return max(1, trials_at_once(cfg, [ray.cluster_resources()]))


def optuna_searcher(
    cfg: ExperimentConfig,
    dims: BackboneDims,
    objectives: list[ResolvedObjective],
    constraints: Constraints,
    study: StudyPlan,
    parent_run_id: str,
) -> ConcurrencyLimiter:
    """Optuna's define-by-run searcher on the persisted study, at most
    :func:`max_concurrent` trials at a time. In a discrete space it answers a configuration
    the study already holds from it instead of training it again."""
    search = StudySearcher(
        DefineByRun(cfg, dims),
        study.storage,
        study.study_name,
        build_sampler(cfg, study.finished_before),
        objectives,
        constraints,
        parent_run_id,
        points_to_evaluate=study.points,
        answer_repeats=cfg.search.answer_repeats and discrete_space(cfg),
        prune_stopped=stops_on_objective(cfg, objectives[0]),
    )
    return ConcurrencyLimiter(search, max_concurrent=max_concurrent(cfg))


def scheduler(cfg: ExperimentConfig, metric: str, mode: str) -> TrialScheduler:
    """The trial scheduler ``search.scheduler`` names (none, median, asha, hyperband), on
    ``search.scheduler.metric`` where set (else ``metric``, the searcher's). Its clock is the
    trial's evaluation count (:data:`EVALUATION_KEY`), not Tune's ``training_iteration``,
    which goes on counting when a trial with a damaged checkpoint starts over from step 0."""
    sched = cfg.search.scheduler
    if sched.type == "none":
        return FIFOScheduler()
    metric, mode = scheduler_target(cfg, metric, mode)
    max_t = cfg.most_evaluations()
    grace = min(sched.grace_period, max_t)
    if sched.type == "median":
        return MedianStoppingRule(
            time_attr=EVALUATION_KEY,
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
    brackets = sched.brackets if sched.type == "hyperband" else 1
    if brackets > 1:
        # Ray draws each new trial's bracket from numpy's global RNG, and its advice for
        # reproducible runs is to seed that in the driver: seeded with search.seed, a search
        # (and each replay of it, raypeft simulate) puts its trials in the same brackets
        np.random.seed(cfg.search.seed)
    return ASHAScheduler(
        time_attr=EVALUATION_KEY,
        metric=metric,
        mode=mode,
        max_t=max_t,
        grace_period=grace,
        reduction_factor=sched.reduction_factor,
        brackets=brackets,
    )


def experiment_path(cfg: ExperimentConfig, name: str) -> str:
    """Where Ray Tune keeps the experiment called ``name`` (a folder or a URI)."""
    storage = storage_path(cfg)
    return f"{storage.rstrip('/')}/{name}" if "://" in storage else str(Path(storage) / name)


# Tune's callback state in an experiment's folder: Ray writes it in a staging folder and copies
# it into the storage path, so a driver killed during the copy leaves it empty or cut short,
# and Tuner.restore then fails with a traceback (ray-project/ray#58179: the same for tuner.pkl)
CALLBACK_STATES = "callback-states-*.pkl"


def readable_pickle(file: Path) -> None:
    """Raise ValueError unless ``file`` holds one whole pickle stream. Its opcodes are read,
    never run (:func:`pickletools.genops`): checking a file must not execute it."""
    with file.open("rb") as stream:
        last = deque(pickletools.genops(stream), maxlen=1)  # raises on a stream cut short
    if not last or last[0][0].name != "STOP":
        raise ValueError(f"{file}: no pickle stream")


def set_aside_damaged_callback_states(path: str) -> list[Path]:
    """Rename the callback-state files of a local experiment folder that cannot be read (to
    ``<name>.damaged``), so that resuming goes on without them: raypeft's MLflow callback finds
    its trials' runs again in the tracking store (``adopt_existing_runs``). Returns them."""
    folder = Path(path)
    if "://" in path or not folder.is_dir():
        return []
    damaged = []
    for file in sorted(folder.glob(CALLBACK_STATES)):
        try:
            readable_pickle(file)
        except ValueError:  # empty, truncated or foreign: Tune could not use it either
            file.rename(file.with_name(f"{file.name}.damaged"))
            damaged.append(file)
    return damaged


def warn_if_storage_not_shared(cfg: ExperimentConfig, say: Callable[[str], None]) -> None:
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


@dataclass
class TuneRunner:
    """Runs the Tune experiments of one search over one copy of its task."""

    cfg: ExperimentConfig
    data_ref: Any  # the tokenised task in Ray's object store (ray.ObjectRef)
    dims: BackboneDims  # the backbone's: a packed trial's prompt shape
    tracker: MLflowTrialCallback  # every trial mirrored to an MLflow run
    trial_records: Callback  # after the tracker: dataset inputs, system metrics, models
    live_table: Callable[[int], Callback] | None  # num_samples -> progress table; None: quiet
    resume: bool  # continue the interrupted experiments instead of starting new ones
    say: Callable[[str], None] = print  # a line for the user

    def callbacks(self, num_samples: int) -> list[Callback]:
        """MLflow logging, and the live table unless quiet; a finished trial's superseded
        checkpoints deleted last, after the others have read its latest."""
        # TuneSignals: Ctrl-C pauses Tune's loop
        own = [self.tracker, self.trial_records, TuneSignals()]
        table = [] if self.live_table is None else [self.live_table(num_samples)]
        return [*own, *table, SupersededCheckpoints()]

    def fit(
        self,
        name: str,
        make_searcher: Callable[[], Searcher],
        make_scheduler: Callable[[], TrialScheduler],
        num_samples: int,
    ) -> ResultGrid:
        """Run the Tune experiment ``name``, or with ``resume`` continue the interrupted one of
        that name: finished trials are kept, unfinished ones continue from their latest
        checkpoints."""
        callbacks = self.callbacks(num_samples)
        path = experiment_path(self.cfg, name)
        # resources.trials_per_worker > 1: this experiment's pack servers, ended with it
        with open_packs(self.cfg, self.data_ref, self.dims) as packs:
            trainable = self._trainable(packs)
            if self.resume and tune.Tuner.can_restore(path):
                for damaged in set_aside_damaged_callback_states(path):
                    self.say(
                        f"{damaged}: cut short when the search was killed; set aside as "
                        f"{damaged.name}.damaged (MLflow's runs are found again from the store)"
                    )
                tuner = tune.Tuner.restore(
                    path,
                    trainable=trainable,
                    resume_unfinished=True,
                    resume_errored=False,  # they failed for good (out of retries)
                )
                # Tuner.restore brings back the callbacks pickled when the search started, and
                # Ray 2.60 takes no new ones; the resumed search must log through this
                # process's tracker (it knows the runs adopted from MLflow). Tune then restores
                # their saved state. Private attribute: tests/integration/test_faults.py
                # covers it.
                tuner._local_tuner.get_run_config().callbacks = callbacks
            else:
                tuner = self._new_tuner(
                    name, trainable, make_searcher(), make_scheduler(), num_samples, callbacks
                )
            results = tuner.fit()
        raise_if_interrupted()  # Tune stopped its loop on Ctrl-C: its results are partial
        return results

    def _trainable(self, packs):
        """Each trial's trainable: packed (a member of a pack of ``packs``) or on its own."""
        if packs is None:
            return trainable_for(self.cfg, self.data_ref)
        return packed_trainable(self.cfg, self.data_ref, packs)

    def _new_tuner(
        self, name, trainable, search_alg, trial_scheduler, num_samples, callbacks
    ) -> tune.Tuner:
        cfg = self.cfg
        return tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=search_alg,
                scheduler=trial_scheduler,
                num_samples=num_samples,
                reuse_actors=not use_ray_train(cfg),
                trial_name_creator=TrialNamer(cfg.method.name),
                trial_dirname_creator=TrialNamer(cfg.method.name),
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=storage_path(cfg),
                callbacks=callbacks,
                # every checkpoint kept by Tune, superseded ones deleted by raypeft when the
                # trial ends (SupersededCheckpoints): with num_to_keep Tune snapshots the
                # whole experiment at every trial checkpoint, quadratic in the trials
                checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
                # a trial whose actor dies restarts from its latest checkpoint (full state)
                failure_config=tune.FailureConfig(max_failures=cfg.run.max_failures),
                verbose=0,  # raypeft's own progress table (ProgressPrinter) instead of Tune's
            ),
        )
