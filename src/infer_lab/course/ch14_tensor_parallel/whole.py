"""Chapter 14 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..chapter import ChapterResult, Page, Part, model_name
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


PAGE = Page(
    PARTS,
    Part("tp", run_tp,
         text=lambda r: tp_text(r.tp),
         tables=lambda r: {"Decode step, world size 1 vs 2 (this machine)": tp_steps_table(r.tp),
                           "All-reduce vs message size (this machine)": sweep_table(r.tp)},
         figures=lambda r: {"tp": tp_figure(r.tp)}),
    Part("scaling", run_scaling,
         text=lambda r: scaling_text(r.scaling),
         tables=lambda r: scaling_tables(r.scaling),
         figures=lambda r: scaling_figures(r.scaling)),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {result.threads} torch thread(s).")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


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
