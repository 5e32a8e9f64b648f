"""MLflow system metrics of trial runs, sampled where the trial trains.

MLflow's own ``SystemMetricsMonitor`` logs from a thread of the process that holds the run;
raypeft's trials run in Ray workers (possibly on other machines) and never write to MLflow
(the Tune driver is the single writer). So the worker samples in a daemon thread every
``tracking.system_metrics_interval`` seconds; each report to Tune carries the averages since
the previous report under MLflow's own names and rounding (``system/cpu_utilization_percentage``,
``system/system_memory_usage_megabytes``, ``system/gpu_0_utilization_percentage``, ...: what
its CPU, disk, network and NVIDIA GPU monitors record), and the driver logs them to the
trial's run at the report's training step; the MLflow UI charts them in "System metrics".

The sampler reads psutil (and pynvml, where installed and a GPU is visible) directly rather
than through MLflow's monitor classes: importing ``mlflow`` costs a trial worker 1-2 s of CPU,
which the workers otherwise never pay (a test checks the names against MLflow's monitors).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

SYSTEM_PREFIX = "system/"  # as MLflow names them: its UI charts them in "System metrics"


class _Host:
    """CPU, memory and disk (averaged) and network (megabytes since the start), as MLflow's
    CPUMonitor, DiskMonitor and NetworkMonitor record them."""

    def __init__(self):
        import os

        import psutil

        self.psutil, self.root = psutil, os.sep
        counters = psutil.net_io_counters()
        self.net_start = (counters.bytes_recv / 1e6, counters.bytes_sent / 1e6)
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.network: dict[str, float] = {}
        psutil.cpu_percent()  # the first call measures nothing: start the interval here

    def collect(self) -> None:
        ps, add = self.psutil, self.samples
        add["cpu_utilization_percentage"].append(ps.cpu_percent())
        memory = ps.virtual_memory()
        add["system_memory_usage_megabytes"].append(memory.used / 1e6)
        add["system_memory_usage_percentage"].append(memory.used / memory.total * 100)
        disk = ps.disk_usage(self.root)
        add["disk_usage_percentage"].append(disk.percent)
        add["disk_usage_megabytes"].append(disk.used / 1e6)
        add["disk_available_megabytes"].append(disk.free / 1e6)
        net = ps.net_io_counters()
        self.network = {
            "network_receive_megabytes": net.bytes_recv / 1e6 - self.net_start[0],
            "network_transmit_megabytes": net.bytes_sent / 1e6 - self.net_start[1],
        }

    def aggregate(self) -> dict[str, float]:
        out = {k: round(sum(v) / len(v), 1) for k, v in self.samples.items() if v}
        out.update(self.network)
        self.samples.clear()
        return out


class _NvidiaGpus:
    """Memory, utilisation and power of every NVIDIA GPU the node has, as MLflow's
    GPUMonitor records them (needs pynvml: ``pip install nvidia-ml-py``)."""

    def __init__(self):
        import pynvml  # ImportError: no GPU metrics

        pynvml.nvmlInit()  # NVMLError without a driver or a GPU
        self.nvml = pynvml
        self.handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        self.samples: dict[str, list[float]] = defaultdict(list)

    def collect(self) -> None:
        nvml, add = self.nvml, self.samples
        for i, handle in enumerate(self.handles):
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                add[f"gpu_{i}_memory_usage_percentage"].append(
                    round(memory.used / memory.total * 100, 1)
                )
                add[f"gpu_{i}_memory_usage_megabytes"].append(memory.used / 1e6)
                add[f"gpu_{i}_utilization_percentage"].append(
                    nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                )
                power = nvml.nvmlDeviceGetPowerUsage(handle)
                limit = nvml.nvmlDeviceGetEnforcedPowerLimit(handle)
                add[f"gpu_{i}_power_usage_watts"].append(power / 1000)
                add[f"gpu_{i}_power_usage_percentage"].append(power / limit * 100)
            except nvml.NVMLError:  # a reading this GPU does not offer
                continue

    def aggregate(self) -> dict[str, float]:
        out = {k: round(sum(v) / len(v), 1) for k, v in self.samples.items() if v}
        self.samples.clear()
        return out


def _monitors() -> list:
    monitors: list = [_Host()]
    try:
        monitors.append(_NvidiaGpus())
    except Exception:  # no pynvml, no driver, no GPU: no GPU metrics (as MLflow does)
        pass
    return monitors


class SystemSampler:
    """Samples system metrics in a daemon thread; :meth:`drain` returns the averages since
    the last call (a sample is taken then when the thread took none). A context manager."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.monitors: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fresh = False  # a sample since the last drain

    def __enter__(self) -> SystemSampler:
        self.monitors = _monitors()
        self._thread = threading.Thread(
            target=self._run, daemon=True, name="raypeft-system-metrics"
        )
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                self._sample()

    def _sample(self) -> None:
        for monitor in self.monitors:
            try:
                monitor.collect()
            except Exception:  # a GPU that vanished, a disk that cannot be read
                continue
        self._fresh = True

    def drain(self) -> dict[str, float]:
        with self._lock:
            if not self._fresh:
                self._sample()
            out: dict[str, Any] = {}
            for monitor in self.monitors:
                out.update(monitor.aggregate())
            self._fresh = False
        return {SYSTEM_PREFIX + k: float(v) for k, v in out.items()}

    def __call__(self) -> dict[str, float]:
        return self.drain()


class NoSampler:
    """``tracking.system_metrics: false``: reports carry no system metrics."""

    def __enter__(self) -> NoSampler:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __call__(self) -> dict[str, float]:
        return {}


def sampler_for(tracking) -> SystemSampler | NoSampler:
    """The sampler a trial's reports use (``tracking``: the experiment's tracking section)."""
    if not getattr(tracking, "system_metrics", False):
        return NoSampler()
    return SystemSampler(float(tracking.system_metrics_interval))


def system_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The system metrics a Tune result carries."""
    return {
        k: float(v)
        for k, v in result.items()
        if k.startswith(SYSTEM_PREFIX) and isinstance(v, (int, float))
    }
