"""How many trials of a search share one GPU, or train as a pack on it: measured by a short
probe on the GPU node (Ray tasks), cached per backbone × method × shape × GPU, or, when no
probe can run, a rule from the recorded H200 table.

The probe (:func:`run_probe`) times a few training steps of the search's own experiment
(:mod:`raypeft.training.probe`): K = 1, 2, 4, 8 trials sharing the GPU as Ray places them
(K tasks of ``num_gpus: 1/K`` stepping together, each its own process and CUDA context) and,
where the method packs, a pack of K on one backbone (one task of ``num_gpus: 1``).
:func:`choose` takes the smallest K whose samples per second come within 10 % of the best that
fits the GPU's memory with 10 % to spare; a pack only where it beats the fastest sharing by 10 %
(a packed trial shares its dropout masks with the pack: statistically, not bit for bit, the
trial it is alone, docs/packing.md).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayError

from raypeft.config.cache_root import cache_root
from raypeft.config.schema import ExperimentConfig
from raypeft.search.trial_runners import assigned_device
from raypeft.training.probe import probe_alone, probe_pack

KS = (1, 2, 4, 8)
WITHIN = 0.10  # the smallest K within 10 % of the best throughput: fewer processes, less memory
HEADROOM = 0.10  # of the GPU's memory left free (evaluation batches, allocator fragmentation)
PACK_MARGIN = 1.10  # a pack must beat the best sharing by this much to be chosen
CONTEXT_MIB = 500  # a process's CUDA context and kernels, not counted by the allocator
PROBE_TIMEOUT_S = 300.0

# benchmarks/results/gpu_share_h200.txt (benchmarks.device.gpu_step --share 1,2,4,8,16 on an H200,
# bf16, batch 16 × 128 tokens): total samples/s of K trials sharing the GPU, PT per backbone,
# with each backbone's layers × width² (encoder layers for T5) and kind.
RECORDED_SHARING: dict[str, dict] = {
    "minilm": {"kind": "encoder", "size": 6 * 384**2,
               "samples_per_s": {1: 1820.2, 2: 3503.5, 4: 4158.9, 8: 5604.8, 16: 5576.2}},
    "roberta-base": {"kind": "encoder", "size": 12 * 768**2,
                     "samples_per_s": {1: 1003.7, 2: 1587.6, 4: 1884.4, 8: 1976.2, 16: 1969.4}},
    "t5-base": {"kind": "seq2seq", "size": 12 * 768**2,
                "samples_per_s": {1: 144.7, 2: 350.1, 4: 507.4, 8: 584.8, 16: 583.6}},
    "roberta-large": {"kind": "encoder", "size": 24 * 1024**2,
                      "samples_per_s": {1: 500.0, 2: 777.7, 4: 784.1, 8: 792.7, 16: 793.7}},
}  # fmt: skip
RECORDED_ON = "H200 (benchmarks/results/gpu_share_h200.txt)"


@dataclass(frozen=True)
class Measured:
    """One probe measurement: ``k`` trials sharing the GPU (``mode`` share) or a pack of
    ``k`` (pack); ``error`` where it failed (out of memory, a timeout)."""

    mode: str
    k: int
    samples_per_s: float | None = None
    peak_mib: float | None = None  # each process's most allocated (a pack: its one process)
    error: str | None = None

    def describe(self) -> str:
        """One line: what was measured and how fast (or why not)."""
        what = f"{self.k} sharing the GPU" if self.mode == "share" else f"a pack of {self.k}"
        if self.error:
            return f"{what}: {self.error}"
        each = " each" if self.mode == "share" else ""  # a pack's peak is its one process's
        peak = f", peak {self.peak_mib:,.0f} MiB{each}" if self.peak_mib is not None else ""
        return f"{what}: {self.samples_per_s:,.0f} samples/s{peak}"

    def footprint_mib(self) -> float | None:
        """What it holds of the GPU: each process's peak and CUDA context, times K shares."""
        if self.peak_mib is None:
            return None
        processes = self.k if self.mode == "share" else 1
        return processes * (self.peak_mib + CONTEXT_MIB)


@dataclass(frozen=True)
class Choice:
    """What to run: ``k`` trials sharing each GPU (share) or packs of ``k`` (pack), and why."""

    mode: str
    k: int
    why: str


