"""Replay trials (``resources.trial_runner: replay``): a whole search without training.

Each trial reports the learning curve a table (``raypeft table``) recorded for its
configuration: the recorded validation values at each evaluation, after the recorded seconds
times ``replay.time_scale``, with a checkpoint of the files and size a real trial writes
(the configuration's model as built, untrained; its optimizer state). Everything downstream
is the code a real search runs: the Tuner, the Optuna study, the scheduler, the MLflow runs,
the live table, repeats, the registry and the summary. Only the training step is replaced.

Which curve a trial reports: its configuration's recorded curves sorted by seed, the one at
``train.seed`` modulo their number. A table recorded at seeds 0, 1, 2 replays seed ``s`` for
``train.seed: s`` (s < 3); ``search.trial_seed: per_trial`` and the repeats of
``search.repeat_best`` (train.seed + i) thus report other recorded seeds, as they would train
with other seeds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from raypeft.config.dotted import flatten
from raypeft.config.schema import ExperimentConfig, trial_config
from raypeft.config.space import SEED_KEY, configuration_key
from raypeft.data import TokenizedTask
from raypeft.data.tasks import resolve_task_spec
from raypeft.errors import ConfigError
from raypeft.modeling.build import build_model
from raypeft.modeling.precision import resolve_precision
from raypeft.search.simulate.plan import configurations_of, fixed_values
from raypeft.search.simulate.table import Curve, CurveTable
from raypeft.training.checkpoints import restore_trial, write_trial_checkpoint
from raypeft.training.evaluation import TargetMetric, best_record, evaluation_metrics
from raypeft.training.loop import checkpoint_folder
from raypeft.training.optimizer import build_optimizer, build_scheduler
from raypeft.training.result_keys import PRECISION_KEY, TRIAL_STEPS_KEY
from raypeft.training.resume import LoopState


def load_replay_table(cfg: ExperimentConfig) -> CurveTable:
    """The table ``replay.table`` names (a one-line ConfigError naming the key when it is
    missing or not a table)."""
    try:
        return CurveTable.load(Path(cfg.replay.table).expanduser())
    except ConfigError as exc:
        raise ConfigError(f"replay.table: {exc}") from None


def check_replayable(cfg: ExperimentConfig, table: CurveTable) -> None:
    """Every trial the search can run has a recorded curve, of the same evaluations: the
    space searches keys the table varies over values it holds (its grid, or part of it), the
    keys it varies but the space does not are fixed at a recorded value, the training length
    and the searched metric are the recording's. One-line ConfigError naming the key."""
    held = table.space()
    for key, entry in cfg.space.items():
        if key == SEED_KEY:
            continue  # any seed replays one of the recorded seeds (module docstring)
        listed = entry.listed()
        if key not in held:
            raise ConfigError(
                f"space.{key}: replay.table does not vary it (it varies "
                f"{', '.join(sorted(held))}); the space must be the table's grid or part of it"
            )
        if listed is None:
            raise ConfigError(
                f"space.{key}: a range, but replay.table holds the points {held[key]}; search "
                "them as grid or choice"
            )
        missing = [v for v in listed if v not in held[key]]
        if missing:
            raise ConfigError(
                f"space.{key}: {missing} not in replay.table, which holds {held[key]}"
            )
    for key, value in fixed_values(cfg, table).items():
        if value not in held[key]:
            raise ConfigError(
                f"{key}: {value!r}, but replay.table recorded only {held[key]}; search it "
                f"(space.{key}) or set one of them"
            )
    recorded = table.by_configuration()
    for key in sorted(configurations_of(cfg, table)):
        if key not in recorded:
            raise ConfigError(f"replay.table: no curve for {key} (a recording still under way?)")
    _check_same_evaluations(cfg, table)


def _check_same_evaluations(cfg: ExperimentConfig, table: CurveTable) -> None:
    """A replayed trial reports the recorded evaluations: the file must say so (the schedulers'
    rungs and the records follow train.max_steps and train.eval_every), and search the
    recorded metric."""
    recorded = table.config.train
    for key in ("max_steps", "eval_every"):
        mine, theirs = getattr(cfg.train, key), getattr(recorded, key)
        if mine != theirs or f"train.{key}" in cfg.space:
            raise ConfigError(
                f"train.{key}: {mine}, but replay.table recorded {theirs} (train.max_steps "
                f"{recorded.max_steps}, train.eval_every {recorded.eval_every}); a replay "
                f"reports the recorded evaluations: set train.{key}={theirs}"
            )
    target = TargetMetric.of(cfg, resolve_task_spec(cfg.task).primary_metric)
    if target.name != table.metric:
        raise ConfigError(
            f"search.metric: {target.name}, but replay.table recorded val_{table.metric} and "
            f"val_loss; search {table.metric}"
        )


