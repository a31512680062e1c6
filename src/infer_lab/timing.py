"""Timing that can be trusted: synchronize the device, warm up, repeat, report percentiles.

Used by the hardware micro-benchmarks and by the measurement harness; depends on nothing else
of the package, so both can import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work, so wall-clock timing measures the work and not its launch."""
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
