"""The MLflow client a search records through (:func:`tracking_client`): its calls give up on
a silent server within seconds, not MLflow's minutes of retries, and a store that stopped
answering mid-search becomes one :class:`TrackingLost`, which ends the search resumably."""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from raypeft.config.redact import redact_uri
from raypeft.tracking.stores.environment import FAIL_FAST, no_retries
from raypeft.tracking.stores.locks import store_lock


class TrackingLost(RuntimeError):
    """The tracking store stopped answering during a search.

    The search stops where it is: its parent run and running trials' runs stay RUNNING in the
    store (as after a SIGKILL of the driver), its Optuna trials RUNNING, Ray Tune's
    experiment state is kept, so ``raypeft tune ... --resume`` continues it once the store
    answers again. ``uri`` is redacted; ``reason`` is one short line.
    """

    def __init__(self, uri: str, reason: str):
        self.uri = uri
        self.reason = reason
        super().__init__(f"the tracking server {uri} stopped answering ({reason})")

    def __reduce__(self):
        return (TrackingLost, (self.uri, self.reason))

    def line(self, resume_command: str) -> str:
        """The one line the CLI prints, given the command that resumes the search."""
        return f"{self}; after it is back: {resume_command}"


def _short_reason(exc: BaseException) -> str:
    """What went wrong, in a few words: the socket error of MLflow's long message if it has
    one (``Connection refused``, ``timed out``), else its first line, cut."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if found:
        return found.group(1).strip()
    if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timed out"
    status = re.search(r"response code (\d{3})|status code (\d{3})", text)
    if status:
        return f"HTTP {status.group(1) or status.group(2)}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return redact_uri(first)[:160]


class TrackingClient:
    """An ``MlflowClient`` for a search: every call fails fast (:data:`FAIL_FAST`, set for the
    search's process when the client is made), and a call
    that fails while the store does not answer a probe either raises :class:`TrackingLost`;
    from then on every call raises it at once, so nothing more is attempted on the store
    (the parent run stays RUNNING: ``--resume`` takes it up). Errors of a store that does
    answer (a bad request, a missing run) are raised as they are.

    Picklable (Ray Tune saves the tracker with its experiment).
    """

    def __init__(self, client, uri: str):
        # MLflow reads its HTTP settings from the environment at every request: the search's
        # process fails fast from here on (where the user set none), not per call
        for key, value in FAIL_FAST.items():
            os.environ.setdefault(key, value)
        self._client = client
        self._uri = uri
        self._lost: TrackingLost | None = None

    @property
    def lost(self) -> TrackingLost | None:
        return self._lost

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # pickling looks up dunders before __dict__ is set
            raise AttributeError(name)
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            if self._lost is not None:
                raise TrackingLost(self._lost.uri, self._lost.reason)
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                lost = self._probe()
                if lost is None:
                    raise
                self._lost = lost
                raise TrackingLost(lost.uri, lost.reason) from exc

        return call

    def _probe(self) -> TrackingLost | None:
        """After a failed call: does the store still answer (one request, no retries)?"""
        from mlflow.tracking import MlflowClient  # why: MLflow is imported where it is used

        with no_retries(5):
            try:
                MlflowClient(tracking_uri=self._uri).search_experiments(max_results=1)
            except Exception as probe_exc:
                return TrackingLost(redact_uri(self._uri), _short_reason(probe_exc))
        return None


def tracking_client(uri: str) -> TrackingClient:
    """The MLflow client a search records through (see :class:`TrackingClient`). A local
    sqlite store is created here, once, under :func:`store_lock`: MLflow creates a store's
    tables when a client first opens it, and caches the store for the process."""
    from mlflow.tracking import MlflowClient  # why: MLflow is imported where it is used

    with store_lock(uri):
        client = MlflowClient(tracking_uri=uri)
    return TrackingClient(client, uri)