def choose(measured: list[Measured], total_mib: float | None) -> Choice:
    """The sharing to run from probe measurements: among those that fit ``total_mib`` with
    :data:`HEADROOM` to spare, the smallest K within :data:`WITHIN` of the best samples/s;
    a pack only where it beats that sharing by :data:`PACK_MARGIN`."""

    def fits(m: Measured) -> bool:
        if m.error or not m.samples_per_s:
            return False
        need = m.footprint_mib()
        return total_mib is None or need is None or need <= (1 - HEADROOM) * total_mib

    def top(mode: str) -> float:
        return max((m.samples_per_s for m in measured if m.mode == mode and fits(m)), default=0)

    def best(mode: str) -> Measured | None:
        ok = sorted((m for m in measured if m.mode == mode and fits(m)), key=lambda m: m.k)
        return next((m for m in ok if m.samples_per_s >= (1 - WITHIN) * top(mode)), None)

    share, pack = best("share"), best("pack")
    if share is None and pack is None:
        return Choice("share", 1, "no measurement fitted the GPU: one trial per GPU")
    one = next((m for m in measured if m.mode == "share" and m.k == 1 and fits(m)), None)
    base = f" vs {one.samples_per_s:,.0f} at K=1" if one else ""
    if pack is not None and pack.samples_per_s >= PACK_MARGIN * top("share"):
        speed = f"{pack.samples_per_s:,.0f} samples/s"
        return Choice("pack", pack.k, f"a pack of {pack.k}: {speed}{base}")
    return Choice("share", share.k, f"{share.samples_per_s:,.0f} samples/s at K={share.k}{base}")


def rule_choice(hidden_size: int, num_layers: int, kind: str, k_max: int) -> Choice:
    """Without a probe: :func:`choose` applied to the recorded sharing table of the recorded
    backbone nearest in size (layers × width², the same kind first), K at most ``k_max``."""
    size = num_layers * hidden_size**2
    rows = [r for r in RECORDED_SHARING.items() if r[1]["kind"] == kind] or list(
        RECORDED_SHARING.items()
    )
    name, row = min(rows, key=lambda r: abs(_log(r[1]["size"]) - _log(size)))
    table = [Measured("share", k, speed) for k, speed in row["samples_per_s"].items() if k <= k_max]
    picked = choose(table, None)
    return Choice(
        "share", picked.k, f"rule from the {RECORDED_ON} sharing table, nearest backbone {name}"
    )


def _log(value: float) -> float:
    return math.log(value)


# ----------------------------------------------------------------------------- cache


def cache_file() -> Path:
    """``gpu_probe.json`` in raypeft's cache folder (:func:`cache_root`: ``$RAYPEFT_CACHE_DIR``,
    else ``~/.cache/raypeft``, XDG-aware)."""
    return cache_root() / "gpu_probe.json"


def probe_key(cfg: ExperimentConfig, gpu: str, k_max: int, packs: bool) -> str:
    """What a probe's result depends on: backbone, method (every knob), batch, length,
    precision, the GPU's type, and which K were probed."""
    return json.dumps(
        {
            "model": [cfg.model.name, cfg.model.revision, cfg.model.max_length],
            "method": cfg.method.model_dump(mode="json"),
            "batch_size": cfg.train.batch_size,
            "precision": cfg.train.precision,
            "gpu": gpu,
            "ks": [k for k in KS if k <= k_max],
            "packs": packs,
        },
        sort_keys=True,
    )


@dataclass(frozen=True)
class ProbeResult:
    """A probe's measurements on one GPU."""

    gpu_name: str
    total_mib: float
    measured: list[Measured]

    def to_json(self) -> dict:
        return {**asdict(self), "measured": [asdict(m) for m in self.measured]}

    @classmethod
    def from_json(cls, data: dict) -> ProbeResult:
        measured = [Measured(**m) for m in data["measured"]]
        return cls(data["gpu_name"], float(data["total_mib"]), measured)


def cached(key: str, path: Path | None = None) -> ProbeResult | None:
    """The cached probe of ``key`` (None: none, or an unreadable cache)."""
    try:
        entries = json.loads((path or cache_file()).read_text())
        return ProbeResult.from_json(entries[key])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember(key: str, result: ProbeResult, path: Path | None = None) -> None:
    """Add ``result`` to the cache (written whole through a temporary file: never half)."""
    path = path or cache_file()
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = {}
    entries[key] = result.to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(entries, indent=1))
    partial.replace(path)


