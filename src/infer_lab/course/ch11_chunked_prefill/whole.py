"""Chapter 11 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import NO_MODEL, ChapterResult, run_parts
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


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiment (``parts`` picks from :data:`PARTS`), the notebook's own code."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {"chunking": lambda: run_chunking(lm, sizes)})


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.chunking:
        lines.append(chunking_text(result.chunking))
    lines.append(agent_prompt_text(agent_prompt_rows()))
    return "\n\n".join(lines)


def tables(result: Result) -> dict[str, Any]:
    if not result.chunking:
        return {}
    return {"Decoders' ITL and the long request's TTFT": runs_table(result.chunking),
            "Every engine step": steps_table(result.chunking)}


def figures(result: Result) -> dict[str, Any]:
    return {"chunking": chunking_figure(result.chunking, result.model)} if result.chunking else {}


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
