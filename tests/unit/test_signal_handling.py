"""The signal handling of a search (raypeft.search.interrupts), without a search: the
integration tests (tests/integration/test_interrupts.py) send the signals to a real one."""

from __future__ import annotations

import os
import signal

import pytest

from raypeft.search.interrupts import Interrupts


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_outside_tunes_loop_stops_at_once_and_quiets_killed_actors(signum, monkeypatch):
    """Outside Tune's loop a signal raises KeyboardInterrupt at once; from then on Ray's
    "Unhandled error" logs of the actors a pause ends are off, so that nothing lands after
    the pause line (a stop-31 CI failure)."""
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)
    before = signal.getsignal(signum)
    with pytest.raises(KeyboardInterrupt), Interrupts() as interrupts:
        os.kill(os.getpid(), signum)
        signal.sigtimedwait([], 0)  # the handler runs here at the latest
    assert interrupts.received and interrupts.signum == signum
    assert os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] == "1"
    assert signal.getsignal(signum) is before  # the handlers before the search are back


def test_a_signal_while_the_pause_is_recorded_is_noted_not_raised(monkeypatch):
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)
    with Interrupts() as interrupts, interrupts.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0)
    assert interrupts.signum == signal.SIGTERM
