"""Check it on this machine: the equation's bytes against a loaded model's tensors (the notebook's experiment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis.compare import dtype_name
from ...units import human
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes


@dataclass(frozen=True)
class BytesCheck:
    what: str
    predicted: int
    measured: int

    @property
    def measured_over_predicted(self) -> float:
        return self.measured / self.predicted


@dataclass(frozen=True)
class CheckResult:
    """The memory equation against the tensors of a loaded model."""

    model: str
    dtype: str
    batch: int
    cached_tokens: int
    rows: list[BytesCheck]


def check_result(lm: Any, rows: list[tuple[str, int, int]], batch: int, cached_tokens: int) -> CheckResult:
    """What the notebook's ``bytes_predicted_vs_counted`` returns ([(what, predicted, counted)]) as a
    :class:`CheckResult`."""
    return CheckResult(lm.describe(), dtype_name(lm), batch, cached_tokens, [BytesCheck(*r) for r in rows])


def run_check(lm: Any, sizes: Sizes) -> CheckResult:
    """Run the notebook's own experiment (``bytes_predicted_vs_counted`` of ``infer_lab/notebooks/03_memory_equation.py``)."""
    experiment = notebook_function(NUMBER, "bytes_predicted_vs_counted")
    rows, cached = experiment(lm, sizes.check_batch, sizes.check_prompt_len, sizes.check_new_tokens)
    return check_result(lm, rows, sizes.check_batch, cached)


def check_text(check: CheckResult) -> str:
    worst = max(abs(r.measured_over_predicted - 1) for r in check.rows)
    verdict = "the equation is exact" if worst == 0 else f"they differ by at most {human(100 * worst, 3)}%"
    return (f"Measured on **{check.model}**: predicted and measured bytes agree: {verdict}. "
            f"The KV counts {check.batch} sequences × {check.cached_tokens} cached tokens (the last generated "
            "token is never fed back, so it has no KV yet).")


CHECK_COLUMNS = [
    Column("what", "what", "text"), Column("predicted", "predicted (B)", "int"), Column("measured", "measured (B)", "int"),
    Column("measured_over_predicted", "measured ÷ predicted", "ratio", digits=4),
]


def check_table(check: CheckResult):
    return people_table(check.rows, CHECK_COLUMNS)
