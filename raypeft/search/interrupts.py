"""Ctrl-C (SIGINT) and ``kill`` (SIGTERM) during a search: the first pauses it, a second stops
it at once. Either way the search stays resumable with ``raypeft tune ... --resume``.

While Ray Tune runs the trials, the first signal goes to Tune's own SIGINT handler: Tune stops
starting trials, saves its experiment state with the running trials still unfinished (so
``Tuner.restore`` continues them from their latest checkpoints), and ends its actors. Outside
Tune (preparing, scoring the test split) and on a second signal, :class:`KeyboardInterrupt`
is raised at once; the experiment state Tune saved on its last step is still there, as after
a SIGKILL. :func:`raypeft.search.run.run_experiment` then records the pause
(:class:`SearchInterrupted`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from ray.tune import Callback

HANDLED = (signal.SIGINT, signal.SIGTERM)
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as shells report


class SearchInterrupted(Exception):
    """A search paused by a signal: what finished, what was interrupted, how to go on."""

    def __init__(
        self,
        signum: int,
        finished: int = 0,
        interrupted: list[str] | None = None,
        recorded: bool = True,
    ):
        self.signum = signum
        self.finished = finished  # trials that had ended (finished, stopped early or failed)
        self.interrupted = interrupted or []  # trial ids that will continue on --resume
        self.recorded = recorded  # False: stopped while preparing, before any store was opened
        super().__init__(f"interrupted by {signal.Signals(signum).name}")

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 130)


class Interrupts:
    """Catches SIGINT and SIGTERM for the length of a search (a context manager).

    Only the main thread can install signal handlers; elsewhere (a search started from a
    worker thread) this does nothing and Python's defaults apply.
    """

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal received
        self._graceful: Callable[[int, FrameType | None], Any] | None = None
        self._saved: dict[int, Any] = {}
        self._deferred = False

    def __enter__(self) -> Interrupts:
        global _active
        if threading.current_thread() is threading.main_thread():
            self._saved = {s: signal.getsignal(s) for s in HANDLED}
            for s in HANDLED:
                signal.signal(s, self._on_signal)
            _active = self
        return self

    def __exit__(self, *exc_info) -> None:
        global _active
        for s, handler in self._saved.items():
            signal.signal(s, handler)
        _active = None

    @property
    def received(self) -> bool:
        return self.signum is not None

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """While the pause is being recorded (a few MLflow and Optuna writes), a further
        signal is noted, not raised: the records end consistent and the line is printed."""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        quiet_killed_actors()
        if self._deferred:
            return
        if first and self._graceful is not None:
            graceful, self._graceful = self._graceful, None
            graceful(signal.SIGINT, frame)  # Tune's: stop starting trials, save, end actors
            signal.signal(signal.SIGINT, self._on_signal)  # Tune restored its predecessor
            return
        raise KeyboardInterrupt


_active: Interrupts | None = None  # the search's Interrupts (signals are process-wide)


def ignore_further_signals() -> None:
    """After the pause line: the process only shuts Ray down and exits. A signal arriving
    then (an impatient second Ctrl-C) raised KeyboardInterrupt inside Ray's exit handler, a
    traceback after the line that must be the last one printed."""
    if threading.current_thread() is threading.main_thread():
        for s in HANDLED:
            signal.signal(s, signal.SIG_IGN)


def quiet_killed_actors() -> None:
    """After a signal, Tune ends its actors with ``ray.kill``: the results of the tasks they
    were running hold an ActorDiedError nobody reads. Ray logs each such error as
    "Unhandled error" when it drops the reference, at interpreter exit too, so a multi-line
    error landed after the pause line, which must be the last one printed. The switch is
    the one Ray names in that message, read each time an error is dropped."""
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"


class TuneSignals(Callback):
    """Set up right after Tune installs its SIGINT handler (``ray.tune.tune.run`` calls
    ``_setup_signal_catching`` before the callbacks' ``setup``): keep Tune's handler as the
    graceful stop, and route SIGINT and SIGTERM through :class:`Interrupts` again.

    Holds no state itself: Tune pickles its callbacks with the experiment.
    """

    def setup(self, **info) -> None:
        interrupts = _active
        if interrupts is None or threading.current_thread() is not threading.main_thread():
            return
        tune_handler = signal.getsignal(signal.SIGINT)
        if callable(tune_handler) and tune_handler != interrupts._on_signal:
            interrupts._graceful = tune_handler
        for s in HANDLED:
            signal.signal(s, interrupts._on_signal)

    def on_experiment_end(self, trials, **info) -> None:
        if _active is not None:
            _active._graceful = None  # past Tune's loop, a signal stops at once


def raise_if_interrupted() -> None:
    """After Tune's loop: raise :class:`KeyboardInterrupt` if a signal stopped it (Tune then
    returns partial results as if the experiment had ended)."""
    if _active is not None and _active.received:
        raise KeyboardInterrupt
