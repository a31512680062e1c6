"""Chapter 07 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...bench.attention import BackendTime, DecodeAttentionTime
from ..chapter import ChapterResult, Page, Part, model_name
from ..saved import SavedView, load_saved
from ..tables import people_table
from .beyond_kv import dsa_reads, dsa_text, state_table
from .card import scorecard_figure, scorecard_rows, scorecard_table
from .equivalence import EquivalenceRow, equivalence_table, equivalence_text, run_equivalence
from .flash import flash_result, flash_table, flash_text, hbm_figure
from .memory import kv_figure, memory_rows, memory_table, memory_text
from .mla import mla_table, mla_text
from .quality import QualityResult, quality_figure, quality_table, quality_text, run_quality
from .scenario import DEFAULT_CONTEXT, DEFAULT_GPU, PARTS, Sizes
from .shared import threads_text
from .timing import (
    BACKEND_COLUMNS,
    DECODE_COLUMNS,
    TimingResult,
    backend_table,
    decode_table,
    run_timing,
    timing_figure,
    timing_text,
)


@dataclass
class Result(ChapterResult):
    """Chapter 07's measurements; a part not run is ``None``."""

    model: str = ""
    equivalence: list[EquivalenceRow] | None = None
    quality: QualityResult | None = None
    timing: TimingResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("equivalence", run_equivalence,
         text=lambda r: equivalence_text(r.equivalence),
         tables=lambda r: {"Every variant against SDPA": equivalence_table(r.equivalence)}),
    Part("memory (analytic)",
         text=lambda r: memory_text(memory_rows()),
         tables=lambda r: {f"KV memory per variant on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens (analytic)":
                           memory_table(memory_rows())},
         figures=lambda r: {"kv": kv_figure(memory_rows(), "KV bytes per token per variant, all layers (analytic)")}),
    Part("mla (analytic)",
         text=lambda r: mla_text(),
         tables=lambda r: {"The MLA ratio against each baseline (analytic)": mla_table()}),
    Part("quality", run_quality,
         text=lambda r: quality_text(r.quality),
         tables=lambda r: {"Quality on real weights": quality_table(r.quality)} if r.quality.rows else {},
         figures=lambda r: {"quality": quality_figure(r.quality, r.quality.model)} if r.quality.rows else {}),
    # The scorecard adds the quality part's measurements when that part ran.
    Part("scorecard (analytic)",
         tables=lambda r: {f"Scorecard on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens (analytic memory, roofline "
                           "speed)": scorecard_table(scorecard_rows(quality=r.quality))},
         figures=lambda r: {"scorecard": scorecard_figure(scorecard_rows(quality=r.quality),
                                                          f"Attention variants on {DEFAULT_GPU}, "
                                                          f"{DEFAULT_CONTEXT:,} tokens: analytic memory, "
                                                          "roofline speed")}),
    Part("beyond kv (analytic)",
         text=lambda r: dsa_text(dsa_reads()),
         tables=lambda r: {"Architectures without a growing KV cache (analytic)": state_table()}),
    Part("flash (analytic)",
         text=lambda r: flash_text(flash_result()),
         tables=lambda r: {f"Attention HBM traffic, naive vs tiled, tiles in {DEFAULT_GPU}'s shared memory per "
                           "thread block (analytic)": flash_table()},
         figures=lambda r: {"hbm": hbm_figure(flash_result())}),
    Part("timing", run_timing,
         text=lambda r: timing_text(r.timing),
         tables=lambda r: {"SDPA backends on this machine": backend_table(r.timing),
                           "Decode attention vs KV heads on this machine": decode_table(r.timing)},
         figures=lambda r: {"timing": timing_figure(r.timing)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result`` or the analytic model."""
    return PAGE.summary(result, f"Model: {result.model}; {threads_text(result.threads)}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> SavedView | None:
    """``scripts/gpu_checks.py --only attention`` results saved from a GPU, when there are any."""
    found = [s for s in load_saved("attention-*-cuda-*.json") if s.data.get("sdpa_backends")]
    if not found:
        return None
    src = found[0]
    backends = [BackendTime(**{k: v for k, v in r.items() if k in BackendTime.__dataclass_fields__})
                for r in src.data["sdpa_backends"]]
    decode = [DecodeAttentionTime(**{k: v for k, v in r.items() if k in DecodeAttentionTime.__dataclass_fields__})
              for r in src.data.get("decode_vs_kv_heads", [])]
    return SavedView(
        title=f"Attention timed on {src.device}",
        source=src,
        tables={"SDPA backends": people_table(backends, BACKEND_COLUMNS),
                "Decode attention vs KV heads": people_table(decode, DECODE_COLUMNS)},
        notes=[f"Measured by: {src.command}"],
    )
