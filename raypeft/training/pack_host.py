"""A pack whose members are trials running elsewhere: they join, wait for reports, and leave.

A search keeps every configuration its own trial, packed or not (:mod:`raypeft.search.packs`:
one Ray Tune trial per configuration). A packed trial does not train: it hands its
configuration to a :class:`PackHost`, which trains it with the other members of its pack
(:class:`~raypeft.training.pack.Pack`) in a thread of its own, and relays what the host
reports for it (metrics and a checkpoint folder) to its scheduler.

Each member trains as far as its trial would alone, and no further: after each report it
is **held** (takes no step) until its trial asks for the next report, which a trial does
once its scheduler has accepted the last one (an unpacked trial blocks in its report the
same way). A trial the scheduler stops never asks again: it leaves (:meth:`PackHost.leave`),
or, when its process died, whoever watches it makes it leave; either way its slot is free
for the next configuration. The other members train on meanwhile.

Called from other threads: :meth:`~PackHost.join`, :meth:`~PackHost.next_report`,
:meth:`~PackHost.leave`, :meth:`~PackHost.fail`, :meth:`~PackHost.keys`,
:meth:`~PackHost.close`. The pack itself
(building members, steps, evaluations, checkpoints) is only touched by the host's thread,
so each member's random state stays its own.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from raypeft.data import TokenizedTask
from raypeft.training.pack import MemberSpec, Pack


class PackRefused(ValueError):
    """The configuration cannot join this pack (the pack is full, the trial cannot share its
    frozen backbone, or its method cannot pack); it can still train alone."""


class MemberGone(RuntimeError):
    """The member is not in the pack any more: it left, or the host closed."""


@dataclass(frozen=True)
class MemberReport:
    """What a member reports after an evaluation, as its trial would alone."""

    metrics: dict | None  # None: nothing to report (it resumed at its last step)
    folder: str | None  # its checkpoint, written by the host; removed once acknowledged
    final: bool  # its trial ends with this report (last step, or diverged)


@dataclass
class _Join:
    spec: MemberSpec
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    since: float = field(default_factory=time.monotonic)


class PackHost:
    """Serves one :class:`~raypeft.training.pack.Pack` of ``capacity`` members to trials
    that run in other threads or processes.

    ``on_leave(key)`` is called (from the host's thread) whenever a member's slot is freed or
    its join refused: a registry of packs learns that the slot can take another trial.
    ``scratch``: where checkpoint folders are written (default: the system's temp folder).
    """

    def __init__(
        self,
        task: TokenizedTask,
        *,
        capacity: int,
        device: torch.device | str | None = None,
        pack_id: str = "pack",
        threads: int | None = None,
        on_leave: Callable[[str], None] | None = None,
        scratch: str | None = None,
        poll_s: float = 0.5,
        full_wait_s: float = 30.0,
    ):
        self.task, self.capacity, self.pack_id = task, capacity, pack_id
        self.device, self.threads, self.scratch, self.poll_s = device, threads, scratch, poll_s
        # a trial that finds the pack full waits this long for a leaving trial's slot (its
        # leave may still be on its way) before it is refused
        self.full_wait_s = full_wait_s
        self.pack = Pack(task, capacity=capacity, device=device, pack_id=pack_id)
        self._on_leave = on_leave or (lambda key: None)
        self._cond = threading.Condition()
        self._joins: list[_Join] = []
        self._leaving: set[str] = set()
        self._failing: dict[str, BaseException] = {}  # leaving, their trials failed with these
        self._serving: set[str] = set()  # members, and trials with a final report to fetch
        self._held: set[str] = set()  # reported; wait until their trial asks for more
        self._mail: dict[str, MemberReport] = {}  # reports not yet fetched
        self._errors: dict[str, BaseException] = {}  # the pack failed under these members
        self._delivered: dict[str, str] = {}  # the checkpoint of each member's fetched report
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{pack_id}-loop", daemon=True)

    def start(self) -> PackHost:
        self._thread.start()
        return self

    # ------------------------------------------------------------------ called by trials

    def join(self, spec: MemberSpec) -> None:
        """Add the trial ``spec`` describes to the pack (its checkpoint folder, if any, is
        read before this returns). Raises :class:`PackRefused` when it cannot join, or what
        building it raised (its trial fails as it would alone)."""
        request = _Join(spec)
        with self._cond:
            if self._closed:
                raise MemberGone(f"pack {self.pack_id} is closed")
            self._joins.append(request)
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error

    def next_report(self, key: str, timeout: float | None = None) -> MemberReport:
        """Acknowledge the member's last report (its trial goes on: the member trains again)
        and wait for the next one. Raises :class:`MemberGone` when the member is not in the
        pack, the pack's error when the pack failed, ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            # a report waiting to be fetched was not seen by the trial: nothing to acknowledge
            stale = None if key in self._mail else self._acknowledge(key)
            while key not in self._mail:
                if key in self._errors:
                    raise self._errors.pop(key)
                if key not in self._serving or self._closed:
                    raise MemberGone(f"trial {key} is not in pack {self.pack_id}")
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"no report for trial {key} within {timeout} s")
                self._cond.wait(self.poll_s)
            report = self._mail.pop(key)
            if report.folder is not None:
                self._delivered[key] = report.folder
        _remove(stale)
        return report

    def leave(self, key: str) -> None:
        """The member's trial has ended (stopped by its scheduler, finished, or gone): it
        leaves the pack before the next step, and its slot is free."""
        with self._cond:
            self._leaving.add(key)
            self._cond.notify_all()

    def fail(self, key: str, error: BaseException) -> None:
        """The member's trial cannot go on (whoever watches it says why, ``error``): it leaves
        the pack as :meth:`leave` makes it, and its trial's next :meth:`next_report` raises
        ``error`` instead of waiting for a report that will not come."""
        with self._cond:
            self._failing[key] = error
            self._leaving.add(key)
            self._cond.notify_all()

    def keys(self) -> list[str]:
        """The trials the host serves (members, and those with a final report to fetch)."""
        with self._cond:
            return sorted(self._serving | {j.spec.key for j in self._joins})

    def close(self) -> None:
        """Stop the loop; every waiting trial learns its member is gone."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        for folder in [*self._delivered.values(), *(r.folder for r in self._mail.values())]:
            _remove(folder)

    # ------------------------------------------------------------------ the host's thread

    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        while self._round():
            pass
        with self._cond:  # closed: joins still waiting are refused
            for request in self._joins:
                request.error = MemberGone(f"pack {self.pack_id} is closed")
                request.done.set()
            self._joins = []

    def _round(self) -> bool:
        """Members leave and join, then one step of those not held; False once closed."""
        with self._cond:
            if self._closed:
                return False
            leaving, joins, failing = self._leaving, self._joins, self._failing
            self._leaving, self._joins, self._failing = set(), [], {}
        for key in leaving:
            self._drop(key, error=failing.get(key))
        deferred = []
        for request in joins:
            if self._must_wait(request):
                deferred.append(request)
            else:
                self._admit(request)
        with self._cond:
            self._joins[:0] = deferred  # again next round, first
            active = [m.key for m in self.pack.members if m.key not in self._held]
            active = [k for k in active if not self.pack.member(k).finished]
            if not active:
                news = len(self._joins) > len(deferred)
                if not (self._leaving or news or self._closed):
                    self._cond.wait(self.poll_s)
                return True
        try:
            self._train(active)
        except Exception as exc:  # noqa: BLE001 - every member's trial gets it
            self._fail_all(exc)
        return True

    def _must_wait(self, request: _Join) -> bool:
        """Whether a join finds the pack full but may still get a slot (not the same trial
        again, which replaces its earlier run; not waiting for too long already)."""
        again = any(m.key == request.spec.key for m in self.pack.members)
        patient = time.monotonic() - request.since < self.full_wait_s
        return not self.pack.free and not again and patient

    def _admit(self, request: _Join) -> None:
        key = request.spec.key
        # the same trial again (restarted): its old incarnation is gone. Silently: the
        # registry seated this new one in that slot already, and on_leave would free it
        self._drop(key, announce=False)
        try:
            member = self.pack.add(request.spec)
        except ValueError as exc:  # full, another backbone, a method that cannot pack
            request.error = PackRefused(str(exc))
        except Exception as exc:  # noqa: BLE001 - building it failed: its trial fails
            request.error = exc
        else:
            with self._cond:
                self._serving.add(key)
            if member.finished and not member.due:  # resumed at its last step: nothing left
                self._free(key)
                self._post(key, MemberReport(None, None, final=True))
        if request.error is not None:
            self._on_leave(key)
        request.done.set()

    def _train(self, keys: list[str]) -> None:
        """One fused step of these members; each member due evaluates, checkpoints, reports
        and is held; a member that finished or diverged leaves its slot."""
        for key, failure in self.pack.step(keys).items():
            self._free(key)
            self._post(key, MemberReport(failure, None, final=True))
        for key, metrics in self.pack.evaluate(self.pack.due()).items():
            folder = tempfile.mkdtemp(prefix="raypeft-pack-", dir=self.scratch)
            self.pack.write_checkpoint(key, Path(folder))
            final = self.pack.member(key).finished
            if final:
                self._free(key)
            self._post(key, MemberReport(metrics, folder, final))

    def _post(self, key: str, report: MemberReport) -> None:
        with self._cond:
            self._mail[key] = report
            if not report.final:
                self._held.add(key)
            self._cond.notify_all()

    def _free(self, key: str, announce: bool = True) -> None:
        """The member's slot is free (its trial may still fetch its final report); with
        ``announce``, ``on_leave`` tells the registry so."""
        self.pack.remove(key)
        if announce:
            self._on_leave(key)

    def _drop(self, key: str, announce: bool = True, error: BaseException | None = None) -> None:
        """Forget the trial: out of the pack, its unfetched report and checkpoint removed
        (``announce``: see :meth:`_free`); with ``error``, what its trial's next report
        raises (set in the same step, so the trial never finds it merely gone)."""
        with self._cond:
            self._serving.discard(key)
            self._held.discard(key)
            unfetched = self._mail.pop(key, None)
            self._errors.pop(key, None)
            if error is not None:
                self._errors[key] = error
            folders = [self._delivered.pop(key, None), unfetched and unfetched.folder]
            self._cond.notify_all()
        if any(m.key == key for m in self.pack.members):
            self._free(key, announce)
        for folder in folders:
            _remove(folder)

    def _acknowledge(self, key: str) -> str | None:
        """(Lock held.) The member's trial accepted the report it fetched last: it trains
        on. Returns that report's checkpoint folder, which its trial has copied by now."""
        self._held.discard(key)
        self._cond.notify_all()
        return self._delivered.pop(key, None)

    def _fail_all(self, exc: Exception) -> None:
        """The pack failed (not one member: the step or evaluation itself): every member's
        trial fails with the error (Ray restarts it from its latest checkpoint), and the
        pack starts empty."""
        error = RuntimeError(f"pack {self.pack_id} failed: {type(exc).__name__}: {exc}")
        keys = [m.key for m in self.pack.members]
        with self._cond:
            for key in keys:
                self._errors[key] = error
                self._held.discard(key)
            self._cond.notify_all()
        self.pack = Pack(
            self.task, capacity=self.capacity, device=self.device, pack_id=self.pack_id
        )
        for key in keys:
            self._on_leave(key)


def _remove(folder: str | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
