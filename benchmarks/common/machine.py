"""The machine a benchmark runs on: its load (printed beside each timing: this machine's 2
cores are shared, so a number means little without it) and its CPU's name."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def load_note() -> str:
    """`` (load 1.3)``: the 1-minute load average, or nothing where the OS has none."""
    try:
        return f" (load {os.getloadavg()[0]:.1f})"
    except OSError:
        return ""


def cpu_name() -> str:
    """The CPU's model name, as /proc/cpuinfo says it (else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
