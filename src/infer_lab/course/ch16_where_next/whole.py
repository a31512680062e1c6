"""Chapter 16 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import human
from ..chapter import ChapterResult, Page, Part
from ..saved import SavedView, load_saved
from ..tables import people_table
from .four_directions import Direction, directions, directions_table, directions_text
from .kernel_gap import SOL_COLUMNS, sol_decode_rows, sol_figure
from .memory_tiers import TiersResult, tiers, tiers_figure, tiers_table, tiers_text
from .scenario import PARTS, Sizes


@dataclass
class Result(ChapterResult):
    """Chapter 16's results; a part not run is ``None``."""

    model: str = ""
    directions: list[Direction] | None = None
    tiers: TiersResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("directions", lambda lm, sizes: directions(sizes),
         text=lambda r: directions_text(r.directions),
         tables=lambda r: {"Where to go next, and where the course showed why": directions_table(r.directions)}),
    Part("tiers", lambda lm, sizes: tiers(sizes.model, sizes.gpu, sizes.contexts),
         text=lambda r: tiers_text(r.tiers),
         tables=lambda r: {f"Recompute or fetch a prefix's KV: {r.tiers.model}, KV in {r.tiers.kv_dtype} (analytic)":
                           tiers_table(r.tiers)},
         figures=lambda r: {"tiers": tiers_figure(r.tiers)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``lm`` is not used: everything is analytic or saved)."""
    return PAGE.measure(Result(size=sizes.size, model=sizes.model), lm, sizes, parts)


def saved() -> SavedView | None:
    """A CUDA-graph decode saved on a GPU against the datasheet roofline: the gap kernels close."""
    rows = sol_decode_rows()
    if not rows:
        return None
    src = load_saved("*sol-decode*.json")[0]
    worst = max(rows, key=lambda r: r.measured_over_predicted)
    return SavedView(
        title=f"A plain CUDA-graph decode on {src.device} against the roofline: {rows[0].model}",
        source=src,
        tables={"Decode step, measured vs the datasheet roofline (context 512)": people_table(rows, SOL_COLUMNS)},
        figures={"sol_vs_roofline": sol_figure(rows)},
        notes=[f"cuBLAS GEMV, masked SDPA, no fusion: up to {human(worst.measured_over_predicted, 3)}× the roofline time "
               f"(batch {worst.batch}). Fused kernels and paged attention are what close it.",
               f"Measured by: {src.command}"],
    )


def summary(result: Result) -> str:
    return PAGE.summary(result, "")  # no header line: the parts' paragraphs only


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order
