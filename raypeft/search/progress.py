"""Live progress of a search on the terminal: a line per finished trial, a concise table.

Tune's own table lists every reported key and all trials; on a long search that scrolls
past. This callback prints one line when a trial finishes, is stopped or fails, and every
``interval`` seconds a table of the running trials and the best ones so far, with the
searched keys as columns. ``raypeft tune --quiet`` leaves it out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ray.tune import Callback
from ray.tune.experiment import Trial
from tabulate import tabulate

from raypeft.config.schema import DERIVED_PREFIX
from raypeft.training.result_keys import FAILURE_KEY, RESTARTED_KEY, ran_to_end

# a trial waiting to run again (paused, or restarted after its worker died) whose reported
# values are partial, like a running trial's
_PAUSED_OR_PENDING = (Trial.PAUSED, Trial.PENDING)


def _short(key: str) -> str:
    """``method.lr_prompt`` -> ``lr_prompt``; ``derived.rank`` -> ``rank``."""
    return key.rsplit(".", 1)[-1]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.4g}"
    return str(value)


class ProgressPrinter(Callback):
    """Concise trial table while a search runs (runs on the Tune driver)."""

    def __init__(
        self,
        keys: list[str],
        metric_key: str,
        mode: str,
        num_samples: int,
        interval: float = 30.0,
        show_rows: int = 8,
        echo: Callable[[str], None] = print,
    ):
        self.keys = keys  # searched config keys, shown as columns
        self.metric_key = metric_key
        self.mode = mode
        self.num_samples = num_samples
        self.interval = interval
        self.show_rows = show_rows
        self.echo = echo
        self._last = time.monotonic()
        self._start = time.monotonic()
        self._done: int | None = None  # trials ended, counted from the first step (a resume's)
        self._ended: set[str] = set()  # trials Tune completed (not left unfinished by a pause)
        self._restarts_told: set[str] = set()  # trials whose start over has been said
        # trials seen unfinished by this search (not ended in an earlier one it resumes)
        self._seen_unfinished: set[str] = set()

    # ------------------------------------------------------------------ Tune hooks

    def on_step_begin(self, iteration: int, trials: list[Trial], **info):
        """At the first step: the trials a resumed search had ended already count, so its
        first trial end says [53/240] after 52, not [1/240]."""
        if self._done is None:
            self._done = sum(t.status in (Trial.TERMINATED, Trial.ERROR) for t in trials)

    def _count_end(self) -> int:
        self._done = (self._done or 0) + 1
        return self._done

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result, **info):
        """A restarted trial that could not resume from its checkpoint: said once, why."""
        self._seen_unfinished.add(trial.trial_id)
        if RESTARTED_KEY in result and trial.trial_id not in self._restarts_told:
            self._restarts_told.add(trial.trial_id)
            self.echo(f"{trial}: {result[RESTARTED_KEY]}")

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        done = self._count_end()
        self._ended.add(trial.trial_id)
        result = trial.last_result or {}
        step = result.get("step", 0)
        best = result.get(self.metric_key)
        how = "finished" if ran_to_end(result) else f"stopped early at step {step}"
        if FAILURE_KEY in result:
            self.echo(f"[{done}/{self.num_samples}] {trial} FAILED: {result[FAILURE_KEY]}")
            return
        score = f"{self.metric_key} {_fmt(best)}" if best is not None else "no result"
        self.echo(f"[{done}/{self.num_samples}] {trial} {how}: {score}")

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        done = self._count_end()
        self.echo(f"[{done}/{self.num_samples}] {trial} FAILED (see its MLflow run)")

    def on_step_end(self, iteration: int, trials: list[Trial], **info):
        if time.monotonic() - self._last >= self.interval:
            self._last = time.monotonic()
            self.echo(self.table(trials))

    def on_experiment_end(self, trials: list[Trial], **info):
        self.echo(self.table(trials))  # the final standings, best first

    # ------------------------------------------------------------------ table

    def _score(self, trial: Trial) -> float | None:
        value = (trial.last_result or {}).get(self.metric_key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    def _finished(self, trial: Trial) -> bool:
        """Ended and scored: the only trials a "best" may name. A running, paused or pending
        trial (one Tune restarts after a failure keeps its earlier results) has reported a
        partial value; an errored or diverged trial is a failure, whatever it reported."""
        result = trial.last_result or {}
        return trial.status == Trial.TERMINATED and FAILURE_KEY not in result

    def status(self, trial: Trial) -> str:
        """What became of a trial, in the words of the summary: Tune's TERMINATED says
        finished, stopped early, failed (a diverged loss) or interrupted (a paused search
        left it unfinished; ``--resume`` continues it). A trial that had ended in the search
        a resumed one continues is shown as it ended, not as interrupted."""
        if trial.status != Trial.TERMINATED:
            return trial.status.lower()
        result = trial.last_result or {}
        if FAILURE_KEY in result:
            return "failed"
        if trial.trial_id not in self._ended and trial.trial_id in self._seen_unfinished:
            return "interrupted"  # it trained in this search, which ended without it
        return "finished" if ran_to_end(result) else "stopped early"

    def _in_flight(self, trial: Trial) -> bool:
        """Running, or paused/pending after reporting (a queued trial has nothing to show)."""
        if trial.status == Trial.RUNNING:
            return True
        return trial.status in _PAUSED_OR_PENDING and self._score(trial) is not None

    def table(self, trials: list[Trial]) -> str:
        """Trials in flight first, then the best finished ones, at most ``show_rows``."""
        self._seen_unfinished.update(t.trial_id for t in trials if t.status != Trial.TERMINATED)
        counts: dict[str, int] = {}
        for status in map(self.status, trials):
            counts[status] = counts.get(status, 0) + 1
        sign = 1 if self.mode == "max" else -1
        in_flight = [t for t in trials if self._in_flight(t)]
        scored = [t for t in trials if self._finished(t) and self._score(t) is not None]
        scored.sort(key=lambda t: -sign * self._score(t))
        rows = (in_flight + scored)[: self.show_rows]
        best = scored[0] if scored else None
        elapsed = (time.monotonic() - self._start) / 60
        status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        lines = [
            f"--- {elapsed:.1f} min: {status} of {self.num_samples}"
            + (f"; best {self.metric_key} {_fmt(self._score(best))} ({best})" if best else "")
        ]
        if not rows:
            return lines[0]
        derived = sorted({k for t in rows for k in t.config if k.startswith(DERIVED_PREFIX)})
        keys = [*self.keys, *derived]  # searched keys, then derived ones (DePT's rank, ...)
        header = ["trial", "status", *(_short(k) for k in keys), "step", self.metric_key]
        body = []
        for trial in rows:
            result = trial.last_result or {}
            body.append(
                [
                    str(trial),
                    self.status(trial),
                    *(_fmt(trial.config.get(k, "")) for k in keys),
                    str(result.get("step", "")),
                    _fmt(result[self.metric_key]) if self.metric_key in result else "",
                ]
            )
        lines.append(tabulate(body, header, tablefmt="plain", disable_numparse=True))
        return "\n".join(lines)
