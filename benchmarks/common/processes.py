"""Measurements in processes of their own: several started together (K trials sharing a
device), or a benchmark's hidden worker in a fresh interpreter (memory without the parent's
history)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from benchmarks.common.paths import REPO


def measure_together(target: Callable, arguments: Sequence[tuple]) -> list[dict]:
    """Run ``target(*args, barrier, results)`` in one spawned process per ``args``: each
    waits at the shared barrier before timing (so all measure concurrently) and puts one
    result dict in ``results``. Returns the results; raises when a process died instead."""
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    barrier, results = ctx.Barrier(len(arguments)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, results)) for args in arguments]
    for proc in procs:
        proc.start()
    got = [_next_result(results, procs) for _ in procs]
    for proc in procs:
        proc.join()
    results.close()
    return got


def _next_result(results, procs) -> dict:
    """The next process's result; fails (instead of waiting forever) when one died."""
    while True:
        try:
            return results.get(timeout=5)
        except queue.Empty:  # is everyone still alive?
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for proc in procs:
                    proc.kill()
                raise RuntimeError(f"a measuring process failed (exit {dead[0]})") from None


def together(results: list[dict]) -> dict:
    """Concurrent measurements as one: samples/s over the span from the first start to the
    last end (each result has ``samples``, ``start``, ``end``), and the mean step time."""
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "samples_per_s": sum(r["samples"] for r in results) / span,
        "step_s": statistics.mean(r["step_s"] for r in results),
    }


def run_module(module: str, args: Sequence[str], env: dict[str, str] | None = None) -> str:
    """``python -m module args`` in a fresh interpreter, from the repository root (where
    ``benchmarks`` imports); its standard output. Raises with the tail of its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"python -m {module} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def stop_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM to ``proc``'s process group (a server or search started with its own session),
    SIGKILL to what is left of it after ``timeout`` seconds: what it started (a Ray node)
    goes with it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()  # reaps the leader, which otherwise stays in its group as a zombie
        if not _group_alive(proc.pid):
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=timeout)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
