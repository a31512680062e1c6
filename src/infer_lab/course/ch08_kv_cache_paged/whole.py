"""Chapter 08 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import NO_MODEL, ChapterResult, run_parts
from ..saved import SavedView
from .cache import CacheResult, cache_figure, cache_table, cache_text, run_cache
from .fit import FitResult, fit_table, fit_text, run_fit
from .memory_bars import fit_figure, waste_figure
from .scenario import PARTS, Sizes, sizes
from .waste import WasteResult, run_waste, waste_table, waste_text


@dataclass
class Result(ChapterResult):
    """Chapter 08's results; a part not run is ``None``."""

    model: str = ""
    cache: CacheResult | None = None
    waste: WasteResult | None = None
    fit: FitResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiments in a row (``parts`` picks some of :data:`PARTS`), run from the notebook."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "cache": lambda: run_cache(lm, sizes),
        "waste": lambda: run_waste(sizes.waste),
        "fit": lambda: run_fit(sizes.waste),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.cache:
        lines.append(cache_text(result.cache))
    if result.waste:
        lines.append(f"Simulated ({result.waste.settings.describe()}): " + waste_text(result.waste))
    if result.fit:
        lines.append(fit_text(result.fit))
    return "\n\n".join(lines)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.cache:
        out["No cache vs KV cache, whole generation"] = cache_table(result.cache)
    if result.waste:
        out["Where KV memory goes, time-averaged (simulated)"] = waste_table(result.waste)
    if result.fit:
        out["Requests that fit at once in the KV budget (the engine's allocators)"] = fit_table(result.fit)
    return out


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.cache:
        out["cache"] = cache_figure(result.cache, result.model)
    if result.waste:
        out["waste"] = waste_figure(result.waste)
    if result.fit:
        out["fit"] = fit_figure(result.fit)
    return out


def saved() -> SavedView | None:
    """No GPU run of this chapter is saved yet: ``None`` (see :func:`gpu_note`)."""
    return None


def gpu_note() -> str:
    """What this chapter shows on a GPU, for a machine without one (markdown)."""
    return (
        "**No saved GPU run of this chapter exists yet**: the time-per-token curve above is from this "
        "machine only. On a GPU this chapter runs a 7B shape over longer contexts "
        f"({sizes('cuda', 'full').prompt_len:,}-token prompts, {sizes('cuda', 'full').new_tokens:,} new tokens), "
        "where recomputing the context makes every no-cache step compute-heavy and the curve bends upward. "
        "The memory parts are analytic and the same on every machine."
    )
