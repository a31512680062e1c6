"""Part 2 of chapter 08's page: where KV memory goes under three layouts (simulated, no model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis.fragmentation import LAYOUTS
from ...analysis.kv_waste import LayoutWaste, budget_problem, layout_waste
from ...analysis.memory import kv_bytes_per_token
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, PAPER, PAPER_WASTE_BEFORE, PAPER_WASTE_PAGED, WasteSettings


@dataclass(frozen=True)
class WasteResult:
    settings: WasteSettings
    layouts: list[LayoutWaste]

    def layout(self, name: str) -> LayoutWaste:
        return next(r for r in self.layouts if r.layout == name)


def budget_slots(settings: WasteSettings) -> int:
    """Token slots of the KV budget: ``budget_bytes // (the shape's K/V bytes per token)``."""
    return settings.budget_bytes // kv_bytes_per_token(settings.shape, settings.kv_dtype)


def waste_problem(settings: WasteSettings) -> str | None:
    """Why ``settings`` cannot be simulated (one request needs more than the whole budget), or None."""
    prompts, outputs = settings.lengths()
    return budget_problem(settings.shape, prompts, outputs, settings.max_model_len, settings.budget_bytes,
                          settings.max_tokens, settings.block_size, settings.kv_dtype)


def waste_result(settings: WasteSettings, timelines: dict[str, Any]) -> WasteResult:
    """The simulation's timelines (slot counts per step, one per layout) as bytes and shares."""
    per_token = kv_bytes_per_token(settings.shape, settings.kv_dtype)
    return WasteResult(settings, [
        layout_waste(name, timeline, settings.requests, per_token, settings.max_model_len, settings.max_tokens,
                     settings.block_size) for name, timeline in timelines.items()])


def run_waste(settings: WasteSettings) -> WasteResult:
    """Run the notebook's own simulation (``where_memory_goes``) on the workload of ``settings``."""
    where_memory_goes = notebook_function(NUMBER, "where_memory_goes")
    prompts, outputs = settings.lengths()
    timelines = where_memory_goes(prompts, outputs, settings.max_model_len, settings.max_tokens,
                                  budget_slots(settings), settings.block_size)
    return waste_result(settings, timelines)


def waste_text(waste: WasteResult) -> str:
    cmax, exact, paged = (waste.layout(n) for n in LAYOUTS)
    low, high = PAPER_WASTE_BEFORE
    return (
        f"Time-averaged, **{cmax.wasted_fraction:.0%}** of the KV memory in play is wasted with max-length "
        f"reservations, **{exact.wasted_fraction:.0%}** with exact reservations and "
        f"**{paged.wasted_fraction:.1%}** with blocks of {paged.block_size} ({PAPER} reports "
        f"{low:.0%}–{high:.0%} for earlier systems and under {PAPER_WASTE_PAGED:.0%} for vLLM). Paging finished "
        f"the workload in **{paged.steps:,}** steps against {cmax.steps:,} for max-length reservation, because "
        f"{paged.mean_running:.1f} requests ran at once on average instead of {cmax.mean_running:.1f}: the decode "
        "batch can only be as large as the KV cache allows, and that is what buys throughput."
        + (f" Memory ran short {paged.preemptions} times in the paged run: the newest request was preempted and "
           "recomputed later." if paged.preemptions else "")
    )


WASTE_COLUMNS = [
    Column("label", "layout", "text"), Column("used_fraction", "used", "pct"),
    Column("reserved_future_fraction", "reserved for future tokens", "pct"),
    Column("internal_frag_fraction", "internal fragmentation", "pct"),
    Column("external_frag_fraction", "external fragmentation", "pct"),
    Column("wasted_fraction", "wasted (1 − used)", "pct"),
    Column("eol_wasted_fraction", "wasted at end of life", "pct"),
    Column("mean_running", "running at once (mean)"), Column("peak_running", "running at once (peak)", "int"),
    Column("steps", "steps to finish", "int"), Column("preemptions", "preemptions", "int"),
]


def waste_table(waste: WasteResult):
    return people_table(waste.layouts, WASTE_COLUMNS)
