"""Section 4 of chapter 09: the roofline's decode step next to the engine's (the notebook's ``predicted_vs_measured``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...figures import finish, subplots
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER
from .shared import _plain_log_ticks, _wrap

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class PredictedPoint:
    """The roofline's decode step and the engine's measured one (median of pure decode steps), ms."""

    batch: int
    context: int
    predicted_ms: float
    measured_ms: float
    predicted_bound: str
    flops: float
    bytes: float
    steps_timed: int

    @property
    def measured_over_predicted(self) -> float:
        return self.measured_ms / self.predicted_ms


@dataclass(frozen=True)
class PredictedResult:
    points: list[PredictedPoint]
    roof: str  # the ceilings the prediction used
    dtype: str


def predicted_result(rows: list[dict[str, Any]]) -> PredictedResult:
    """The points of the notebook's ``predicted_vs_measured``: rows of
    :func:`~infer_lab.bench.predicted.decode_step_predicted_vs_measured`, one per batch."""
    points = [PredictedPoint(r["batch"], r["context"], r["predicted_ms"], r["measured_ms"], r["predicted_bound"],
                             r["flops"], r["bytes"], r["steps_timed"]) for r in rows]
    return PredictedResult(points, rows[0]["roof"], rows[0]["dtype"])


def run_predicted(lm: Any, sizes: Sizes) -> PredictedResult:
    """Run the notebook's own experiment (``predicted_vs_measured`` of ``infer_lab/notebooks/09_batching.py``)."""
    experiment = notebook_function(NUMBER, "predicted_vs_measured")
    return predicted_result(experiment(lm, sizes.predicted_batches, sizes.prompt_len, sizes.predicted_steps,
                                       quick=sizes.size == "quick"))


def predicted_text(predicted: PredictedResult) -> str:
    first, last = predicted.points[0], predicted.points[-1]
    return (f"On {predicted.roof} ({predicted.dtype}), the engine's decode step took "
            f"{first.measured_over_predicted:.1f}× the roofline's prediction at batch {first.batch} "
            f"({first.measured_ms:.1f} ms vs {first.predicted_ms:.2f} ms) and {last.measured_over_predicted:.1f}× "
            f"at batch {last.batch} ({last.measured_ms:.1f} ms vs {last.predicted_ms:.2f} ms). The gap is the "
            "engine's software: Python and per-op overhead, GEMV efficiency, the gather of paged K/V.")


PREDICTED_COLUMNS = [
    Column("batch", "batch", "int"), Column("context", "context (tokens)", "int"),
    Column("predicted_ms", "predicted (ms)"), Column("measured_ms", "measured (ms)"),
    Column("measured_over_predicted", "measured / predicted", "ratio"),
    Column("predicted_bound", "predicted bound", "text"), Column("steps_timed", "steps timed", "int"),
]


def predicted_table(predicted: PredictedResult):
    return people_table(predicted.points, PREDICTED_COLUMNS)


def predicted_figure(predicted: PredictedResult, source: str):
    """Predicted (roofline) and measured engine decode step time vs batch size, log-log."""
    fig, ax = subplots(figsize=(6.5, 4))
    batches = [p.batch for p in predicted.points]
    ax.plot(batches, [p.predicted_ms for p in predicted.points], "*-",
            label=f"predicted (roofline on {predicted.roof})")
    ax.plot(batches, [p.measured_ms for p in predicted.points], "x-", label="measured (engine, p50 of decode steps)")
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences per decode step)", ylabel="decode step time (ms)")
    _plain_log_ticks(ax, batches)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"Decode step: predicted vs measured\n{_wrap(source, 70)}", fontsize=10)
    finish(fig)
    return fig
