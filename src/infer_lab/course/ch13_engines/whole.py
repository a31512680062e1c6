"""Chapter 13 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
from ..saved import SavedView
from .decision_chart import decision_figure, decision_table
from .scale_out import scale_out_plan, scale_out_table, scale_out_text
from .scenario import PARTS, Sizes
from .sweep import SweepResult, run_sweep, sweep_figures, sweep_table, sweep_text
from .variants import VariantsResult, run_variants, variants_figure, variants_table, variants_text
from .vllm_sglang import gpu_note
from .workshop import WORKSHOP_TITLE, workshop_table, workshop_text


@dataclass
class Result(ChapterResult):
    """Chapter 13's measurements; a part not run is ``None``."""

    model: str = ""
    variants: VariantsResult | None = None
    sweep: SweepResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("workshop (analytic)", text=lambda r: workshop_text(),
         tables=lambda r: {WORKSHOP_TITLE: workshop_table()}),
    Part("variants", run_variants,
         text=lambda r: variants_text(r.variants),
         tables=lambda r: {"Every variant under the same load": variants_table(r.variants)},
         figures=lambda r: {"variants": variants_figure(r.variants, r.model)}),
    Part("sweep", run_sweep,
         text=lambda r: sweep_text(r.sweep),
         tables=lambda r: {f"Concurrency sweep of {r.sweep.variant}": sweep_table(r.sweep)},
         figures=lambda r: sweep_figures(r.sweep, r.model)),
    # where the engines are compared, say that vLLM and SGLang were not measured
    Part("vllm and sglang (analytic)", text=lambda r: gpu_note() if saved() is None else None),
    Part("decision chart (analytic)",
         tables=lambda r: {"The engine decision chart": decision_table(r.variants)},
         figures=lambda r: {"decision_chart": decision_figure()}),
    Part("scale out (analytic)", text=lambda r: scale_out_text(scale_out_plan()),
         tables=lambda r: {"When one GPU is not enough (analytic)": scale_out_table(scale_out_plan())}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> SavedView | None:
    """This page draws no saved vLLM/SGLang GPU run: ``None`` (:func:`gpu_note` says what is saved)."""
    return None
