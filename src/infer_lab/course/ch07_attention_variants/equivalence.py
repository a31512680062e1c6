"""Part 1 of chapter 07: every variant against SDPA, and the online-softmax tile the flash path runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...attention import online_softmax_tile
from ...units import human
from ..library_code import code_block
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes

EQUIVALENCE_TOL = 1e-5  # fp32, max |difference| from SDPA


@dataclass(frozen=True)
class EquivalenceRow:
    """Max |output - SDPA output| of one variant and path, prefill and token-by-token cached decode."""

    variant: str
    path: str
    prefill_max_abs_diff: float
    decode_max_abs_diff: float

    @property
    def equal(self) -> bool:
        return max(self.prefill_max_abs_diff, self.decode_max_abs_diff) <= EQUIVALENCE_TOL


EQUIVALENCE_TOKENS = 12  # the notebook's equivalence cell reads these three
EQUIVALENCE_KV_HEADS = (2, 1)  # 4 query heads over 2 K/V heads (GQA), then over 1 (MQA)
EQUIVALENCE_WINDOW = 4


def equivalence_rows(rows: list[tuple[str, str, float, float]]) -> list[EquivalenceRow]:
    """The notebook's ``against_sdpa`` rows ``(variant, path, prefill diff, decode diff)`` as typed rows."""
    return [EquivalenceRow(*row) for row in rows]


def run_equivalence(lm: Any = None, sizes: Sizes | None = None) -> list[EquivalenceRow]:
    """Run the notebook's own ``against_sdpa`` at the cell's numbers (no model: a small random layer)."""
    against_sdpa = notebook_function(NUMBER, "against_sdpa")
    return equivalence_rows(against_sdpa(EQUIVALENCE_TOKENS, EQUIVALENCE_KV_HEADS, window=EQUIVALENCE_WINDOW))


def flash_tile_code() -> str:
    """FlashAttention's inner step, the library's real code, as the page shows it."""
    return code_block(online_softmax_tile)


def equivalence_text(rows: list[EquivalenceRow]) -> str:
    worst = max(max(r.prefill_max_abs_diff, r.decode_max_abs_diff) for r in rows)
    equal = sum(r.equal for r in rows)
    return (f"**{equal} of {len(rows)}** variant/path pairs equal SDPA within {human(EQUIVALENCE_TOL)} (fp32) in prefill "
            f"and in cached decode; the largest difference is {human(worst, 2)}.")


EQUIVALENCE_COLUMNS = [
    Column("variant", "variant", "text"), Column("path", "path", "text"),
    Column("prefill_max_abs_diff", "prefill max |Δ| vs SDPA"), Column("decode_max_abs_diff", "cached decode max |Δ|"),
    Column("equal", f"within {human(EQUIVALENCE_TOL)}", "bool"),
]


def equivalence_table(rows: list[EquivalenceRow]):
    return people_table(rows, EQUIVALENCE_COLUMNS)
