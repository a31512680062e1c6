"""Chapter 13 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import count
from ..chapter import NO_MODEL, ChapterResult, run_parts
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


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "variants": lambda: run_variants(lm, sizes),
        "sweep": lambda: run_sweep(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}.", workshop_text()]
    if result.variants:
        lines.append(variants_text(result.variants))
    if result.sweep:
        lines.append(sweep_text(result.sweep))
    lines.append(scale_out_text(scale_out_plan()))
    if saved() is None:  # where the engines are compared, say that vLLM and SGLang were not measured
        lines.append(gpu_note())
    return "\n\n".join(lines)


def tables(result: Result) -> dict[str, Any]:
    out = {WORKSHOP_TITLE: workshop_table()}
    if result.variants:
        out["Every variant under the same load"] = variants_table(result.variants)
    if result.sweep:
        out[f"Concurrency sweep of {result.sweep.variant}"] = sweep_table(result.sweep)
    out["The engine decision chart"] = decision_table(result.variants)
    out["When one GPU is not enough (analytic)"] = scale_out_table(scale_out_plan())
    return out


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.variants:
        out["variants"] = variants_figure(result.variants, result.model)
    if result.sweep:
        out.update(sweep_figures(result.sweep, result.model))
    out["decision_chart"] = decision_figure()
    return out


def saved() -> SavedView | None:
    """This page draws no saved vLLM/SGLang GPU run: ``None`` (:func:`gpu_note` says what is saved)."""
    return None
