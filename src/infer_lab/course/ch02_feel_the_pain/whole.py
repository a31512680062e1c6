"""Chapter 02 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import NO_MODEL, ChapterResult, run_parts
from ..saved import SavedView, load_saved
from ..tables import Column, people_table
from .baseline import saved_warning
from .itl import ITLPoint, itl_figure, itl_table, itl_text, run_itl
from .kv_memory import MemoryResult, memory_figure, memory_table, memory_text, run_memory
from .scenario import PARTS, Sizes
from .serving import ServingResult, run_serving, serving_figure, serving_table, serving_text
from .ttft import TTFTPoint, run_ttft, ttft_figure, ttft_table, ttft_text


@dataclass
class Result(ChapterResult):
    """Chapter 02's measurements; a part not run is ``None``."""

    model: str = ""
    memory: MemoryResult | None = None
    ttft: list[TTFTPoint] | None = None
    serving: ServingResult | None = None
    itl: list[ITLPoint] | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`): the notebook's experiments."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "memory": lambda: run_memory(lm, sizes),
        "ttft": lambda: run_ttft(lm, sizes),
        "serving": lambda: run_serving(lm, sizes),
        "itl": lambda: run_itl(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.memory:
        lines.append(memory_text(result.memory))
    if result.ttft:
        lines.append(ttft_text(result.ttft))
    if result.serving:
        lines.append(serving_text(result.serving))
    if result.itl:
        lines.append(itl_text(result.itl))
    return "\n\n".join(lines)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.memory:
        out["KV memory, measured from the cache tensors"] = memory_table(result.memory)
    if result.ttft:
        out["Time to first token"] = ttft_table(result.ttft)
    if result.serving:
        out["Sequential vs batched serving"] = serving_table(result.serving)
    if result.itl:
        out["Decode step (ITL) by context and batch"] = itl_table(result.itl)
    return out


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.memory:
        out["memory"] = memory_figure(result.memory, result.model)
    if result.ttft:
        out["ttft"] = ttft_figure(result.ttft, result.model)
    if result.serving:
        out["serving"] = serving_figure(result.serving, result.model)
    if result.itl:
        out["itl"] = itl_figure(result.itl, result.model)
    return out


def saved() -> SavedView | None:
    """The saved H200 HF-eager baseline (Mistral-7B shape, random bf16 weights), with its caution."""
    found = load_saved("h200-hf-baseline-*.json")
    if not found:
        return None
    src = found[0]
    d = src.data
    ctx = people_table(d["ctx_sweep"], [
        Column("ctx", "context (tokens)", "int"), Column("ttft_ms", "TTFT (ms)"),
        Column("itl_ms", "ITL (ms)"), Column("peak_GB", "peak memory (GB)"),
    ])
    batch = people_table(d["batch_sweep"], [
        Column("batch", "batch", "int"), Column("step_ms", "decode step (ms)"),
        Column("tok_s_total", "tokens/s total"), Column("tok_s_user", "tokens/s per user"),
    ])
    return SavedView(
        title=f"HF transformers eager on {src.device}: {src.raw.get('model')} ({src.raw.get('weights')} weights)",
        source=src,
        tables={"TTFT and ITL by context, batch 1": ctx, "Decode step by batch, context 512": batch},
        notes=[f"Measured by: {src.command}"],
        warning=saved_warning(d),
    )
