"""Part 3 of chapter 08's page: how many requests the engine's own allocators fit in one budget."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis.memory import kv_bytes_per_token
from ...bench.kv_allocators import caches_in_budget
from ...engine.block_manager import BlockManager, paged_blocks_needed
from ...engine.kv_store import paged_slots
from ...units import GiB
from ..chapter import chapter_number
from ..library_code import source_without_docstring
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import (
    LENGTH_DIVISOR,
    NUMBER,
    PAPER,
    PAPER_THROUGHPUT,
    RATIO_EXPLAINED,
    TALK_REQUESTS,
    WasteSettings,
)


def share_words(divisor: int) -> str:
    """``1 / divisor`` in words: "half", "a third", "a quarter", else "1/n"."""
    return {2: "half", 3: "a third", 4: "a quarter"}.get(divisor, f"1/{divisor}")


@dataclass(frozen=True)
class FitRow:
    """One of the engine's allocators filled from the workload, in order, until the next request did not fit.

    The bytes are the allocator's own :class:`~infer_lab.engine.KVMemoryReport` for the requests it
    holds, each at the end of its life (``prompt + output`` tokens).
    """

    layout: str  # "contiguous" or "paged"
    requests_that_fit: int
    capacity_bytes: int
    reserved_bytes: int
    used_bytes: int
    block_size: int | None
    max_model_len: int

    @property
    def wasted_bytes(self) -> int:
        return self.reserved_bytes - self.used_bytes

    @property
    def wasted_fraction(self) -> float:
        """Share of the reserved bytes that hold no token."""
        return self.wasted_bytes / self.reserved_bytes if self.reserved_bytes else 0.0

    @property
    def label(self) -> str:
        return self.layout + (f" (block {self.block_size})" if self.block_size else f" ({self.max_model_len:,} slots)")


@dataclass(frozen=True)
class FitResult:
    settings: WasteSettings
    block_size: int
    rows: list[FitRow]

    def fits(self, layout: str) -> int:
        return self.row(layout).requests_that_fit

    def row(self, layout: str) -> FitRow:
        return next(r for r in self.rows if r.layout == layout)


FIT_BLOCK_SIZE = 16  # tokens per block (vLLM's default); the notebook's part-3 cell reads it


def fit_result(settings: WasteSettings, block_size: int, held: dict[str, tuple[int, Any]]) -> FitResult:
    """Each allocator's (requests that fit, memory report) as rows."""
    rows = [FitRow(name, n, report.capacity_bytes, report.reserved_bytes, report.used_bytes,
                   block_size if name == "paged" else None, settings.max_model_len)
            for name, (n, report) in held.items()]
    return FitResult(settings, block_size, rows)


def run_fit(settings: WasteSettings, block_size: int = FIT_BLOCK_SIZE) -> FitResult:
    """Run the notebook's own experiment (``fill_until_full``) on both of the engine's allocators."""
    fill_until_full = notebook_function(NUMBER, "fill_until_full")
    prompts, outputs = settings.lengths()
    caches = caches_in_budget(settings.shape, settings.budget_bytes, settings.max_model_len, block_size,
                              settings.kv_dtype)
    return fit_result(settings, block_size, {name: fill_until_full(c, prompts, outputs) for name, c in caches.items()})


def paging_code() -> str:
    """The engine's real paging code, docstrings left out, as a markdown code block: the slot
    lookup through a block table (``paged_slots``), the count of new blocks a request needs, and
    the block manager growing a request's table from its free list."""
    code = ["# kv_store.paged_slots: position -> slot through the block table", source_without_docstring(paged_slots),
            "", "# block_manager.paged_blocks_needed: new blocks for num_new_tokens more tokens",
            source_without_docstring(paged_blocks_needed), "", "# BlockManager.grow: free blocks join a table",
            source_without_docstring(BlockManager.grow)]
    return "```python\n" + "\n".join(code).rstrip() + "\n```"


