"""MLflow system metrics of trial runs, sampled where the trial trains.

MLflow's own ``SystemMetricsMonitor`` logs from a thread of the process that holds the run;
raypeft's trials run in Ray workers (possibly on other machines) and never write to MLflow
(the Tune driver is the single writer). So the worker samples with MLflow's monitor classes
(CPU and memory, disk, network; NVIDIA GPUs through pynvml, AMD through pyrsmi, where
installed) in a daemon thread every ``tracking.system_metrics_interval`` seconds; each report
to Tune carries the averages since the previous report under MLflow's names
(``system/cpu_utilization_percentage``, ``system/gpu_0_utilization_percentage``, ...), and the
driver logs them to the trial's run at the report's training step.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

SYSTEM_PREFIX = "system/"  # as MLflow names them: its UI charts them in "System metrics"


def _monitors() -> list:
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    quiet = logging.getLogger("mlflow.system_metrics")
    level, quiet.level = quiet.level, logging.ERROR  # "pynvml is not installed" on CPU hosts
    try:
        for gpu in ("gpu_monitor.GPUMonitor", "rocm_monitor.ROCMMonitor"):
            module, name = gpu.split(".")
            try:
                imported = __import__(f"mlflow.system_metrics.metrics.{module}", fromlist=[name])
                monitors.append(getattr(imported, name)())
                break
            except Exception:  # no driver, no library: no GPU metrics (as MLflow does)
                continue
    finally:
        quiet.level = level
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
        import psutil

        self.monitors = _monitors()
        psutil.cpu_percent()  # the first call measures nothing: start the interval here
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
                monitor.collect_metrics()
            except Exception:  # a GPU that vanished, a disk that cannot be read
                continue
        self._fresh = True

    def drain(self) -> dict[str, float]:
        with self._lock:
            if not self._fresh:
                self._sample()
            out: dict[str, Any] = {}
            for monitor in self.monitors:
                out.update(monitor.aggregate_metrics())
                monitor.clear_metrics()
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
