"""Chapter 04 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...analysis.compare import saved_baseline_vs_roofline
from ...units import human
from ..ch02_feel_the_pain import saved_batch1_text, saved_warning
from ..chapter import ChapterResult, Page, Part, chapter_number
from ..saved import SavedView, load_saved
from .compare import (
    CompareResult,
    _comparison_row,
    compare_figure,
    compare_table,
    compare_text,
    ratio_figure,
    run_compare,
)
from .datasheet import DatasheetView, datasheet_figure, datasheet_text, datasheet_view, ops_table
from .scenario import PARTS, Sizes


@dataclass
class Result(ChapterResult):
    """Chapter 04's results; a part not run is ``None``."""

    model: str = ""
    datasheet: DatasheetView | None = None
    compare: CompareResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def datasheet_tables(result: Result) -> dict[str, Any]:
    v = result.datasheet
    return {
        f"Prefill of one {v.context:,}-token prompt, {v.model} on {v.roof.name}": ops_table(v.prefill_ops),
        f"Decode step at batch {v.batch:,}, {v.model} on {v.roof.name}": ops_table(v.decode_ops),
    }


PAGE = Page(
    PARTS,
    Part("datasheet", lambda lm, sizes: datasheet_view(sizes.model, sizes.gpu, sizes.batch, sizes.context),
         text=lambda r: datasheet_text(r.datasheet),
         tables=datasheet_tables,
         figures=lambda r: {"datasheet_roofline": datasheet_figure(r.datasheet)}),
    Part("compare", run_compare,
         text=lambda r: compare_text(r.compare),
         tables=lambda r: {"Predicted vs measured on this machine": compare_table(r.compare.rows)},
         figures=lambda r: {"measured_roofline": compare_figure(r.compare),
                            "ratio": ratio_figure(r.compare.rows, f"{r.compare.model}: measured ÷ predicted")}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=lm.describe() if lm is not None else ""), lm, sizes, parts)


def summary(result: Result) -> str:
    return PAGE.summary(result, "")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> SavedView | None:
    """HF eager on an H200 against the roofline of that same run (and any saved comparison)."""
    found = load_saved("*hf-baseline*.json")
    if not found:
        return None
    src = found[0]
    rows = [_comparison_row(r) for r in saved_baseline_vs_roofline(src.raw)]
    b1 = min((r for r in rows if r.quantity.startswith("decode") and r.batch == 1),
             key=lambda r: abs((r.context or 0) - 512))
    tables = {"HF eager vs the roofline of the same run": compare_table(rows)}
    for other in load_saved("*predicted_vs_measured*.json"):
        tables[f"Predicted vs measured, {other.device}, {other.date}"] = compare_table(
            [_comparison_row(r) for r in other.raw.get("rows", [])])
    return SavedView(
        title=f"HF transformers (eager) vs the roofline on {src.device}: {src.raw.get('model')}",
        source=src,
        tables=tables,
        figures={"ratio": ratio_figure(rows, f"HF eager on {src.device}: measured ÷ predicted (saved)")},
        notes=[
            "The roof is the copy bandwidth and bf16 matmul rate measured in that same run.",
            f"A decode step at batch 1 and {b1.context:,} tokens should take {human(b1.predicted, 3)} ms on that roof; the "
            f"run's batch-1 steps took {saved_batch1_text(src.data, b1.predicted)} (chapter "
            f"{chapter_number('batching')} quotes the same): the eager loop launches hundreds of small kernels per "
            "token and waits on the CPU between them.",
            f"Measured by: {src.command}",
        ],
        warning=saved_warning(src.data),
    )
