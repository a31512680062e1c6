"""Chapter 07 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...bench.attention import BackendTime, DecodeAttentionTime
from ..chapter import NO_MODEL, ChapterResult, run_parts
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


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "equivalence": lambda: run_equivalence(lm, sizes),
        "quality": lambda: run_quality(lm, sizes),
        "timing": lambda: run_timing(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result`` or the analytic model."""
    lines = [f"Model: {result.model}; {threads_text(result.threads)}."]
    if result.equivalence:
        lines.append(equivalence_text(result.equivalence))
    lines.append(memory_text(memory_rows()))
    lines.append(mla_text())
    lines.append(dsa_text(dsa_reads()))
    lines.append(flash_text(flash_result()))
    if result.quality:
        lines.append(quality_text(result.quality))
    if result.timing:
        lines.append(timing_text(result.timing))
    return "\n\n".join(lines)


def tables(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.equivalence:
        out["Every variant against SDPA"] = equivalence_table(result.equivalence)
    out[f"KV memory per variant on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens (analytic)"] = memory_table(memory_rows())
    out["The MLA ratio against each baseline (analytic)"] = mla_table()
    if result.quality and result.quality.rows:
        out["Quality on real weights"] = quality_table(result.quality)
    out[f"Scorecard on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens (analytic memory, roofline speed)"] = (
        scorecard_table(scorecard_rows(quality=result.quality)))
    out["Architectures without a growing KV cache (analytic)"] = state_table()
    out[f"Attention HBM traffic, naive vs tiled, tiles in {DEFAULT_GPU}'s shared memory per thread block "
        "(analytic)"] = flash_table()
    if result.timing:
        out["SDPA backends on this machine"] = backend_table(result.timing)
        out["Decode attention vs KV heads on this machine"] = decode_table(result.timing)
    return out


def figures(result: Result) -> dict[str, Any]:
    out = {
        "kv": kv_figure(memory_rows(), "KV bytes per token per variant, all layers (analytic)"),
        "hbm": hbm_figure(flash_result()),
        "scorecard": scorecard_figure(scorecard_rows(quality=result.quality),
                                      f"Attention variants on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens: "
                                      "analytic memory, roofline speed"),
    }
    if result.quality and result.quality.rows:
        out["quality"] = quality_figure(result.quality, result.quality.model)
    if result.timing:
        out["timing"] = timing_figure(result.timing)
    return out


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
