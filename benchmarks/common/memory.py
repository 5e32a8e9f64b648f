"""A process's memory from the kernel: its resident set now, and its high-water mark,
resettable between phases where Linux allows it."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

MiB = 1024 * 1024


def rss_bytes() -> int:
    """This process's resident set size now, in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil  # why: absent on the GPU machines, which have /proc

        return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int | None:
    """This process's peak resident set (``VmHWM``) in bytes; None without /proc. psutil
    reports no peak on Linux, hence the file."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakMeter:
    """The high-water mark of this process's RSS, reset between phases where Linux allows it.

    Why not ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` alone: on Linux a child started by
    fork+exec inherits its parent's RSS in ``ru_maxrss``, and ``ru_maxrss`` cannot be reset;
    it is the fallback where ``/proc`` is unavailable (``source`` says which one measured).
    """

    def __init__(self) -> None:
        self.resettable = self._reset() and peak_rss_bytes() is not None
        self.source = "VmHWM (reset via clear_refs)" if self.resettable else "ru_maxrss"

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak RSS to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False

    def reset(self) -> None:
        """Start a new phase: the peak becomes the current RSS."""
        if self.resettable:
            self._reset()

    def peak(self) -> int:
        """The peak RSS in bytes since the last :meth:`reset` (or since the start)."""
        if self.resettable:
            return peak_rss_bytes() or 0
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
        return maxrss if sys.platform == "darwin" else maxrss * 1024
