"""Chapter 14 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..chapter import NO_MODEL, ChapterResult, run_parts
from ..saved import SavedView, load_saved
from ..tables import people_table
from .scaling import ScalingResult, run_scaling, scaling_tables
from .scaling_figures import scaling_figures
from .scaling_findings import scaling_text
from .scenario import PARTS, Sizes
from .tp import TP_STEP_COLUMNS, TPResult, run_tp, sweep_table, tp_figure, tp_steps_table
from .tp_findings import tp_text


@dataclass
class Result(ChapterResult):
    """Chapter 14's parts; a part not run is ``None``."""

    model: str = ""
    tp: TPResult | None = None
    scaling: ScalingResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "tp": lambda: run_tp(lm, sizes),
        "scaling": lambda: run_scaling(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {result.threads} torch thread(s)."]
    texts = [(result.tp, tp_text), (result.scaling, scaling_text)]
    lines += [fn(part) for part, fn in texts if part is not None]
    return "\n\n".join(lines)


def tables(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.tp:
        out["Decode step, world size 1 vs 2 (this machine)"] = tp_steps_table(result.tp)
        out["All-reduce vs message size (this machine)"] = sweep_table(result.tp)
    if result.scaling:
        out.update(scaling_tables(result.scaling))
    return out


def figures(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.tp:
        out["tp"] = tp_figure(result.tp)
    if result.scaling:
        out.update(scaling_figures(result.scaling))
    return out


def saved() -> SavedView | None:
    """TP runs saved from a multi-GPU machine (nccl), when there are any."""
    found = load_saved("*-tensor-parallel-*.json")
    if not found:
        return None
    src = found[0]
    rows = src.data.get("runs", [])
    return SavedView(
        title=f"Tensor parallelism on {src.device}",
        source=src,
        tables={"Decode step by world size": people_table(rows, TP_STEP_COLUMNS)},
        notes=[f"Measured by: {src.command}"],
    )
