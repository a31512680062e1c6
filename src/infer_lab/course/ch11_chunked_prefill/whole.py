"""Chapter 11 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
from ..saved import SavedView
from .agents import agent_prompt_rows, agent_prompt_text
from .chunking import (
    ChunkingResult,
    chunking_figure,
    chunking_text,
    run_chunking,
    runs_table,
    steps_table,
)
from .scenario import PARTS, Sizes, sizes


@dataclass
class Result(ChapterResult):
    """Chapter 11's measurement; ``None`` when not run."""

    model: str = ""
    chunking: ChunkingResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("chunking", run_chunking,
         text=lambda r: chunking_text(r.chunking),
         tables=lambda r: {"Decoders' ITL and the long request's TTFT": runs_table(r.chunking),
                           "Every engine step": steps_table(r.chunking)},
         figures=lambda r: {"chunking": chunking_figure(r.chunking, r.model)}),
    Part("agents (analytic)", text=lambda r: agent_prompt_text(agent_prompt_rows())),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiment (``parts`` picks from :data:`PARTS`), the notebook's own code."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


# ---------------------------------------------------------------------------------------------
# Saved GPU results


def saved() -> SavedView | None:
    """No GPU run of this chapter is saved yet: ``None`` (see :func:`gpu_note`)."""
    return None


def gpu_note() -> str:
    """What this chapter measures on a GPU, for a machine without one (markdown)."""
    full = sizes("cuda", "full")
    return (
        "**No saved GPU run of this chapter exists yet**: the numbers above are from this machine. "
        f"On a GPU the full scenario is a {full.long_prompt:,}-token prompt arriving among {full.decoders} "
        f"decoding requests, with a {full.max_num_batched_tokens}-token budget per step: press the button there to see "
        "the spike and its chunks at a real model's scale."
    )
