"""Chapter 08 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
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


PAGE = Page(
    PARTS,
    Part("cache", run_cache,
         text=lambda r: cache_text(r.cache),
         tables=lambda r: {"No cache vs KV cache, whole generation": cache_table(r.cache)},
         figures=lambda r: {"cache": cache_figure(r.cache, r.model)}),
    Part("waste", lambda lm, sizes: run_waste(sizes.waste),
         text=lambda r: f"Simulated ({r.waste.settings.describe()}): " + waste_text(r.waste),
         tables=lambda r: {"Where KV memory goes, time-averaged (simulated)": waste_table(r.waste)},
         figures=lambda r: {"waste": waste_figure(r.waste)}),
    Part("fit", lambda lm, sizes: run_fit(sizes.waste),
         text=lambda r: fit_text(r.fit),
         tables=lambda r: {"Requests that fit at once in the KV budget (the engine's allocators)": fit_table(r.fit)},
         figures=lambda r: {"fit": fit_figure(r.fit)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiments in a row (``parts`` picks some of :data:`PARTS`), run from the notebook."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


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
