"""Chapter 03 as the course's chapter surface: ``equation``, the result, ``measure``, summary, tables, figures, saved."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...analysis import memory
from ..calculator import KVCurves, kv_curves, kv_visualizer_figure
from ..chapter import ChapterResult, Page, Part
from .check import CheckResult, check_table, check_text, run_check
from .fit import FitView, fit_text, fit_view, tradeoff_table
from .kv import kv_growth_figure, kv_summary, kv_summary_text
from .mla import MLATrap, mla_text, mla_trap, variants_table
from .models import ModelMemoryRow, model_rows, models_notes, models_table
from .params import (
    ParamRow,
    WeightFormatRow,
    param_rows,
    params_table,
    weight_format_rows,
    weight_formats_table,
)
from .scenario import PARTS, Sizes


@dataclass(frozen=True)
class EquationResult:
    """The analytic part at the chapter's defaults."""

    report: memory.KVReport
    models: list[ModelMemoryRow]
    params: list[ParamRow]
    weight_formats: list[WeightFormatRow]
    mla: MLATrap
    curves: KVCurves
    fit: FitView
    growth_users: tuple[int, ...]
    growth_max_tokens: int
    gpu: str


@dataclass
class Result(ChapterResult):
    """Chapter 03's results; a part not run is ``None``."""

    model: str = ""
    equation: EquationResult | None = None
    check: CheckResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def equation(sizes: Sizes) -> EquationResult:
    """The analytic part at the chapter's defaults (what the notebook's controls start at)."""
    return EquationResult(
        report=kv_summary(sizes.model, sizes.kv_dtype, sizes.context, sizes.users),
        models=model_rows(sizes.context, sizes.kv_dtype),
        params=param_rows(sizes.model),
        weight_formats=weight_format_rows(sizes.model),
        mla=mla_trap(),
        curves=kv_curves(sizes.model, sizes.kv_dtype, sizes.context, sizes.users, gpu=sizes.gpu),
        fit=fit_view(sizes.model, sizes.gpu, sizes.context, sizes.users, sizes.kv_dtype),
        growth_users=sizes.growth_users,
        growth_max_tokens=sizes.growth_max_tokens,
        gpu=sizes.gpu,
    )


def equation_paragraphs(result: Result) -> list[str]:
    # in the page's order: KV of one model, every model's notes, MLA, the fit
    eq = result.equation
    notes = [models_notes(eq.models)] if eq.models and models_notes(eq.models) else []
    # the MLA list gets its heading (the page's "The MLA trap"), or it would run on from the notes' list
    return [kv_summary_text(eq.report), *notes, f"**The MLA trap, {eq.mla.model}:**", mla_text(eq.mla),
            fit_text(eq.fit)]


def equation_tables(result: Result) -> dict[str, Any]:
    eq = result.equation
    first = eq.models[0]
    return {
        f"Every catalogued model at {first.context:,} tokens (KV in {first.kv_dtype}, weights in "
        f"{first.weight_dtype})": models_table(eq.models),
        f"Parameters of {eq.report.model}": params_table(eq.params),
        f"Weights of {eq.report.model} by storage format": weight_formats_table(eq.weight_formats),
        f"KV per token of the {eq.mla.model} shape under each attention variant": variants_table(eq.mla),
        f"Context against users on one {eq.fit.gpu}": tradeoff_table(eq.fit),
    }


PAGE = Page(
    PARTS,
    Part("equation", lambda lm, sizes: equation(sizes),
         text=equation_paragraphs,
         tables=equation_tables,
         figures=lambda r: {
             "kv_growth": kv_growth_figure(r.equation.report.model, r.equation.report.kv_dtype,
                                           r.equation.growth_users, r.equation.growth_max_tokens, r.equation.gpu),
             "kv_visualizer": kv_visualizer_figure(r.equation.curves),
         }),
    Part("check", run_check,
         text=lambda r: check_text(r.check),
         tables=lambda r: {"Predicted vs measured bytes on this machine": check_table(r.check)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=lm.describe() if lm is not None else ""), lm, sizes, parts)


def summary(result: Result) -> str:
    return PAGE.summary(result, "")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> None:
    """Nothing saved from a GPU: the equation is exact, and the check takes a second on any machine."""
    return None
