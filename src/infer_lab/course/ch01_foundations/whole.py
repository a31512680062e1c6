"""Chapter 01 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...analysis.flops import ComponentFlops
from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
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


PAGE = Page(
    PARTS,
    Part("loop", run_loop,
         text=lambda r: loop_text(r.loop),
         tables=lambda r: {"The loop, pass by pass": loop_table(r.loop)}),
    Part("flops", run_flops,
         text=lambda r: flops_text(r.flops),
         tables=lambda r: {"One token's FLOPs by component": flops_table(r.flops)},
         figures=lambda r: {"flops": flops_figure(r.flops)}),
    Part("bandwidth", run_bandwidth,
         text=lambda r: bandwidth_text(r.bandwidth.points, r.bandwidth.device_type),
         tables=lambda r: {"Copy bandwidth by working set": bandwidth_table(r.bandwidth)},
         figures=lambda r: {"bandwidth": bandwidth_figure(r.bandwidth.points, r.bandwidth.device_type)}),
    Part("decode", run_decode,
         text=lambda r: [budget_text(r.decode.step, (r.decode.weight_bytes, r.decode.kv_bytes)),
                         decode_text(r.decode.step, r.decode.measured)],
         tables=lambda r: {"One decode step: predicted and measured": decode_table(r.decode.step, r.decode.measured)},
         figures=lambda r: {"decode": budget_figure(r.decode.step, r.model)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> SavedView | None:
    """No saved GPU run for this chapter yet: every part runs on the learner's own machine."""
    return None
