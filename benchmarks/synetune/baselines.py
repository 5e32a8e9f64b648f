"""syne-tune's baselines replayed on a raypeft table through syne-tune's own simulator.

Each replay runs a ``syne_tune.Tuner`` over the table exported as a ``BlackboxTabular``
(:func:`benchmarks.synetune.export.blackbox`) behind ``UserBlackboxBackend`` with a
``SimulatorCallback``: trials report the recorded values at the recorded seconds, ``workers``
at a time, on a simulated clock. Every trial of replay ``i`` trains on the recorded seed
raypeft's replay ``i`` uses (:class:`~benchmarks.synetune.curves.Draw`, ``trial_seed:
fixed``), so replays pair with raypeft's by index, and the same seed is held out to score
the choice on. The schedulers optimise ``val_loss`` (what the shipped search's ASHA ranks
on); the choice is raypeft's (the best checkpoint accuracy among the trials that ended).

What syne-tune 0.16.0 ships (``syne_tune.optimizer.baselines``): RandomSearch, ASHA (the
stopping variant: 0.16 has no promotion type), BOHB, ASHABORE, ASHACQR, TPE, REA, BORE,
CQR, BOTorch (needs botorch and torch) and EHVI (multi-objective). MOBSTER, HyperTune, DyHPO
and GP-based BO as separate baselines are not in 0.16.0.
"""

from __future__ import annotations

import math
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from syne_tune import StoppingCriterion, Tuner
from syne_tune.backend.simulator_backend.simulator_callback import SimulatorCallback
from syne_tune.blackbox_repository.simulated_tabular_backend import UserBlackboxBackend
from syne_tune.optimizer import baselines as st
from syne_tune.tuner_logger import TunerLogger

from benchmarks.synetune.curves import Curves, Draw, EndedTrial

METRIC = "val_loss"  # the schedulers' and searchers' metric, minimised
REDUCTION_FACTOR = 3  # the shipped search's ASHA: a third goes on at each rung


@dataclass(frozen=True)
class Setting:
    """What a baseline is built from: the table's space and fidelities, one seed."""

    space: dict
    max_steps: int
    grace_steps: int  # the first evaluation's step: the shipped ASHA's grace period
    seed: int


def _multi_fidelity(cls, **extra) -> Callable[[Setting], object]:
    def build(s: Setting):
        return cls(s.space, metric=METRIC, time_attr="step", max_t=s.max_steps,
                   grace_period=s.grace_steps, reduction_factor=REDUCTION_FACTOR,
                   random_seed=s.seed, do_minimize=True, **extra)  # fmt: skip

    return build


def _single_fidelity(cls) -> Callable[[Setting], object]:
    def build(s: Setting):
        return cls(s.space, metric=METRIC, random_seed=s.seed, do_minimize=True)

    return build


METHODS: dict[str, Callable[[Setting], object]] = {
    "st-random": lambda s: st.RandomSearch(s.space, metrics=[METRIC], random_seed=s.seed),
    "st-asha": _multi_fidelity(st.ASHA),
    "st-asha-3brackets": _multi_fidelity(st.ASHA, brackets=3),
    "st-bohb": _multi_fidelity(st.BOHB),
    "st-asha-bore": _multi_fidelity(st.ASHABORE),
    "st-asha-cqr": _multi_fidelity(st.ASHACQR),
    "st-tpe": _single_fidelity(st.TPE),
    "st-rea": _single_fidelity(st.REA),
    "st-bore": _single_fidelity(st.BORE),
    "st-cqr": _single_fidelity(st.CQR),
}


class _Quiet(TunerLogger):
    """No banner, status table, warning or summary per replay (every ``print_*`` silenced)."""


for _name in [n for n in dir(TunerLogger) if n.startswith("print")]:
    setattr(_Quiet, _name, lambda *args, **kwargs: None)


def replay(curves: Curves, blackbox, method: str, draw: Draw, budget: float,
           workers: int) -> list[EndedTrial]:  # fmt: skip
    """One replay of ``method``: the trials that ended, run until those trials have spent
    more than ``budget`` of the full grid's trial-steps (so every choice within it is
    known)."""
    seed = 1000 * draw.replay + 17  # the searcher's seed; numpy's and random's global ones too
    np.random.seed(seed)
    random.seed(seed)
    setting = Setting(blackbox.configuration_space, curves.max_steps, curves.steps[0], seed)
    grid_steps = len(curves.configurations) * curves.max_steps
    eval_every = curves.steps[0]
    evaluations = math.ceil((budget * grid_steps + workers * curves.max_steps) / eval_every) + 1
    callback = SimulatorCallback()
    backend = UserBlackboxBackend(
        blackbox=blackbox, elapsed_time_attr="elapsed_time", seed=curves.seeds.index(draw.common)
    )
    with tempfile.TemporaryDirectory() as folder:
        os.environ["SYNETUNE_FOLDER"] = folder  # the Tuner writes its results there
        tuner = Tuner(trial_backend=backend, scheduler=METHODS[method](setting),
                      stop_criterion=StoppingCriterion(max_num_evaluations=evaluations),
                      n_workers=workers, sleep_time=0, callbacks=[callback],
                      tuner_name=f"replay-{draw.replay}", save_tuner=False,
                      results_update_interval=1e9, print_update_interval=1e9,
                      output_logger=_Quiet())  # fmt: skip
        tuner.run()
        frame = callback.dataframe()
    return ended_trials(frame, curves)


def ended_trials(frame, curves: Curves) -> list[EndedTrial]:
    """Each trial that ended (stopped by its scheduler or run to the last step), from the
    results the simulator recorded: its row, steps trained, best accuracy, end time."""
    ended = []
    metric = f"val_{curves.metric}"
    sign = curves.sign()
    for trial_id, rows in frame.groupby("trial_id"):
        rows = rows.sort_values("step")
        last = rows.iloc[-1]
        if int(last["step"]) < curves.max_steps and last["st_decision"] != "STOP":
            continue  # still running when the tuner stopped
        best = sign * max(sign * rows[metric])
        config = {k: last[f"config_{k}"] for k in curves.keys}  # the callback prefixes them
        ended.append(
            EndedTrial(
                row=curves.index(config),
                steps=int(last["step"]),
                best=best,
                created=int(trial_id),
                ended_s=float(last["st_tuner_time"]),
            )
        )
    return ended
