"""Memory bandwidth across working-set sizes: where the caches end and main memory (or HBM) begins.

The measurement is :func:`infer_lab.hardware.measure_bandwidth`'s, ``dst.copy_(src)`` counted as
its bytes read plus its bytes written, at many sizes. The working set is both buffers together.
While it fits a cache level, copies run at that level's speed; past it, the speed drops to the
next level's: on a CPU the drops at L1, L2 and L3 ("cache cliffs"), on a GPU its L2 and then HBM.

A small copy takes microseconds, less than a timer's resolution and a GPU's launch: each timed
sample therefore repeats the copy until it lasts about ``sample_s``, after a warm-up. Short samples
(half a millisecond) and several of them keep the median usable on a busy machine: a sample that
the operating system interrupts is slow, and fewer samples are interrupted when each is short. The result is
the median over ``repeats`` samples with the slowest and fastest beside it. GB/s are 10⁹ bytes/s.

On a CPU the copies run on one thread (``threads=1``): L1 and L2 belong to one core, and on a busy
machine a small copy split over two threads mostly measures how long the second thread takes to be
scheduled. One core does not reach the whole chip's DRAM bandwidth; the ceilings of
:func:`infer_lab.hardware.measure_ceilings` use every thread.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..timing import time_call

KIB, MIB, GIB = 2**10, 2**20, 2**30


@dataclass(frozen=True)
class BandwidthPoint:
    """One working-set size: GB/s (10⁹ bytes read + written per second) of repeated copies."""

    working_set_bytes: int  # source + destination
    GBps: float  # median of the samples
    GBps_low: float  # the slowest sample
    GBps_high: float  # the fastest sample
    copies_per_sample: int
    samples: int


@contextmanager
def _cpu_threads(device: torch.device, threads: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if device.type == "cpu" and threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def copy_bandwidth(device: torch.device | str, working_set_bytes: int, repeats: int = 5,
                   sample_s: float = 5e-4, threads: int | None = 1) -> BandwidthPoint:
    """GB/s of ``dst.copy_(src)`` with ``src`` and ``dst`` together ``working_set_bytes`` (fp32);
    on a CPU with ``threads`` torch threads (``None``: as set)."""
    if repeats < 1 or working_set_bytes < 8:
        raise ValueError(f"need repeats >= 1 and a working set of at least 8 bytes, got {repeats}, {working_set_bytes}")
    dev = torch.device(device)
    with _cpu_threads(dev, threads):
        return _copy_bandwidth(dev, working_set_bytes, repeats, sample_s)


def _copy_bandwidth(dev: torch.device, working_set_bytes: int, repeats: int, sample_s: float) -> BandwidthPoint:
    src = torch.ones(working_set_bytes // 8, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    one = min(time_call(lambda: dst.copy_(src), device=dev, warmup=2, repeats=3))
    copies = max(1, round(sample_s / max(one, 1e-9)))

    def run() -> None:
        for _ in range(copies):
            dst.copy_(src)

    times = time_call(run, device=dev, warmup=1, repeats=repeats)
    moved = 2 * src.numel() * src.element_size() * copies  # read src, write dst
    return BandwidthPoint(2 * src.numel() * 4, moved / statistics.median(times) / 1e9, moved / max(times) / 1e9,
                          moved / min(times) / 1e9, copies, repeats)


def working_sets(smallest: int, largest: int, factor: int = 4) -> list[int]:
    """``smallest``, ``smallest x factor``, ... up to ``largest`` (bytes)."""
    if not 8 <= smallest <= largest or factor < 2:
        raise ValueError(f"need 8 <= smallest <= largest and factor >= 2, got {smallest}, {largest}, {factor}")
    sizes = [smallest]
    while sizes[-1] * factor <= largest:
        sizes.append(sizes[-1] * factor)
    return sizes


def bandwidth_sweep(device: torch.device | str, sizes: Sequence[int], repeats: int = 5,
                    sample_s: float = 5e-4, threads: int | None = 1) -> list[BandwidthPoint]:
    """:func:`copy_bandwidth` at each working-set size (bytes), smallest first, after one discarded
    sweep point (the first measurement of a process also pays for waking the caches and the clock)."""
    sizes = sorted(sizes)
    copy_bandwidth(device, sizes[0], 1, sample_s, threads)
    return [copy_bandwidth(device, n, repeats, sample_s, threads) for n in sizes]


@dataclass(frozen=True)
class CacheLevel:
    """A cache the working set can fit in: its name and size in bytes (per core unless ``shared``)."""

    name: str
    size_bytes: int
    shared: bool


def _sysfs_size(text: str) -> int:
    units = {"K": KIB, "M": MIB, "G": GIB}
    text = text.strip()
    return int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text or 0)


def cache_levels(device: torch.device | str = "cpu") -> list[CacheLevel]:
    """The data caches of ``device``, smallest first: a CPU's from Linux's sysfs (core 0), a GPU's L2
    from torch. Empty where the system does not say."""
    dev = torch.device(device)
    if dev.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)
        return [CacheLevel("L2", int(size), True)] if size else []
    levels = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind, level = (index / "type").read_text().strip(), (index / "level").read_text().strip()
            size = _sysfs_size((index / "size").read_text())
            shared = "-" in (index / "shared_cpu_list").read_text() or "," in (index / "shared_cpu_list").read_text()
        except (OSError, ValueError, KeyError):
            continue
        if kind != "Instruction" and size:
            levels.append(CacheLevel(f"L{level}", size, shared))
    return sorted(levels, key=lambda c: c.size_bytes)
