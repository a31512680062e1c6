"""Section 3 of chapter 09: the Pareto frontier, total vs per-user speed (the notebook's ``concurrency_sweep``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...figures import finish, subplots
from ...units import count
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER
from .shared import _wrap

if TYPE_CHECKING:
    from ...bench.engine_run import EngineBenchmark
    from .scenario import Sizes


@dataclass(frozen=True)
class SweepPoint:
    """One level of continuous batching (``max_num_seqs`` requests at once): total vs per-user speed
    (tokens/s), times in ms.

    Every request arrives at t = 0, ``max_num_seqs`` × waves of them, so the first ``max_num_seqs`` get a
    slot at once and the others queue for one: their TTFTs are kept apart, because a median over both
    groups is a time no request saw."""

    max_num_seqs: int
    requests: int
    output_tokens_per_s: float
    tokens_per_s_per_user: float  # 1 / mean ITL
    first_ttft_ms_p50: float  # the requests that got a slot at t = 0
    queued_ttft_ms_p50: float | None  # the requests that waited for a slot (None: one wave, nobody waited)
    itl_ms_p50: float
    itl_ms_p99: float


def sweep_points(runs: dict[int, EngineBenchmark], waves: int) -> list[SweepPoint]:
    """The sweep's points from the notebook's ``concurrency_sweep``: one engine benchmark
    (:func:`~infer_lab.bench.engine.run_engine_benchmark`) per ``max_num_seqs``, of ``max_num_seqs`` × ``waves``
    requests."""
    return [SweepPoint(n, n * waves, r.output_tokens_per_s, 1e3 / r.run.itl_ms.mean,
                       _median_ms(r.run.ttft_samples_s[:n]), _median_ms(r.run.ttft_samples_s[n:]),
                       r.run.itl_ms.p50, r.run.itl_ms.p99) for n, r in runs.items()]


def _median_ms(samples_s: Sequence[float]) -> float | None:
    return statistics.median(samples_s) * 1e3 if samples_s else None


def run_sweep(lm: Any, sizes: Sizes) -> list[SweepPoint]:
    """Run the notebook's own experiment (``concurrency_sweep`` of ``infer_lab/notebooks/09_batching.py``)."""
    sweep = notebook_function(NUMBER, "concurrency_sweep")
    runs = sweep(lm, sizes.sweep_max_num_seqs, sizes.sweep_waves, sizes.prompt_len, sizes.sweep_output_len)
    return sweep_points(runs, sizes.sweep_waves)


def dominated_points(sweep: Sequence[SweepPoint]) -> list[tuple[SweepPoint, SweepPoint]]:
    """(point, a point that beats it) for every point another one beats on both axes: at least as many
    tokens/s per user *and* in total, more on one. Such a point is off the Pareto frontier."""
    def beats(a: SweepPoint, b: SweepPoint) -> bool:
        return (a.tokens_per_s_per_user >= b.tokens_per_s_per_user and a.output_tokens_per_s >= b.output_tokens_per_s
                and (a.tokens_per_s_per_user, a.output_tokens_per_s) != (b.tokens_per_s_per_user, b.output_tokens_per_s))
    return [(p, next(q for q in sweep if beats(q, p))) for p in sweep if any(beats(q, p) for q in sweep)]


def _every_step(values: Sequence[float], rising: bool) -> bool:
    return all((b > a) if rising else (b < a) for a, b in zip(values, values[1:], strict=False))


def sweep_text(sweep: list[SweepPoint]) -> str:
    """What the sweep shows: the ends, whether each step traded per-user speed for total throughput,
    and which points are off the frontier (every number and word from ``sweep``)."""
    lo, hi = sweep[0], sweep[-1]
    text = (f"From {lo.max_num_seqs} to {hi.max_num_seqs} requests at once, total throughput went from "
            f"{lo.output_tokens_per_s:.1f} to **{hi.output_tokens_per_s:.1f} tokens/s** "
            f"({hi.output_tokens_per_s / lo.output_tokens_per_s:.1f}×), while each user's speed went from "
            f"{lo.tokens_per_s_per_user:.1f} to {hi.tokens_per_s_per_user:.1f} tokens/s.")
    if len(sweep) < 3:
        return text + (f" With {count(len(sweep), 'point')} this is a segment, not yet a curve: add "
                       "levels to `sweep_max_num_seqs` to see the frontier's shape.")
    totals = [p.output_tokens_per_s for p in sweep]
    per_user = [p.tokens_per_s_per_user for p in sweep]
    if _every_step(totals, rising=True) and _every_step(per_user, rising=False):
        trade = (f"At each of the {len(sweep) - 1} steps up in max_num_seqs, total throughput rose and each "
                 "user's speed fell: every point is a different trade, on one frontier.")
    else:
        trade = ("Not every step up in max_num_seqs traded per-user speed for total throughput on this run "
                 "(one run per point: a busy machine bends the curve).")
    off = dominated_points(sweep)
    if off:
        trade += " Off the frontier: " + "; ".join(
            f"{p.max_num_seqs} requests at once ({q.max_num_seqs} at once was at least as fast for each user and in total)"
            for p, q in off) + "."
    return f"{text} {trade}"


SWEEP_COLUMNS = [
    Column("max_num_seqs", "requests at once (max_num_seqs)", "int"), Column("requests", "requests", "int"),
    Column("tokens_per_s_per_user", "tokens/s per user"), Column("output_tokens_per_s", "tokens/s total"),
    Column("first_ttft_ms_p50", "TTFT p50, slot at t = 0 (ms)"),
    Column("queued_ttft_ms_p50", "TTFT p50, queued for a slot (ms)"),
    Column("itl_ms_p50", "ITL p50 (ms)"), Column("itl_ms_p99", "ITL p99 (ms)"),
]


def sweep_table(sweep: list[SweepPoint]):
    return people_table(sweep, SWEEP_COLUMNS)


def _log_if_wide(ax: Any, axis: str, values: list[float]) -> None:
    """Log scale on ``axis`` when the values span more than a decade and a half."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 30:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    else:
        (ax.set_xlim if axis == "x" else ax.set_ylim)(0, max(values) * 1.15)


def sweep_figure(sweep: list[SweepPoint], source: str):
    """Total output tokens/s vs tokens/s per user, one point per ``max_num_seqs`` (the serving frontier)."""
    fig, ax = subplots(figsize=(6.5, 4))
    xs, ys = [p.tokens_per_s_per_user for p in sweep], [p.output_tokens_per_s for p in sweep]
    ax.plot(xs, ys, "o-")
    for p in sweep:
        ax.annotate(f" {p.max_num_seqs}", (p.tokens_per_s_per_user, p.output_tokens_per_s), fontsize=9)
    _log_if_wide(ax, "x", xs)
    _log_if_wide(ax, "y", ys)
    ax.set(xlabel="tokens/s per user (1 / mean ITL)", ylabel="total output tokens/s")
    ax.grid(alpha=0.3)
    ax.set_title(f"max_num_seqs sweep (labels: requests decoding at once)\n{_wrap(source, 70)}", fontsize=10)
    finish(fig)
    return fig
