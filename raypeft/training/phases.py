"""Where a trial's seconds go, measured where they are spent (``time.perf_counter``).

A :class:`PhaseTimer` adds up the seconds of named phases. A trial's own (its process: setup,
model, data, steps, evaluations, checkpoints, reports) travel in every result it reports,
cumulative since the trial's function was entered, under ``phase_s/<name>``
(:meth:`PhaseTimer.result`); the driver's share (MLflow records, Optuna's ask, reports and
tell) is kept per trial by the objects that spend it (:func:`timed_phase`) and handed to the
search's summary. ``benchmarks.device.trial_phases`` prints them as a table.

Only the standard library is imported: the training loop runs where Ray is absent.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from raypeft.training.result_keys import PHASE_PREFIX


class PhaseTimer:
    """Seconds per named phase, added up over every time the phase was entered; and when
    (``time.time()``) each phase a driver's hook timed was first entered (``marks``: a trial's
    start and end as the driver saw them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.marks: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` more to phase ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as (more of) phase ``name``; an error inside still counts."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def timed(self, name: str, items: Iterator) -> Iterator:
        """``items`` as they come, the time spent producing each counted to ``name`` (the
        batches of a data loader: the time between the steps, not the steps)."""
        while True:
            with self.phase(name):
                item = next(items, _END)
            if item is _END:
                return
            yield item

    def result(self) -> dict[str, float]:
        """The phases so far as result keys: ``{"phase_s/<name>": seconds}``."""
        return {f"{PHASE_PREFIX}{name}": seconds for name, seconds in self.seconds.items()}


_END = object()  # what next() returns once the iterator is exhausted


def phases_of(result: dict) -> dict[str, float]:
    """The phases a trial's result carries, by name (``phase_s/`` taken off)."""
    return {k[len(PHASE_PREFIX) :]: v for k, v in result.items() if k.startswith(PHASE_PREFIX)}


def timed_phase(name: str) -> Callable[[Callable], Callable]:
    """Decorate a driver's hook (a Tune callback's or a searcher's) so that each call's
    seconds count to phase ``name`` of the trial it is about, in the instance's ``phase_s``
    (a ``dict`` trial id -> :class:`PhaseTimer`). The trial is the hook's ``trial`` (a
    callback's, passed by keyword as Tune does) or its first argument ``trial_id`` (a
    searcher's)."""

    def decorate(method: Callable) -> Callable:
        @functools.wraps(method)
        def timed(self, *args, **kwargs):
            # an object unpickled from a search started before it had phase_s (a resumed
            # search's searcher, as Tune saved it) gets one here
            timers = self.__dict__.setdefault("phase_s", {})
            timer = timers.setdefault(_trial_id(args, kwargs), PhaseTimer())
            timer.marks.setdefault(name, time.time())
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                timer.add(name, time.perf_counter() - start)

        return timed

    return decorate


def _trial_id(args: tuple, kwargs: dict) -> str:
    """The trial a hook's call is about: Tune calls callbacks' hooks by keyword
    (``trial=``), searchers' with the trial id first."""
    trial = kwargs.get("trial", args[2] if len(args) > 2 else None)
    if trial is not None and hasattr(trial, "trial_id"):
        return trial.trial_id
    return str(kwargs.get("trial_id", args[0] if args else ""))


def merged(*timers: dict[str, PhaseTimer]) -> dict[str, PhaseTimer]:
    """The driver's phases of each trial, from every object that timed some (their phase
    names differ): trial id -> one :class:`PhaseTimer`."""
    out: dict[str, PhaseTimer] = {}
    for by_trial in timers:
        for trial_id, timer in by_trial.items():
            into = out.setdefault(trial_id, PhaseTimer())
            into.seconds.update(timer.seconds)
            into.marks.update(timer.marks)
    return out
