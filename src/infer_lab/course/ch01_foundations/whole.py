"""Chapter 01 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...analysis.flops import ComponentFlops
from ...units import count
from ..chapter import NO_MODEL, ChapterResult, run_parts
from ..saved import SavedView
from .bandwidth import (
    BandwidthResult,
    bandwidth_figure,
    bandwidth_table,
    bandwidth_text,
    run_bandwidth,
)
from .decode import DecodeResult, budget_figure, budget_text, decode_table, decode_text, run_decode
from .flops import flops_figure, flops_table, flops_text, run_flops
from .loop import LoopResult, loop_table, loop_text, run_loop
from .scenario import PARTS, Sizes


@dataclass
class Result(ChapterResult):
    """Chapter 01's parts; a part not run is ``None``."""

    model: str = ""
    loop: LoopResult | None = None
    flops: list[ComponentFlops] | None = None
    bandwidth: BandwidthResult | None = None
    decode: DecodeResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "loop": lambda: run_loop(lm, sizes),
        "flops": lambda: run_flops(lm, sizes),
        "bandwidth": lambda: run_bandwidth(lm, sizes),
        "decode": lambda: run_decode(lm, sizes),
    })


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.flops:
        out["flops"] = flops_figure(result.flops)
    if result.bandwidth:
        out["bandwidth"] = bandwidth_figure(result.bandwidth.points, result.bandwidth.device_type)
    if result.decode:
        out["decode"] = budget_figure(result.decode.step, result.model)
    return out


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.loop:
        out["The loop, pass by pass"] = loop_table(result.loop)
    if result.flops:
        out["One token's FLOPs by component"] = flops_table(result.flops)
    if result.bandwidth:
        out["Copy bandwidth by working set"] = bandwidth_table(result.bandwidth)
    if result.decode:
        out["One decode step: predicted and measured"] = decode_table(result.decode.step, result.decode.measured)
    return out


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.loop:
        lines.append(loop_text(result.loop))
    if result.flops:
        lines.append(flops_text(result.flops))
    if result.bandwidth:
        lines.append(bandwidth_text(result.bandwidth.points, result.bandwidth.device_type))
    if result.decode:
        lines.append(budget_text(result.decode.step, (result.decode.weight_bytes, result.decode.kv_bytes)))
        lines.append(decode_text(result.decode.step, result.decode.measured))
    return "\n\n".join(lines)


def saved() -> SavedView | None:
    """No saved GPU run for this chapter yet: every part runs on the learner's own machine."""
    return None
