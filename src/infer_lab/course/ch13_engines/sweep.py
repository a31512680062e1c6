"""Part "sweep" of the page: one variant of our engine against load, latency and the Pareto frontier."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...loadgen import report
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, OUR_VARIANTS, WORKLOAD, Sizes
from .shared import _LATENCY, ServedLoad, servable_model


@dataclass(frozen=True)
class SweepResult:
    variant: str
    workload: str
    model: str  # the served model's id
    server_version: str
    slo_ttft_ms: float
    points: list[ServedLoad]
    note: str = ""  # why another model was served than the one loaded (see servable_model)


def sweep_result(results: dict[str, Any], variant: str, model: str, sizes: Sizes, note: str = "") -> SweepResult:
    """What ``concurrency_sweep`` returned (loadgen's results dict), one point per concurrency."""
    points = sorted((ServedLoad.from_row(r) for r in results["pooled"]), key=lambda p: p.load)
    return SweepResult(variant, WORKLOAD, model, str(results["server"].get("version", "unknown")),
                       sizes.slo_ttft_ms, points, note)


def run_sweep(lm: Any, sizes: Sizes) -> SweepResult:
    """Run the notebook's ``concurrency_sweep`` on the chapter's sweep variant (the embedded model
    instead when ``lm`` has no tokenizer: :func:`servable_model`)."""
    served, note = servable_model(lm)
    sweep = notebook_function(NUMBER, "concurrency_sweep")
    results = sweep(served, OUR_VARIANTS[sizes.sweep_variant], sizes.sweep_concurrencies, sizes.requests,
                    sizes.output_tokens, sizes.workload_options(), sizes.slo_ttft_ms, sizes.repeats)
    return sweep_result(results, sizes.sweep_variant, served.name, sizes, note)


def sweep_text(s: SweepResult) -> str:
    note = s.note + "\n\n" if s.note else ""
    return note + _sweep_words(s)


def _sweep_words(s: SweepResult) -> str:
    a, b = s.points[0], s.points[-1]
    if not (a.output_tokens_per_s and b.output_tokens_per_s and a.tokens_per_s_per_user and b.tokens_per_s_per_user):
        return f"{s.variant}: some load levels completed no request, see the table."
    return (f"**{s.variant}** from concurrency {a.concurrency} to {b.concurrency}: total output tokens/s went "
            f"from {a.output_tokens_per_s:,.1f} to {b.output_tokens_per_s:,.1f} "
            f"({b.output_tokens_per_s / a.output_tokens_per_s:.1f}×), while each user's tokens/s went from "
            f"{a.tokens_per_s_per_user:,.1f} to {b.tokens_per_s_per_user:,.1f}.")


SWEEP_COLUMNS = [
    Column("concurrency", "concurrency", "int"), Column("completed", "completed", "int"),
    Column("failed", "failed", "int"), Column("output_tokens_per_s", "output tokens/s"),
    Column("tokens_per_s_per_user", "tokens/s per user"),
    Column("goodput_per_s", "goodput (requests/s within the SLO)"), *_LATENCY,
]


def sweep_table(s: SweepResult):
    return people_table(s.points, SWEEP_COLUMNS)


def as_loadgen_results(s: SweepResult, source: str) -> dict[str, Any]:
    """The sweep as a loadgen results dict, for :mod:`infer_lab.loadgen.report`'s plots."""
    return {"pooled": [dataclasses.asdict(p) for p in s.points],
            "config": {"workload": s.workload, "client": {"model": s.model}},
            "server": {"engine": f"ours, {s.variant}", "device": source}}


def sweep_figures(s: SweepResult, source: str) -> dict[str, Any]:
    """Latency percentiles, throughput and the Pareto frontier against concurrency (loadgen's plots)."""
    results = as_loadgen_results(s, source)
    figs = {"sweep_latency": report.plot_latency_vs_load(results),
            "sweep_throughput": report.plot_throughput_vs_load(results),
            "sweep_pareto": report.plot_pareto(results)}
    for fig in figs.values():  # latencies and rates start at zero, so their ratios read true
        for ax in fig.axes:
            ax.set_ylim(bottom=0)
    figs["sweep_pareto"].axes[0].set_xlim(left=0)
    return figs
