"""Parts 2 and 3 of chapter 08's page drawn: the stacked bars of what the KV bytes hold, per layout."""

from __future__ import annotations

import textwrap

from ...analysis.kv_waste import LayoutWaste
from ...bench.kv_allocators import AllocatorWaste
from ...figures import subplots
from ...units import GB
from .fit import FitResult, FitRow
from .waste import WasteResult


def segments(row: LayoutWaste | AllocatorWaste | FitRow) -> list[tuple[str, str, float]]:
    """(legend, colour, bytes) of each bar segment of one row, in stacking order."""
    if isinstance(row, LayoutWaste):
        return [("holds a token's K/V", "tab:blue", row.used_bytes),
                ("reserved for future tokens", "tab:cyan", row.reserved_future_bytes),
                ("internal fragmentation", "tab:orange", row.internal_frag_bytes),
                ("external fragmentation", "tab:red", row.external_frag_bytes)]
    empty = [("holds a token's K/V", "tab:blue", row.used_bytes), ("reserved, empty", "tab:orange", row.wasted_bytes)]
    if isinstance(row, FitRow):
        return [*empty, ("free, too small for the next request", "lightgrey", row.capacity_bytes - row.reserved_bytes)]
    return empty


def kv_waste_figure(rows: list[LayoutWaste] | list[AllocatorWaste] | list[FitRow], source: str):
    """One stacked horizontal bar per layout: what the KV bytes (GB = 1e9 B) are used for.

    Takes :func:`~infer_lab.analysis.kv_waste.kv_waste_breakdown` rows (used / reserved for
    future tokens / internal / external fragmentation, time-averaged over the run),
    :func:`~infer_lab.bench.kv_allocators.kv_memory_waste` rows (used / reserved-but-empty at the
    end of each request's life) or :class:`FitRow` (the same, plus the budget left free). Each
    segment wide enough is labelled with its share of the bar, and each bar with its wasted fraction.
    """
    timeline = bool(rows) and isinstance(rows[0], LayoutWaste)
    filled = bool(rows) and isinstance(rows[0], FitRow)
    labels = [r.label + (f"\n{r.steps:,} steps, {r.peak_running} at once (peak)" if timeline else
                         f"\n{r.requests_that_fit} requests fit" if filled else "") for r in rows]
    totals = [sum(seg[2] for seg in segments(r)) / GB for r in rows]
    fig, ax = subplots(figsize=(8.5, 1.6 + 0.8 * len(rows)))
    left = [0.0] * len(rows)
    for k, (legend, colour, _) in enumerate(segments(rows[0])):  # one segment of every bar at a time
        widths = [segments(r)[k][2] / GB for r in rows]
        ax.barh(range(len(rows)), widths, left=left, color=colour, label=legend)
        for i, width in enumerate(widths):
            if totals[i] and width > 0.05 * max(totals):  # label only segments wide enough to hold it
                ax.text(left[i] + width / 2, i, f"{width / totals[i]:.0%}", ha="center", va="center", fontsize=8)
            left[i] += width
    for i, r in enumerate(rows):
        ax.text(totals[i], i, f" {r.wasted_fraction:.1%} wasted", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()  # first layout on top
    what = ("mean over the run" if timeline else "the whole budget, each request at the end of its life" if filled
            else "at the end of each request's life")
    ax.set(xlabel=f"KV bytes reserved or blocked, {what} (GB)", xlim=(0, max(totals) * 1.35))
    if filled:  # the bars fill the budget: the legend goes below them
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncols=3, fontsize=8, frameon=False)
    else:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title("KV memory: what the reserved bytes hold, per layout\n" + textwrap.fill(source, 90, break_on_hyphens=False), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def waste_figure(waste: WasteResult):
    return kv_waste_figure(waste.layouts, f"simulated, analytic: {waste.settings.describe()}")


def fit_figure(fit: FitResult):
    return kv_waste_figure(fit.rows, f"the engine's allocators, no model run: {fit.settings.describe()}")