def mean_request_tokens(row: FitRow, settings: WasteSettings) -> float:
    """Mean tokens per request the allocator holds (each at the end of its life), from its used bytes."""
    per_token = kv_bytes_per_token(settings.shape, settings.kv_dtype)
    return row.used_bytes / per_token / row.requests_that_fit if row.requests_that_fit else 0.0


def ratio_cause_text(fit: FitResult) -> str:
    """What sets the paged/contiguous request ratio: ``max_model_len`` over the mean request, when both are full.

    A contiguous region is ``max_model_len`` slots whatever the request holds; a paged request takes
    about its own length. So with both caches full the ratio is close to ``max_model_len`` ÷ the mean
    request length: a property of the setting and the workload. Then the cited figures, for scale.
    """
    contiguous, paged = fit.row("contiguous"), fit.row("paged")
    s = fit.settings
    mean = mean_request_tokens(paged, s)
    cited = (f"For scale, cited rather than measured: the system talk (talk 2) says paging lets you serve "
             f"\"three times more requests\" ({TALK_REQUESTS}×), and {PAPER} reports {PAPER_THROUGHPUT[0]}–"
             f"{PAPER_THROUGHPUT[1]}× the throughput of FasterTransformer and Orca at the same latency.")
    if not contiguous.requests_that_fit or not mean:
        return cited
    expected = s.max_model_len / mean
    ratio = paged.requests_that_fit / contiguous.requests_that_fit
    if paged.requests_that_fit == s.requests:
        verdict = (f"but here every request fit in the paged cache, so the {ratio:.1f}× is capped by the workload and "
                   "a larger workload would show more")
    elif abs(ratio / expected - 1) <= RATIO_EXPLAINED:
        verdict = f"close to the {ratio:.1f}× measured"
    else:
        verdict = (f"unlike the {ratio:.1f}× measured, so something else limits one of the caches here (a block "
                   "size that wastes much of each request's last block, or a budget of only a few regions)")
    return (f"**What sets that ratio.** A contiguous region is max_model_len = {s.max_model_len:,} slots whatever "
            f"the request holds; a request of this workload ends at {mean:,.0f} tokens on average, and a paged "
            f"request takes about that. So with both caches full the ratio is about max_model_len ÷ the mean "
            f"request = {expected:.1f}×, {verdict}. The ratio is a property of the setting and the workload (this "
            f"one draws its lengths up to {share_words(LENGTH_DIVISOR)} of max_model_len, so the two move together), "
            "not a constant of paging. " + cited)


def fit_text(fit: FitResult) -> str:
    contiguous, paged = fit.row("contiguous"), fit.row("paged")
    s = fit.settings
    return (
        f"In one {s.budget_bytes / GiB:g} GiB budget, the engine's contiguous cache holds "
        f"**{contiguous.requests_that_fit}** of the {s.requests} requests at once (one {s.max_model_len:,}-slot "
        f"region each; {contiguous.wasted_fraction:.0%} of what they reserve holds no token), the paged cache "
        f"with blocks of {paged.block_size} holds **{paged.requests_that_fit}** ({paged.wasted_fraction:.1%} "
        f"of its reserved blocks empty): "
        + (f"{paged.requests_that_fit / contiguous.requests_that_fit:.1f}× the requests. "
           if contiguous.requests_that_fit else "the contiguous cache holds none. ")
        + ("Every request of the workload fit, so the paged count is capped by the workload, not the budget. "
           if paged.requests_that_fit == s.requests else "")
        + f"More requests at once is a larger decode batch: the throughput that chapter {chapter_number('batching')} "
        "measures.\n\n"
        + ratio_cause_text(fit)
    )


FIT_COLUMNS = [
    Column("label", "allocator", "text"), Column("requests_that_fit", "requests that fit at once", "int"),
    Column("capacity_bytes", "KV budget", "bytes"), Column("reserved_bytes", "reserved", "bytes"),
    Column("used_bytes", "holds K/V", "bytes"), Column("wasted_fraction", "reserved, empty", "pct"),
]


def fit_table(fit: FitResult):
    return people_table(fit.rows, FIT_COLUMNS)
