"""Timing that can be trusted: synchronize the device, warm up, repeat, report percentiles.

Used by the hardware micro-benchmarks and by the measurement harness; depends on nothing else
of the package, and imports torch only to synchronize a GPU, so both (and the torch-free cluster
simulator) can import it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work, so wall-clock timing measures the work and not its launch."""
    import torch  # defers torch: Stats and summarize serve torch-free modules (the cluster simulator)

    dev = torch.device(device) if device is not None else None
    if (dev is None and torch.cuda.is_available()) or (dev is not None and dev.type == "cuda"):
        torch.cuda.synchronize(dev)


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements, in the unit of the samples."""

    n: int
    mean: float
    std: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float

    def as_dict(self, prefix: str = "", scale: float = 1.0) -> dict[str, float]:
        """Flat dict, e.g. ``{'itl_ms_p50': ...}`` with ``prefix='itl_ms_'`` and ``scale=1e3``."""
        return {f"{prefix}{k}": (v * scale if k != "n" else v) for k, v in asdict(self).items()}


def summarize(samples: Sequence[float]) -> Stats:
    """Mean, std, min, max and p50/p90/p99 (linear interpolation between order statistics)."""
    arr = np.asarray(list(samples), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("summarize() needs at least one sample")
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Stats(n=int(arr.size), mean=float(arr.mean()), std=float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
                 min=float(arr.min()), p50=float(p50), p90=float(p90), p99=float(p99), max=float(arr.max()))


def time_call(fn: Callable[[], Any], device: torch.device | str | None = None, warmup: int = 1,
              repeats: int = 5) -> list[float]:
    """Wall-clock seconds of ``fn()`` per repeat, after ``warmup`` discarded calls, synchronized."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------------------------------
# Is the machine quiet enough to trust a timing? And does the spread support a claim?

BUSY_CORES = 0.5  # other processes using this many cores or more: the machine is busy


@dataclass(frozen=True)
class MachineLoad:
    """CPU used by *other* processes while this one slept for ``sample_s`` seconds.

    ``others_cores`` is in cores (1.0 = one core fully busy); ``cores`` is how many this
    process may use; ``load1`` the 1-minute load average (None where the OS has none). A
    sample of ``None`` means the machine could not be checked (no /proc/stat, no psutil).
    """

    others_cores: float | None
    cores: int
    load1: float | None
    sample_s: float

    @property
    def busy(self) -> bool:
        return self.others_cores is not None and self.others_cores >= BUSY_CORES

    def text(self) -> str:
        """One sentence for the page: what else was running."""
        if self.others_cores is None:
            return "The machine's load could not be checked here."
        load = f"; 1-minute load average {self.load1:.1f}" if self.load1 is not None else ""
        if self.busy:
            return (f"**The machine was busy:** other programs used {self.others_cores:.1f} of its {self.cores} "
                    f"cores while this ran{load}, so these timings measure the contention as much as the code.")
        return f"The machine was quiet (other programs used {self.others_cores:.1f} of {self.cores} cores{load})."

    def worst(self, other: MachineLoad) -> MachineLoad:
        """The busier of two checks (before and after a measurement)."""
        if self.others_cores is None:
            return other
        if other.others_cores is None:
            return self
        return self if self.others_cores >= other.others_cores else other


def _proc_stat() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def _own_jiffies() -> int | None:
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, ValueError, IndexError):
        return None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def machine_load(sample_s: float = 0.3) -> MachineLoad:
    """How many cores other processes keep busy, sampled over ``sample_s`` seconds of sleep.

    Linux reads /proc/stat (all CPUs) minus this process's own CPU time; elsewhere psutil when
    installed. Call it right before (and after) a timing: a busy result means the timing is not
    the code's alone.
    """
    if sample_s <= 0:
        raise ValueError(f"sample_s must be > 0, got {sample_s}")
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    all_cpus = os.cpu_count() or 1
    before, own_before = _proc_stat(), _own_jiffies()
    if before is not None and own_before is not None:
        time.sleep(sample_s)
        after, own_after = _proc_stat(), _own_jiffies()
        busy, total = after[0] - before[0], after[1] - before[1]
        if total > 0:
            others = max(0.0, (busy - (own_after - own_before)) / total) * all_cpus
            return MachineLoad(round(others, 2), _cores(), load1, sample_s)
    try:
        import psutil  # optional: psutil
    except ImportError:
        return MachineLoad(None, _cores(), load1, sample_s)
    me = psutil.Process()
    mine = sum(me.cpu_times()[:2])
    percent = psutil.cpu_percent(interval=sample_s)
    mine = sum(me.cpu_times()[:2]) - mine
    others = max(0.0, percent / 100 * all_cpus - mine / sample_s)
    return MachineLoad(round(others, 2), _cores(), load1, sample_s)


SUPPORTED, INCONCLUSIVE, CONTRADICTED = "supported", "inconclusive", "contradicted"


def compare_spreads(expected_lower: Sequence[float], expected_higher: Sequence[float],
                    margin: float = 0.0) -> str:
    """Whether repeated samples show ``expected_lower < expected_higher`` beyond their spread.

    :data:`SUPPORTED` when every sample of the lower group is below every sample of the
    higher one by more than ``margin`` (same unit), :data:`CONTRADICTED` when the groups are
    separated the other way, :data:`INCONCLUSIVE` when their ranges overlap.
    """
    lo, hi = list(expected_lower), list(expected_higher)
    if not lo or not hi:
        raise ValueError("compare_spreads() needs at least one sample in each group")
    if max(lo) + margin < min(hi):
        return SUPPORTED
    if max(hi) + margin < min(lo):
        return CONTRADICTED
    return INCONCLUSIVE