def replayed_curve(table: CurveTable, cfg: ExperimentConfig) -> Curve:
    """The recorded curve a trial of ``cfg`` (its full config) reports: its configuration's
    curves sorted by seed, the one at ``train.seed`` modulo their number."""
    flat = flatten(cfg.model_dump(mode="json"))
    key = configuration_key({k: flat[k] for k in table.space()})
    curves = sorted(table.by_configuration()[key], key=lambda c: c.seed)
    return curves[cfg.train.seed % len(curves)]


class ReplayedTrainer:
    """What a replayed trial holds to write real checkpoints: the configuration's model (as
    built, untrained), its optimizer with state and schedule, and the loop's counters."""

    def __init__(self, cfg: ExperimentConfig, task: TokenizedTask):
        self.cfg, self.task = cfg, task
        torch.manual_seed(cfg.train.seed)
        self.precision = resolve_precision(cfg.train.precision, "cpu", strict=False)
        self.model = build_model(cfg, task, precision=self.precision)
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg.train)
        # one step on zero gradients: AdamW then holds its moments, so resume/ has the size
        # a trained trial's has (a checkpoint's size is part of what a search costs)
        for param in self.model.parameters():
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loop = LoopState()

    def restore(self, folder: Path | None) -> None:
        """A restarted trial goes on after the evaluation its checkpoint holds."""
        self.loop = restore_trial(folder, self.model, self.optimizer, self.scheduler)

    def report(self, metrics: dict[str, Any]) -> None:
        """Report ``metrics`` to Tune with a checkpoint written as a real trial writes it."""
        with checkpoint_folder() as folder:
            write_trial_checkpoint(
                folder, self.model, self.cfg, self.task, self.optimizer, self.scheduler, self.loop
            )
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


def replay_metrics(
    trainer: ReplayedTrainer, curve: Curve, k: int, target: TargetMetric, wall_s: float
) -> dict[str, Any]:
    """What the trial reports at its ``k``-th recorded evaluation: the keys a trained trial
    reports, the recorded values in them (nothing trained, so no training loss)."""
    step = curve.steps[k]
    val = {name.removeprefix("val_"): values[k] for name, values in curve.values.items()}
    loop = trainer.loop
    loop.step, loop.wall_time = step, wall_s
    if target.improves(val, loop.best):
        loop.keep_best(best_record(val, step), trainer.model.trainable_state_dict())
    metrics = evaluation_metrics(target, val, loop.best, float("nan"), step)
    model = trainer.model
    metrics.update(
        {
            "trainable_params": model.method.config.num_params(model.dims),
            "wall_time_s": wall_s,
            PRECISION_KEY: trainer.precision,
            TRIAL_STEPS_KEY: curve.steps[-1],
        }
    )
    return metrics


def trial_replayed(
    config: dict, *, base: dict, data_ref: list, table: CurveTable, time_scale: float
) -> None:
    """Tune function trainable: report the recorded curve of the trial's configuration, each
    evaluation after its recorded seconds times ``time_scale`` from the trial's start."""
    started = time.perf_counter()
    cfg = trial_config(ExperimentConfig.model_validate(base), config)
    curve = replayed_curve(table, cfg)
    trainer = ReplayedTrainer(cfg, ray.get(data_ref[0]))
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:  # restarted (a lost worker, `raypeft tune --resume`)
        with checkpoint.as_directory() as folder:
            trainer.restore(Path(folder))
    done = trainer.loop.step
    offset = max([w for s, w in zip(curve.steps, curve.wall_s, strict=True) if s <= done] or [0])
    target = TargetMetric.of(cfg, trainer.task.spec.primary_metric)
    for k, step in enumerate(curve.steps):
        if step <= done:
            continue
        wait = started + (curve.wall_s[k] - offset) * time_scale - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        wall = trainer.loop.wall_before + time.perf_counter() - started
        trainer.report(replay_metrics(trainer, curve, k, target, wall))
