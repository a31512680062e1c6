"""Section 1 of chapter 15: serving a cluster, colocated vs disaggregated (the notebook's ``serve_cluster``, ``throughput_ceiling``)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...cluster.report import SLO, ClusterReport, summarize
from ...figures import finish, subplots
from ...timing import Stats
from ..notebook_code import notebook_function
from ..tables import Column
from .scenario import CLUSTER_GPUS, NUMBER, SERVING_SLO, WORKLOADS

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class ModeRow:
    """One way to serve a workload on the same GPUs (ClusterReport, the columns shown)."""

    workload: str
    mode: str
    layout: str
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    itl_ms_max: float | None
    output_tokens_per_s_per_gpu: float
    goodput_rps_per_gpu: float
    slo_attainment: float


def _mode_row(workload: str, label: str, r: ClusterReport) -> ModeRow:
    def at(stats: Stats | None, which: str) -> float | None:
        return getattr(stats, which) if stats is not None else None

    return ModeRow(workload, label, r.layout, at(r.ttft_ms, "p50"), at(r.ttft_ms, "p99"), at(r.itl_ms, "p50"),
                   at(r.itl_ms, "p99"), at(r.itl_ms, "max"), r.output_tokens_per_s_per_gpu, r.goodput_rps_per_gpu,
                   r.slo_attainment)


@dataclass(frozen=True)
class WorkloadRun:
    """One workload: the colocated, chunked and best disaggregated runs, every P:D, ITL quantiles."""

    workload: str
    mean_prompt_tokens: float
    mean_output_tokens: float
    rate_per_s: float
    modes: list[ModeRow]  # colocated, chunked, best P:D
    splits: list[ModeRow]  # every P:D
    best_pd: str
    itl_quantiles_ms: dict[str, list[float]]  # mode -> ITL at quantiles 0..1 (for the CDF)

    def mode(self, name: str) -> ModeRow:
        return next(m for m in self.modes if m.mode == name)


@dataclass(frozen=True)
class ClusterResult:
    model: str
    gpu: str
    n_gpus: int
    slo: SLO
    workloads: list[WorkloadRun]
    saturation_tokens_per_s_per_gpu: dict[str, float]
    colocated_over_best_disaggregated: float

    def workload(self, name: str) -> WorkloadRun:
        return next(w for w in self.workloads if w.workload == name)


QUANTILES = 101


def _itl_quantiles(res: Any) -> list[float]:
    gaps = [g * 1e3 for r in res.requests for g in r.itl_s]
    return [float(v) for v in np.quantile(gaps, np.linspace(0, 1, QUANTILES))] if gaps else []


def cluster_result(sizes: Sizes, n_gpus: int, runs: dict[str, dict[str, Any]], ceiling: dict[str, Any]) -> ClusterResult:
    """What the notebook's ``serve_cluster`` (one run per workload) and ``throughput_ceiling``
    returned, as one result: the three serving modes, every P:D split and the ITL quantiles."""
    out = []
    for wl, run in runs.items():
        trace, plain, chunked, best = run["trace"], run["colocated"], run["chunked"], run["best"]
        span = trace[-1].arrival_s - trace[0].arrival_s
        out.append(WorkloadRun(
            workload=wl,
            mean_prompt_tokens=statistics.mean(t.prompt_tokens for t in trace),
            mean_output_tokens=statistics.mean(t.output_tokens for t in trace),
            rate_per_s=(len(trace) - 1) / span if span > 0 else 0.0,
            modes=[_mode_row(wl, "colocated", summarize(plain, SERVING_SLO)),
                   _mode_row(wl, "colocated, chunked prefill", summarize(chunked, SERVING_SLO)),
                   _mode_row(wl, "disaggregated (best P:D)", best)],
            splits=[_mode_row(wl, "disaggregated", r) for r in run["splits"]],
            best_pd=best.layout,
            itl_quantiles_ms={"colocated": _itl_quantiles(plain), "colocated, chunked prefill": _itl_quantiles(chunked),
                              f"disaggregated {best.layout}": _itl_quantiles(run["best_run"])},
        ))
    return ClusterResult(sizes.cluster_model, sizes.cluster_gpu, n_gpus, SERVING_SLO, out, {
        "colocated": ceiling["colocated"].output_tokens_per_s_per_gpu,
        "colocated, chunked prefill": ceiling["colocated_chunked"].output_tokens_per_s_per_gpu,
        f"disaggregated {ceiling['best_disaggregated'].layout}": ceiling["best_disaggregated"].output_tokens_per_s_per_gpu,
    }, ceiling["colocated_over_best_disaggregated"])


def run_cluster(lm: Any, sizes: Sizes, n_gpus: int = CLUSTER_GPUS) -> ClusterResult:
    """Run the notebook's own experiments (``serve_cluster`` per workload, ``throughput_ceiling``)."""
    serve, ceiling = notebook_function(NUMBER, "serve_cluster"), notebook_function(NUMBER, "throughput_ceiling")
    model, gpu, n = sizes.cluster_model, sizes.cluster_gpu, sizes.cluster_requests
    runs = {wl: serve(model, gpu, n_gpus, wl, n, SERVING_SLO) for wl in WORKLOADS}
    return cluster_result(sizes, n_gpus, runs, ceiling(model, gpu, n_gpus, 2 * n))