# ----------------------------------------------------------------------------- the probe


@ray.remote(num_cpus=0)
class _Barrier:
    """K processes start their timed steps together (an async actor: all wait at once)."""

    def __init__(self, parties: int):
        self.parties, self.arrived, self.event = parties, 0, None

    async def wait(self) -> None:
        self.event = self.event or asyncio.Event()
        self.arrived += 1
        if self.arrived >= self.parties:
            self.event.set()
        await self.event.wait()


@ray.remote(num_cpus=0)
def _alone(base: dict, barrier: list) -> dict | None:
    """One trial's probe on the GPU Ray assigned (None: torch sees no GPU here)."""
    device = assigned_device()
    if device.type != "cuda":
        return None
    wait = (lambda: ray.get(barrier[0].wait.remote())) if barrier else None
    return probe_alone(ExperimentConfig.model_validate(base), device, wait=wait)


@ray.remote(num_cpus=0, num_gpus=1)
def _pack(base: dict, k: int) -> dict | None:
    """A pack of ``k``'s probe on the GPU Ray assigned."""
    device = assigned_device()
    if device.type != "cuda":
        return None
    return probe_pack(ExperimentConfig.model_validate(base), k, device)


def _gather(refs: list, deadline: float) -> list[dict] | str:
    """The tasks' results, or why not (the first error, or the probe's time ran out)."""
    try:
        return ray.get(refs, timeout=max(1.0, deadline - time.monotonic()))
    except GetTimeoutError:
        reason = "the probe's time ran out"
    except RayError as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        reason = "out of memory" if "out of memory" in str(exc).lower() else lines[-1][:200]
    for ref in refs:
        ray.cancel(ref, force=True)
    return reason


def _share(base: dict, k: int, deadline: float) -> Measured | None:
    """K trials stepping together on one GPU (None: torch sees no GPU on the node)."""
    barrier = [_Barrier.remote(k)] if k > 1 else []
    refs = [_alone.options(num_gpus=1 / k).remote(base, barrier) for _ in range(k)]
    got = _gather(refs, deadline)
    if isinstance(got, str):
        return Measured("share", k, error=got)
    if any(r is None for r in got):
        return None
    span = max(r["end"] for r in got) - min(r["start"] for r in got)
    peak = max(r["peak_mib"] for r in got)
    return Measured("share", k, sum(r["samples"] for r in got) / span, peak)


def run_probe(
    cfg: ExperimentConfig, ks: list[int], packs: bool, say: Callable[[str], None] = print
) -> ProbeResult | str:
    """Probe ``cfg`` on a GPU of the connected cluster: K trials sharing it for each of
    ``ks``, and packs of K > 1 where ``packs``; each measurement is said as it ends (a probe
    takes a minute or two before the first trial starts). Returns the measurements, or why
    none could be made (torch sees no GPU where Ray declares one; the first step ran out of
    memory)."""
    base = cfg.model_dump(mode="json")
    started = time.monotonic()
    deadline = started + PROBE_TIMEOUT_S

    def measured_now(m: Measured | None) -> Measured | None:
        if m is not None:
            say(f"  GPU probe: {m.describe()} ({time.monotonic() - started:.0f} s)")
        return m

    facts = _gather([_alone.options(num_gpus=1).remote(base, [])], deadline)
    if isinstance(facts, str) or facts[0] is None:
        return facts if isinstance(facts, str) else "torch sees no CUDA GPU where Ray declares one"
    first = facts[0]
    speed = first["samples"] / (first["end"] - first["start"])
    measured = [measured_now(Measured("share", 1, speed, first["peak_mib"]))]
    for k in ks[1:]:
        measured.append(measured_now(_share(base, k, deadline)))
        if measured[-1] is None or measured[-1].error:
            break
    for k in [k for k in ks if k > 1] if packs else []:
        got = _gather([_pack.remote(base, k)], deadline)
        if isinstance(got, str):
            measured.append(measured_now(Measured("pack", k, error=got)))
            break
        r = got[0]
        speed = r["samples"] / (r["end"] - r["start"])
        measured.append(measured_now(Measured("pack", k, speed, r["peak_mib"])))
    return ProbeResult(first["gpu_name"], first["total_mib"], [m for m in measured if m])
