"""Chapter 10 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
from ..saved import SavedView
from .granularity import (
    MatchResult,
    granularity_figure,
    granularity_table,
    granularity_text,
    run_granularity,
)
from .scenario import PARTS, Sizes, sizes
from .workloads import (
    WorkloadsResult,
    run_workloads,
    sglang_claim_text,
    workloads_figure,
    workloads_table,
    workloads_text,
)


@dataclass
class Result(ChapterResult):
    """Chapter 10's measurements; a part not run is ``None``."""

    model: str = ""
    granularity: MatchResult | None = None
    workloads: WorkloadsResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("granularity", run_granularity,
         text=lambda r: granularity_text(r.granularity),
         tables=lambda r: {"Prompt tokens reused, by tokens shared": granularity_table(r.granularity)},
         figures=lambda r: {"granularity": granularity_figure(r.granularity, r.model)}),
    Part("workloads", run_workloads,
         text=lambda r: [workloads_text(r.workloads), sglang_claim_text(r.workloads)],
         tables=lambda r: {"Three workloads, no cache vs hash vs radix": workloads_table(r.workloads)},
         figures=lambda r: {"workloads": workloads_figure(r.workloads, r.model)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiments in a row (``parts`` picks some of :data:`PARTS`), the notebook's own code."""
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
        "The token counts and hit rates are exact on any device; only the TTFT depends on it. "
        f"On a GPU the workloads share a {full.system_len:,}-token system prompt across {full.users} users, "
        "where a prefix hit skips most of each prefill and the TTFT gap becomes large."
    )
