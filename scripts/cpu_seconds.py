"""Run a command and print the CPU seconds it cost: its own and every process it started.

    .venv/bin/python scripts/cpu_seconds.py .venv/bin/pytest -n 0 tests/integration/test_faults.py

Ray's processes leave the command's process tree (the raylet's workers, daemons), so
``time``'s user+sys misses them. This process makes itself the child subreaper
(``PR_SET_CHILD_SUBREAPER``): whatever the command orphans is handed to it, reaped here, and
its CPU time added to ``RUSAGE_CHILDREN`` with the rest. Left-overs are killed 20 s after the
command ends. CPU seconds, unlike wall time, barely change when other work shares the cores,
so two runs beside other work compare; torch's spinning OpenMP threads were the exception
(tests/conftest.py sets ``OMP_WAIT_POLICY=PASSIVE``). Linux only.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 20


def reap_all() -> None:
    """Wait for every process handed to this one; SIGKILL those still alive after GRACE_S."""
    deadline = time.monotonic() + GRACE_S
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        if time.monotonic() > deadline:
            for line in os.popen(f"ps -o pid= --ppid {os.getpid()}"):
                try:
                    os.kill(int(line), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            deadline = time.monotonic() + GRACE_S
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    """Run ``argv``, reap what it leaves, print its CPU and wall seconds; its exit code."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    start = time.monotonic()
    code = subprocess.call(argv)
    wall = time.monotonic() - start
    reap_all()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    print(
        f"cpu_seconds {cpu:.1f} (user {usage.ru_utime:.1f}, sys {usage.ru_stime:.1f}); "
        f"wall {wall:.1f} s; exit code {code}",
        file=sys.stderr,
    )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
