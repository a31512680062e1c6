"""Section 3 of chapter 01: your memory, level by level (the notebook's ``bandwidth_curve``, and a GPU's two levels)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...bench.bandwidth import GIB, KIB, MIB, BandwidthPoint, CacheLevel, cache_levels
from ...figures import finish, subplots
from ...hardware import device_label
from ...units import human
from .. import ch04_prefill_decode_roofline as ch04
from ..chapter import check_machine
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class BandwidthResult:
    device_type: str  # "cpu" or "cuda"
    device: str
    threads: int  # torch threads of the copies (1 on a CPU: see infer_lab.bench.bandwidth)
    points: list[BandwidthPoint]
    levels: list[CacheLevel]


def _binary(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{human(n / size)} {unit}"
    return f"{n} B"


def levels_text(device: Any = None) -> str:
    """The device's caches (default: the GPU when there is one, else the CPU), as the operating system
    (or torch) reports them: the page's prediction."""
    dev = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    levels = cache_levels(dev)
    where = "torch" if dev.type == "cuda" else "the operating system"
    if not levels:
        return f"{device_label(dev)} does not report its cache sizes here."
    listed = ", ".join(f"{c.name} {_binary(c.size_bytes)}" + ("" if dev.type == "cuda" else
                                                              (" shared" if c.shared else " per core"))
                       for c in levels)
    return f"{device_label(dev)} has these data caches ({where} says so): {listed}."


def gpu_memory_text() -> str:
    """A GPU's two memory levels, HBM and on-chip SRAM (shared memory), in sizes and bandwidths from
    the catalog: chapter 04's ``hierarchy_text`` for the GPU its deck slides use."""
    gpu = ch04.sizes("cpu", "quick").gpu
    return ch04.hierarchy_text(ch04.hierarchy_rows([gpu]), gpu)


def run_bandwidth(lm: Any, sizes: Sizes) -> BandwidthResult:
    """Run the notebook's own sweep (``bandwidth_curve``) on the model's device."""
    points = notebook_function(NUMBER, "bandwidth_curve")(lm.device, sizes.bw_smallest, sizes.bw_largest,
                                                          sizes.bw_repeats)
    return bandwidth_result(points, lm.device)


def bandwidth_result(points: list[BandwidthPoint], device: Any) -> BandwidthResult:
    dev = torch.device(device)
    return BandwidthResult(dev.type, device_label(dev), 1 if dev.type == "cpu" else 0, list(points), cache_levels(dev))


def bandwidth_figure(points: list[BandwidthPoint], device: Any):
    """GB/s against the working set (log axis), the spread of the samples shaded, the caches marked."""
    result = bandwidth_result(points, device)
    fig, ax = subplots(figsize=(8, 4.2))
    xs = [p.working_set_bytes for p in points]
    ax.plot(xs, [p.GBps for p in points], "o-", label="median of the samples")
    ax.fill_between(xs, [p.GBps_low for p in points], [p.GBps_high for p in points], alpha=0.2,
                    label="slowest to fastest sample")
    top = max(p.GBps_high for p in points)
    for c in result.levels:
        if xs[0] <= c.size_bytes <= xs[-1] * 2:
            ax.axvline(c.size_bytes, color="0.4", ls="--", lw=1)
            ax.text(c.size_bytes, top * 1.02, f" {c.name} {_binary(c.size_bytes)}", fontsize=8, rotation=90,
                    va="top", ha="right")
    ax.set_xscale("log", base=2)
    ticks = xs[::2]
    ax.set_xticks(ticks, [_binary(x) for x in ticks], fontsize=8, rotation=30)
    ax.minorticks_off()
    ax.set_ylim(0, top * 1.1)
    ax.set(xlabel="working set (source + destination)", ylabel="copy bandwidth (GB/s, read + written)")
    threads = f", {result.threads} thread" if result.threads else ""
    ax.set_title(f"Copy bandwidth by working set: {result.device}{threads}, fp32 buffers", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    finish(fig)
    return fig


def bandwidth_text(points: list[BandwidthPoint], device: Any) -> str:
    """The fastest level, the largest working set, the drop between them; every number from the points."""
    result = bandwidth_result(points, device)
    best = max(points, key=lambda p: p.GBps)
    last = points[-1]
    fall = next((p for p in points if p.working_set_bytes > best.working_set_bytes and p.GBps < 0.6 * best.GBps), None)
    lines = [f"The fastest copies ran at **{human(best.GBps)} GB/s** with a working set of "
             f"{_binary(best.working_set_bytes)}; at the largest, {_binary(last.working_set_bytes)}, they ran at "
             f"**{human(last.GBps)} GB/s**, {human(best.GBps / last.GBps)}× slower."]
    if fall is not None:
        below = [c for c in result.levels if c.size_bytes < fall.working_set_bytes]
        above = [c for c in result.levels if c.size_bytes >= fall.working_set_bytes]
        named = [f"the {c.name} ({_binary(c.size_bytes)})" for c in (below[-1:] + above[:1])]
        where = (f", between {named[0]} and {named[1]}" if below and above else
                 f", beyond {named[0]}" if below else f", within {named[0]}" if above else "")
        lines.append(f"The curve first falls below 60 % of its peak at {_binary(fall.working_set_bytes)}{where}: "
                     "compare with the cache sizes above (on a busy machine one slow point can come early).")
    if result.threads:
        lines.append(f"One thread, so this is one core's view of {result.device}: more threads move more bytes per "
                     "second from main memory (the ceilings of part 4 use every thread). At the smallest sizes each "
                     "copy lasts well under a microsecond and torch's fixed cost per call is part of the time, so "
                     "they read lower than the cache could do.")
    else:
        lines.append("On a GPU the smallest copies are too short to fill the chip, and each is a kernel launch: "
                     "they read low for that reason, not because the L2 is slow.")
    lines.append(f"Each point: the median of {points[0].samples} timed samples after a warm-up. "
                 + check_machine().text())
    return " ".join(lines)


BANDWIDTH_COLUMNS = [
    Column("working_set_bytes", "working set (bytes)", "bytes"), Column("GBps", "GB/s (median)"),
    Column("GBps_low", "GB/s (slowest sample)"), Column("GBps_high", "GB/s (fastest sample)"),
    Column("copies_per_sample", "copies per sample", "int"),
]


def bandwidth_table(result: BandwidthResult):
    return people_table(result.points, BANDWIDTH_COLUMNS)
