"""All-reduce time vs message size on a live process group, and the latency + bandwidth fit.

Every rank runs the same loop: for each message size, a few untimed all-reduces (warm-up),
then ``repeats`` timed ones, each started together after a barrier so one rank's lateness is
not billed as transfer time. Rank 0's times are the measurement. The fit is
:func:`infer_lab.analysis.parallel.fit_allreduce`: ``t = alpha + beta x bytes``, read by the
ring model as 2(N-1) hops of latency and a bus bandwidth, so the fitted link can be used
wherever a catalog interconnect goes (``allreduce_cost(2, bytes, fitted)``). The fit uses the
medians; when other programs load the machine so much that the medians do not grow with the
message size, it falls back to the fastest runs, and says so (``fitted_on``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.parallel import fit_allreduce, ring_allreduce_s
from .comm import Communicator

FP32 = 4  # bytes per element of the messages timed here


def default_sizes(quick: bool = True) -> tuple[int, ...]:
    """Message sizes in bytes: from one fp32 value to about 4 MB (quick: fewer points)."""
    elements = (1, 576, 4_608, 36_864, 294_912, 1_048_576) if quick else (1, 64, 576, 2_304, 9_216, 36_864, 147_456,
                                                                 589_824, 1_048_576)
    return tuple(n * FP32 for n in elements)


def time_allreduces(comm: Communicator, sizes_bytes: tuple[int, ...], repeats: int, warmup: int = 3) -> list[list[float]]:
    """On every rank of ``comm``: seconds of each timed all-reduce, one list per size (SUM of fp32)."""
    out = []
    for size in sizes_bytes:
        t = torch.ones(max(1, size // FP32), dtype=torch.float32, device=comm.device)
        for _ in range(warmup):
            comm.all_reduce(t)
        times = []
        for _ in range(repeats):
            comm.barrier()
            if comm.device.type == "cuda":
                torch.cuda.synchronize(comm.device)
            t0 = time.perf_counter()
            comm.all_reduce(t)
            if comm.device.type == "cuda":
                torch.cuda.synchronize(comm.device)
            times.append(time.perf_counter() - t0)
        out.append(times)
    comm.reset()  # the sweep is not part of any generation's count
    return out


@dataclass(frozen=True)
class AllReducePoint:
    """One message size: median, p90 and min of the timed all-reduces (seconds)."""

    message_bytes: int
    p50_s: float
    p90_s: float
    min_s: float
    repeats: int

    @property
    def algorithm_bandwidth_Bps(self) -> float:
        """Message bytes over the median time (nccl-tests' "algbw")."""
        return self.message_bytes / self.p50_s


@dataclass(frozen=True)
class AllReduceSweep:
    """All-reduce times on ``world_size`` ranks over ``backend``, and their fit."""

    world_size: int
    backend: str
    threads_per_rank: int
    points: list[AllReducePoint]
    fitted_on: str  # "p50", or "min" when the medians were too noisy to show a bandwidth term
    link: Any = field(default=None, compare=False)  # the fitted InterconnectSpec

    @classmethod
    def from_times(cls, world_size: int, backend: str, threads: int, sizes: tuple[int, ...],
                   times: list[list[float]]) -> AllReduceSweep:
        points = []
        for size, ts in zip(sizes, times, strict=True):
            ordered = sorted(ts)
            p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
            points.append(AllReducePoint(size, statistics.median(ts), p90, ordered[0], len(ts)))
        name = f"{backend} on this machine ({world_size} processes)"
        try:
            link, fitted_on = fit_allreduce([(p.message_bytes, p.p50_s) for p in points], world_size, name), "p50"
        except ValueError:  # on a loaded machine the medians can fail to grow with the size
            link, fitted_on = fit_allreduce([(p.message_bytes, p.min_s) for p in points], world_size, name), "min"
        return cls(world_size, backend, threads, points, fitted_on, link)

    @property
    def latency_s(self) -> float:
        """The fitted fixed cost of one all-reduce (alpha), seconds."""
        return 2 * (self.world_size - 1) * self.link.hop_latency_s

    @property
    def bus_bandwidth_Bps(self) -> float:
        """The fitted ring bus bandwidth, bytes/s per direction."""
        return self.link.bus_bandwidth_Bps(self.world_size)

    def predicted_s(self, message_bytes: int) -> float:
        """The ring model on the fitted link: one all-reduce of ``message_bytes``."""
        return ring_allreduce_s(self.world_size, message_bytes, self.link)