def _pd_counts(layout: str) -> tuple[int, int] | None:
    """(prefill GPUs, decode GPUs) of a simulator layout such as '1P:3D TP1' (None if it has none)."""
    m = re.search(r"(\d+)P\s*(?:\S+\s*)?:\s*(\d+)D", layout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def pools_text(best: dict[str, str]) -> str:
    """The talk's P/D story with the simulator's splits: why each pool grows or shrinks with the mix."""
    summ, story = _pd_counts(best.get("summarize", "")), _pd_counts(best.get("story", ""))
    if not summ or not story:
        return ""
    return (
        f"**Why the pools differ.** A summary reads a long document and writes a few lines: its GPU time is prefill, "
        f"and its best split here gives prefill {summ[0]} of {sum(summ)} GPUs. A story starts from a short prompt "
        f"and writes pages: its time is decode, and its best split gives prefill {story[0]} of {sum(story)}. A fleet "
        "serving both sizes each pool to its own work: when summaries arrive faster, it adds prefill GPUs; when "
        "stories do, decode GPUs; and the KV cache of each prompt crosses from one pool to the other once."
        + ("" if summ[0] / sum(summ) > story[0] / sum(story) else
           " (In this run the splits do not differ in the expected direction: read the table before the story.)")
    )


def cluster_text(c: ClusterResult) -> str:
    lines = []
    for w in c.workloads:
        col, chk, dis = w.mode("colocated"), w.mode("colocated, chunked prefill"), w.mode("disaggregated (best P:D)")
        lines.append(
            f"**{w.workload}** ({w.mean_prompt_tokens:,.0f} prompt / {w.mean_output_tokens:,.0f} output tokens on "
            f"average, {w.rate_per_s:.2f} requests/s on {c.n_gpus} x {c.gpu}): best split {w.best_pd}. ITL p99 "
            f"{col.itl_ms_p99:.1f} ms colocated, {chk.itl_ms_p99:.1f} ms with chunked prefill, {dis.itl_ms_p99:.1f} ms "
            f"disaggregated (worst gap {col.itl_ms_max:.0f} vs {dis.itl_ms_max:.0f} ms); TTFT p50 "
            f"{col.ttft_ms_p50:.0f} vs {dis.ttft_ms_p50:.0f} ms; goodput per GPU {col.goodput_rps_per_gpu:.3f} vs "
            f"{dis.goodput_rps_per_gpu:.3f} requests/s (SLO: TTFT {c.slo.ttft_ms:.0f} ms, TPOT {c.slo.tpot_ms:.0f} ms)."
        )
    best = {w.workload: w.best_pd for w in c.workloads}
    lines.append(
        f"Prefill-heavy and decode-heavy work want different splits ({best['summarize']} for summarize, "
        f"{best['story']} for story): that is what separate pools are for."
    )
    lines.append(pools_text(best))
    sat = c.saturation_tokens_per_s_per_gpu
    lines.append(
        "**Throughput ceiling** (chat, far past capacity): "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sat.items())
        + f" output tok/s per GPU: colocated serving's ceiling is {c.colocated_over_best_disaggregated:.2f}x the best "
        "split's. As vLLM's documentation says, disaggregation does not raise throughput; it decouples TTFT from ITL "
        "(each pool sized for its own SLO) and takes prefill out of the decode steps, which removes the ITL spikes."
    )
    return "\n\n".join(lines)


MODE_COLUMNS = [
    Column("workload", "workload", "text"), Column("mode", "serving", "text"), Column("layout", "instances", "text"),
    Column("ttft_ms_p50", "TTFT p50 (ms)"), Column("ttft_ms_p99", "TTFT p99 (ms)"), Column("itl_ms_p50", "ITL p50 (ms)"),
    Column("itl_ms_p99", "ITL p99 (ms)"), Column("itl_ms_max", "ITL max (ms)"),
    Column("output_tokens_per_s_per_gpu", "output tok/s per GPU"), Column("goodput_rps_per_gpu", "goodput / GPU (req/s)"),
    Column("slo_attainment", "within SLO", "pct"),
]


def cluster_figure(c: ClusterResult):
    """ITL CDFs per workload and mode: prefill interference is the tail."""
    fig, axes = subplots(1, len(c.workloads), figsize=(11, 3.8))
    q = np.linspace(0, 1, QUANTILES)
    for ax, w in zip(np.atleast_1d(axes), c.workloads, strict=True):
        for mode, values in w.itl_quantiles_ms.items():
            if values:
                ax.plot(values, q, label=mode)
        ax.set_xscale("log")
        ax.axhline(0.99, color="gray", lw=0.6, ls=":")
        ax.set(xlabel="inter-token latency (ms, log)", ylabel="share of gaps at or below", ylim=(0, 1.01),
               title=f"{w.workload}: {w.mean_prompt_tokens:,.0f} in / {w.mean_output_tokens:,.0f} out")
        ax.legend(fontsize=7)
    fig.suptitle(f"Simulated (roofline costs): {c.model} on {c.n_gpus} x {c.gpu}", fontsize=10)
    finish(fig)
    return fig
