"""Chapter 02 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
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


PAGE = Page(
    PARTS,
    Part("memory", run_memory,
         text=lambda r: memory_text(r.memory),
         tables=lambda r: {"KV memory, measured from the cache tensors": memory_table(r.memory)},
         figures=lambda r: {"memory": memory_figure(r.memory, r.model)}),
    Part("ttft", run_ttft,
         text=lambda r: ttft_text(r.ttft),
         tables=lambda r: {"Time to first token": ttft_table(r.ttft)},
         figures=lambda r: {"ttft": ttft_figure(r.ttft, r.model)}),
    Part("serving", run_serving,
         text=lambda r: serving_text(r.serving),
         tables=lambda r: {"Sequential vs batched serving": serving_table(r.serving)},
         figures=lambda r: {"serving": serving_figure(r.serving, r.model)}),
    Part("itl", run_itl,
         text=lambda r: itl_text(r.itl),
         tables=lambda r: {"Decode step (ITL) by context and batch": itl_table(r.itl)},
         figures=lambda r: {"itl": itl_figure(r.itl, r.model)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`): the notebook's experiments."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


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
