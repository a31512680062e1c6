"""Chapter 10 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import NO_MODEL, ChapterResult, run_parts
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


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiments in a row (``parts`` picks some of :data:`PARTS`), the notebook's own code."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "granularity": lambda: run_granularity(lm, sizes),
        "workloads": lambda: run_workloads(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.granularity:
        lines.append(granularity_text(result.granularity))
    if result.workloads:
        lines += [workloads_text(result.workloads), sglang_claim_text(result.workloads)]
    return "\n\n".join(line for line in lines if line)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.granularity:
        out["Prompt tokens reused, by tokens shared"] = granularity_table(result.granularity)
    if result.workloads:
        out["Three workloads, no cache vs hash vs radix"] = workloads_table(result.workloads)
    return out


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.granularity:
        out["granularity"] = granularity_figure(result.granularity, result.model)
    if result.workloads:
        out["workloads"] = workloads_figure(result.workloads, result.model)
    return out


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
