"""Chapter 15, "The cluster": serving one model on many GPUs, simulated, and the simulator checked.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/15_cluster.py`` that call :mod:`infer_lab.cluster`, :mod:`infer_lab.analysis` and
:mod:`infer_lab.launchers` directly, called from the page's visible cells. This module sizes them,
draws and describes what they return, and runs the very same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

1. **Serving a cluster** (``serve_cluster``, ``throughput_ceiling``; the simulator): colocated vs
   prefill/decode disaggregated, for a prefill-heavy (summarize) and a decode-heavy (story)
   workload: TTFT/ITL percentiles, goodput per GPU, the best P:D, the tail ITL, and the throughput
   ceiling.
2. **Heterogeneous hardware** (``heterogeneous``: prefill on compute, decode on bandwidth), the
   cited wafer-scale data point, and the attention/FFN split of a large MoE (``attention_ffn_split``,
   analytic).
3. **The planner's answer** (``plan_cluster``) and the exact vLLM / SGLang launch commands for it.
4. **The simulator checked** (``simulator_vs_engine``) against our engine's measured
   continuous-batching run: the same steps, and totals within stated tolerances.

Chapter 14 split one model over two processes; this chapter is what a fleet does with many GPUs.
Our engine stays on one device: the launch commands of part 3 are how to serve across GPUs for real.
"""

from __future__ import annotations

import re
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.plausibility import R2_FLOOR
from ..cluster.attention_ffn import AFDPoint
from ..cluster.engine_check import TOLERANCES, SimVsEngine
from ..cluster.hetero import PhaseFitness
from ..cluster.report import SLO, ClusterReport, summarize
from ..figures import finish
from ..units import fmt_bytes, human
from .ch14_tensor_parallel import LAYOUT_COLUMNS, TP_QUESTIONS, LayoutRow
from .chapter import NO_MODEL, ChapterResult, choose_size, run_parts
from .notebook_code import notebook_function
from .tables import Column, people_table

NUMBER = "15"
SLUG = "cluster"
TITLE = "15 · The cluster: disaggregation, heterogeneous GPUs, the planner, the simulator checked"
NEEDS_MODEL = True
PARTS = {
    "cluster": "Simulate colocated vs disaggregated serving",
    "hetero": "Heterogeneous hardware and the attention/FFN split",
    "plan": "The planner's answer and its launch command",
    "check": "Check the simulator against our engine",
}
# Parts that need no model and measure nothing here (computed or simulated): the saved-only deck keeps them.
ANALYTIC_PARTS = ("cluster", "hetero", "plan")
WORKLOADS = ("summarize", "story")  # prefill-heavy, decode-heavy
SERVING_SLO = SLO(2000.0, 50.0)  # TTFT 2 s, TPOT 50 ms
CLUSTER_GPUS = 4  # the notebook's experiment cell (``n_gpus = 4``)
CHECK_SLOTS = 3  # the notebook's experiment cell (``slots = 3``)
HETERO_GPUS = ("H100-SXM", "H200")
HETERO_SPLIT = (1, 3)  # prefill GPUs, decode GPUs
AFD_MODEL, AFD_GPU, AFD_GPUS, AFD_CONTEXT = "deepseek-v3", "H100-SXM", 16, 8192
CHECK_QUESTIONS = TP_QUESTIONS  # the same chat questions as chapter 14's TP run


@dataclass(frozen=True)
class Sizes:
    """What each part runs: the simulated cluster, the planner's question and the engine check."""

    size: str
    cluster_model: str
    cluster_gpu: str
    cluster_requests: int
    plan_model: str
    plan_gpu: str
    plan_context: int
    plan_users: int
    plan_itl_slo_ms: float
    check_prompts: int
    check_new_tokens: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Quick: 60 simulated requests per workload and 6 short prompts on the engine (a few seconds)."""
    size = choose_size(device, size)
    common = dict(cluster_model="llama-3-8b", cluster_gpu="H100-SXM", plan_model="llama-3-70b", plan_gpu="H100-SXM",
                  plan_context=8192, plan_users=16, plan_itl_slo_ms=30.0)
    if size == "quick":
        return Sizes(size, cluster_requests=60, check_prompts=6, check_new_tokens=6, **common)
    return Sizes(size, cluster_requests=300, check_prompts=12, check_new_tokens=12, **common)


# ---------------------------------------------------------------------------------------------
# Part 1: the cluster simulator


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
    return ModeRow(workload, label, r.layout, r.ttft_ms_p50, r.ttft_ms_p99, r.itl_ms_p50, r.itl_ms_p99,
                   r.itl_ms_max, r.output_tokens_per_s_per_gpu, r.goodput_rps_per_gpu, r.slo_attainment)


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
    import numpy as np

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
    import numpy as np

    from ..figures import subplots

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


# ---------------------------------------------------------------------------------------------
# Part 2: heterogeneous hardware, the wafer-scale data point, attention/FFN split


@dataclass(frozen=True)
class WaferPoint:
    """The quoted wafer-scale claims next to what the vendor's figures compute (cited, not catalogued)."""

    chip: str
    label: str
    source: str
    claimed_tokens_per_s: float
    claimed_h100_tokens_per_s: float
    claimed_speedup: float
    bandwidth_ratio: float
    bandwidth_ratio_claimed: float
    model: str
    chips_to_hold_weights: int
    batch1_bound_tokens_per_s: dict[str, float]
    gpu: str = "H100-SXM"  # the catalog GPU the quoted figures are set against
    weight_bytes: int = 0  # the model's weights (bytes)
    gpu_memory_bytes: int = 0  # one such GPU's memory (bytes)

    @property
    def gpu_bound_tokens_per_s(self) -> float:
        """The GPU's batch-1 bandwidth bound for ``model`` (tokens/s): every weight read once per token."""
        return self.batch1_bound_tokens_per_s[self.gpu]

    @property
    def quote_is_this_workload(self) -> bool:
        """Whether the quoted GPU tokens/s could be ``model`` at batch 1 on one GPU: the weights fit and
        the quote is within the bandwidth bound."""
        return self.weight_bytes <= self.gpu_memory_bytes and self.claimed_h100_tokens_per_s <= self.gpu_bound_tokens_per_s


@dataclass(frozen=True)
class HeteroResult:
    model: str
    prefill_gpu: str
    decode_gpu: str
    fitness: list[PhaseFitness]
    reports: list[ModeRow]
    wafer: WaferPoint
    afd_model: str
    afd_colocated: AFDPoint
    afd_split: AFDPoint
    afd_gain: float
    split: tuple[int, int] = HETERO_SPLIT  # prefill GPUs, decode GPUs of the simulated comparison


def wafer_point(model: str = "llama-3-70b") -> WaferPoint:
    """The cited wafer-scale claims and what the vendor's figures compute (:func:`infer_lab.cluster.hetero.wafer_scale_data_point`)."""
    from ..catalog import get_gpu
    from ..cluster import hetero

    gpu = get_gpu("H100-SXM")
    w = hetero.wafer_scale_data_point(model, gpu=gpu.name)
    claims = w["talk_claims"]
    return WaferPoint(w["chip"], w["label"], w["source"], claims["tokens_per_s"], claims["h100_tokens_per_s"],
                      w["claimed_speedup"], w["bandwidth_ratio"], w["bandwidth_ratio_claimed"], w["model"],
                      w["chips_to_hold_weights"], w["batch1_bound_tokens_per_s"], gpu.name, int(w["weight_bytes"]),
                      gpu.memory_bytes)


def wafer_text(w: WaferPoint) -> str:
    """The cited wafer-scale figures in words: the quoted speeds, the bandwidth ratio recomputed, and
    whether the quoted GPU speed can be ``w.model`` at batch 1 on one GPU at all before any conclusion
    is drawn from the two speeds; every number from ``w``."""
    head = (f"**Cited data point, not a catalog GPU:** {w.chip} ({w.label}). Quoted in a public talk on inference: "
            f"about {w.claimed_tokens_per_s:,.0f} tok/s vs {w.claimed_h100_tokens_per_s:,.0f} on an H100 "
            f"({w.claimed_speedup:.0f}x), and on-chip bandwidth '{w.bandwidth_ratio_claimed:,.0f}x' an H100's HBM. "
            f"The vendor's own 21 PB/s over the catalog's H100 HBM is **{w.bandwidth_ratio:,.0f}x**, not "
            f"{w.bandwidth_ratio_claimed:,.0f}x. ")
    fits = w.weight_bytes <= w.gpu_memory_bytes
    memory = (f"{fmt_bytes(w.weight_bytes)} of weights {'fit' if fits else 'do not fit'} one {w.gpu}'s "
              f"{fmt_bytes(w.gpu_memory_bytes)}")
    bound = f"the {w.gpu}'s batch-1 bandwidth bound for {w.model} is {w.gpu_bound_tokens_per_s:,.0f} tok/s"
    if w.quote_is_this_workload:
        compare = (f"For {w.model} on one {w.gpu}, {memory} and {bound}, so the quoted "
                   f"{w.claimed_h100_tokens_per_s:,.0f} could be that workload; then a {w.bandwidth_ratio:,.0f}x "
                   f"bandwidth ratio buying a claimed {w.claimed_speedup:.0f}x says something other than memory "
                   "bandwidth sets the wafer's speed. ")
    else:
        why = [] if fits else [memory]
        if w.claimed_h100_tokens_per_s > w.gpu_bound_tokens_per_s:
            why.append(f"{bound}, below the quoted {w.claimed_h100_tokens_per_s:,.0f}")
        compare = (f"The two quoted speeds cannot be {w.model} at batch 1 on one {w.gpu}: " + " and ".join(why)
                   + ". The talk named no model, batch or system size, so the "
                   f"{w.claimed_speedup:.0f}x is not comparable with the {w.bandwidth_ratio:,.0f}x bandwidth ratio. ")
    spread = (f"What stands on its own: {w.model} needs {w.chips_to_hold_weights} wafers just to hold its weights "
              "in SRAM, so each token crosses between wafers and its speed is not bounded by one wafer's SRAM "
              "bandwidth alone. " if w.chips_to_hold_weights > 1 else
              f"{w.model}'s weights fit one wafer's SRAM. ")
    return head + compare + spread + f"Source: {w.source}."


HETERO_LABELS = ("heterogeneous P:D", "P:D, all prefill GPU", "P:D, all decode GPU", "colocated chunked, decode GPU")


def hetero_result(model: str, pick: Any, reports: list[ClusterReport], afd: dict[str, Any],
                  split: tuple[int, int] = HETERO_SPLIT) -> HeteroResult:
    """What the notebook's ``heterogeneous`` and ``attention_ffn_split`` returned, as one result."""
    return HeteroResult(model, pick.prefill_gpu, pick.decode_gpu, list(pick.fitness),
                        [_mode_row("chat", lab, r) for lab, r in zip(HETERO_LABELS, reports, strict=True)],
                        wafer_point(), AFD_MODEL, afd["colocated"], afd["best_split"], afd["gain"], split)


def run_hetero(lm: Any, sizes: Sizes) -> HeteroResult:
    """Run the notebook's own experiments (``heterogeneous``, ``attention_ffn_split``)."""
    pick, reports = notebook_function(NUMBER, "heterogeneous")(sizes.cluster_model, HETERO_GPUS, sizes.cluster_requests,
                                                               SERVING_SLO, *HETERO_SPLIT)
    afd = notebook_function(NUMBER, "attention_ffn_split")(AFD_MODEL, AFD_GPU, AFD_GPUS, AFD_CONTEXT)
    return hetero_result(sizes.cluster_model, pick, reports, afd)


def cited_pairing_text(chip: str = "Cerebras-WSE-3", gpu: str = "H100-SXM") -> str:
    """The talk's heterogeneous claims (cited, from ``data/cited_chips.json``), each with its speaker and
    baseline, beside what the course computes."""
    from ..catalog import get_cited_chip, get_cited_system_claim

    c = get_cited_chip(chip)
    pair = c.talk_claims["pairing"]
    mixed = get_cited_system_claim("heterogeneous-vs-homogeneous")
    lo, hi = mixed["speedup_range"]
    return (
        f"**Cited, not computed:** the talk's Cerebras speaker announced a pairing being brought to production, "
        f"{pair['prefill']} for prefill and {pair['decode']} for decode with the KV cache moved over {pair['link']}, "
        f"that \"will provide\" about {pair['speedup']:.0f}× faster token processing for {pair['baseline']}: a "
        f"plan, with no model or batch given. Then, speaking for Gimlet Labs, the talk claimed {lo:.0f}–{hi:.0f}× "
        f"faster inference for {mixed['system']}, against {mixed['baseline']}: a claim about mixing chips, not "
        f"about the SRAM chip. **Computed here:** {chip}'s memory bandwidth is {c.bandwidth_ratio_vs(gpu):,.0f}× "
        f"an {gpu}'s HBM, so a bandwidth-bound batch-1 decode could be that much faster per chip, and the talk's "
        f"own tokens/s give {c.claimed_speedup():.0f}×. Neither the {lo:.0f}–{hi:.0f}× nor the pairing's "
        f"{pair['speedup']:.0f}× (for {pair['baseline']}) names the systems compared, a workload or a measured "
        "power, so both stay the talk's "
        "claims; the pairing is the shape of the idea (each phase on the chip whose roofline suits it), not a "
        "measured result."
    )


def cluster_usd_per_hour(gpus: dict[str, int]) -> float:
    """$ per hour of a cluster of ``{gpu: count}`` at the catalog's indicative prices."""
    from ..catalog import get_gpu

    return sum(get_gpu(g).price_usd_per_hour * n for g, n in gpus.items())


def hetero_text(h: HeteroResult) -> str:
    fit = {f.gpu: f for f in h.fitness}
    pre, dec = fit[h.prefill_gpu], fit[h.decode_gpu]
    het, homo_p, homo_d = h.reports[0], h.reports[1], h.reports[2]
    w = h.wafer
    c, s = h.afd_colocated, h.afd_split
    n_p, n_d = h.split
    usd = {"mix": cluster_usd_per_hour({h.prefill_gpu: n_p, h.decode_gpu: n_d}) if h.prefill_gpu != h.decode_gpu
           else cluster_usd_per_hour({h.prefill_gpu: n_p + n_d}),
           "all_p": cluster_usd_per_hour({h.prefill_gpu: n_p + n_d}),
           "all_d": cluster_usd_per_hour({h.decode_gpu: n_p + n_d})}
    seq_tps = s.tokens_per_s_per_gpu * s.step_ms / s.sequential_step_ms
    return "\n\n".join([
        f"**Heterogeneous pick** for {h.model}, by tokens per dollar-hour: prefill on {h.prefill_gpu} "
        f"({pre.prefill_tokens_per_s_per_usd_hour:,.0f} prefill tok/s per $/h; ridge point {pre.ridge_point:.0f} "
        f"FLOP/byte), decode on {h.decode_gpu} ({dec.decode_tokens_per_s_per_usd_hour:,.0f} decode tok/s per $/h at "
        f"batch {dec.decode_batch}; ridge point {dec.ridge_point:.0f}). Simulated on chat, {n_p} prefill + {n_d} decode "
        f"GPUs, the whole comparison: the mix has ITL p50 {het.itl_ms_p50:.1f} ms and goodput "
        f"{human(het.goodput_rps_per_gpu, 3)} req/s per GPU at ${usd['mix']:.2f}/h; all {h.prefill_gpu}: "
        f"{homo_p.itl_ms_p50:.1f} ms, {human(homo_p.goodput_rps_per_gpu, 3)} req/s per GPU, ${usd['all_p']:.2f}/h; all "
        f"{h.decode_gpu}: {homo_d.itl_ms_p50:.1f} ms, {human(homo_d.goodput_rps_per_gpu, 3)} req/s per GPU, "
        f"${usd['all_d']:.2f}/h. "
        + (f"The decode GPUs set ITL and goodput, so against all {h.decode_gpu} the mix changes only the price: "
           f"{1 - usd['mix'] / usd['all_d']:.0%} less per hour, and nothing else. "
           if abs((het.itl_ms_p50 or 0) - (homo_d.itl_ms_p50 or 0)) < 0.05 * (homo_d.itl_ms_p50 or 1) else "")
        + "The quoted case, compute-dense prefill chips with SRAM/bandwidth-dense decode chips, needs two chips "
        "that differ in kind: the cited pairing below, not this pair.",
        wafer_text(w),
        cited_pairing_text(w.chip),
        f"**Attention/FFN split** for {h.afd_model} on H100 SXM (analytic, fp8 weights as DeepSeek serves them): "
        f"colocated, each GPU fits {c.batch_per_attention_gpu} users next to its share of the experts; split, an "
        f"attention GPU holds only attention weights and KV and fits {s.batch_per_attention_gpu}, so the expert FFN "
        f"sees {s.ffn_tokens:,} tokens per step (arithmetic intensity {s.ffn_intensity:.0f} vs {c.ffn_intensity:.0f} "
        f"FLOP/byte), with {s.n_attention_gpus} attention + {s.n_ffn_gpus} FFN GPUs. Both bounds of the split: if "
        f"attention, FFN and the {s.transfer_ms:.1f} ms token exchange overlap completely (ping-pong micro-batches), "
        f"a step takes {s.step_ms:.1f} ms and each GPU serves {s.tokens_per_s_per_gpu:,.0f} tok/s, **{h.afd_gain:.2f}x** "
        f"the colocated {c.tokens_per_s_per_gpu:,.0f}; with no overlap it takes {s.sequential_step_ms:.1f} ms and "
        f"serves {seq_tps:,.0f} tok/s, **{seq_tps / c.tokens_per_s_per_gpu:.2f}x**"
        + (": worse than not splitting. The split pays only as far as the exchange hides behind compute."
           if seq_tps < c.tokens_per_s_per_gpu else "."),
    ])


FITNESS_COLUMNS = [
    Column("gpu", "GPU", "text"), Column("ridge_point", "ridge (FLOP/byte)"),
    Column("prefill_tokens_per_s", "prefill tok/s"), Column("prefill_tokens_per_s_per_usd_hour", "prefill tok/s per $/h"),
    Column("decode_batch", "decode batch", "int"), Column("decode_tokens_per_s", "decode tok/s"),
    Column("decode_tokens_per_s_per_usd_hour", "decode tok/s per $/h"), Column("usd_per_hour", "$/h"),
]
AFD_COLUMNS = [
    Column("mode", "attention/FFN", "text"), Column("n_attention_gpus", "attention GPUs", "int"),
    Column("n_ffn_gpus", "FFN GPUs", "int"), Column("batch_per_attention_gpu", "users per attention GPU", "int"),
    Column("attention_ms", "attention (ms)"), Column("ffn_ms", "FFN (ms)"), Column("transfer_ms", "transfer (ms)"),
    Column("step_ms", "step (ms)"), Column("ffn_intensity", "FFN FLOP/byte"),
    Column("tokens_per_s_per_gpu", "tok/s per GPU"), Column("usd_per_m_tokens", "$ / M tokens"),
]


def wafer_rows(w: WaferPoint) -> list[dict[str, Any]]:
    rows = [{"what": "quoted: tokens/s (wafer vs H100)", "value": f"{w.claimed_tokens_per_s:,.0f} vs "
             f"{w.claimed_h100_tokens_per_s:,.0f}", "source": "cited (a public talk)"},
            {"what": "quoted: bandwidth vs H100 HBM", "value": f"{w.bandwidth_ratio_claimed:,.0f}x", "source": "cited (a public talk)"},
            {"what": "vendor 21 PB/s / catalog H100 3.35 TB/s", "value": f"{w.bandwidth_ratio:,.0f}x", "source": "computed"},
            {"what": f"wafers to hold {w.model} in SRAM", "value": f"{w.chips_to_hold_weights}", "source": "computed"}]
    rows += [{"what": f"batch-1 bandwidth bound, {chip}", "value": f"{v:,.0f} tok/s", "source": "computed (a bound)"}
             for chip, v in w.batch1_bound_tokens_per_s.items()]
    return rows


# ---------------------------------------------------------------------------------------------
# Part 3: the planner's answer and its launch commands


@dataclass(frozen=True)
class PlanResult:
    model: str
    hub_id: str
    gpu: str
    context: int
    itl_slo_ms: float
    min_users: int
    chosen: int | None
    parallelism: str | None
    reason: str
    considered: list[LayoutRow]
    vllm: str
    sglang: str
    infer_lab: str
    disaggregated: dict[str, str]  # "engine role" -> command, in launch order (see pd_commands)
    pointers: dict[str, str]
    pd_tp: int = 1  # TP size of each P/D role


# The P/D pair as one procedure on one node with 2 x TP GPUs: each role on its own GPUs, both servers on
# 127.0.0.1 with the proxy or router in front of them on port PD_FRONT_PORT.
PD_PORTS = {"prefill": 8100, "decode": 8200}
PD_FRONT_PORT = 8000
# vLLM's NixlConnector handshake port (VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600): every worker on a host needs
# its own, base + dp_rank x tp_size + tp_rank, so the decode server's base starts past the prefill's TP ranks
# (vLLM's NixlConnector usage guide, docs.vllm.ai, features/nixl_connector_usage).
NIXL_SIDE_CHANNEL_BASE = 5600
# vLLM ships no prefill/decode router in its package: its NixlConnector guide runs this proxy from a clone of
# the vLLM repository (arguments as in that file: --port, --prefiller-hosts/-ports, --decoder-hosts/-ports).
VLLM_PD_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


def pd_gpus(role: str, tp: int) -> str:
    """CUDA_VISIBLE_DEVICES of one P/D role on a node of 2 x ``tp`` GPUs: prefill the first ``tp``, decode the rest."""
    first = list(PD_PORTS).index(role) * tp
    return ",".join(str(g) for g in range(first, first + tp))


def pd_commands(hub_id: str, tp: int, context: int) -> dict[str, str]:
    """The disaggregated deployment as commands to run in order, on one node with 2 x ``tp`` GPUs: for vLLM
    the prefill server, the decode server and the proxy that sends each request to the first then the second;
    for SGLang the two servers and its router. Keys are "engine role"."""
    from .. import launchers

    out = {}
    for eng in launchers.ENGINES:
        for i, role in enumerate(launchers.DISAGGREGATION_ROLES):
            opts = launchers.EngineOptions(hub_id, tensor_parallel=tp, max_model_len=context, disaggregation=role,
                                           port=PD_PORTS[role])
            env = [f"CUDA_VISIBLE_DEVICES={pd_gpus(role, tp)}"]
            if eng == "vllm":
                env.append(f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_SIDE_CHANNEL_BASE + i * tp}")
            out[f"{eng} {role}"] = " ".join(env + [shlex.join(launchers.build_command(eng, opts, python="python"))])
        hosts = {role: f"http://127.0.0.1:{port}" for role, port in PD_PORTS.items()}
        if eng == "vllm":
            out["vllm proxy"] = shlex.join([
                "python", VLLM_PD_PROXY, "--port", str(PD_FRONT_PORT),
                "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(PD_PORTS["prefill"]),
                "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(PD_PORTS["decode"])])
        else:
            out["sglang router"] = shlex.join(launchers.pd_router_command(
                "sglang", [hosts["prefill"]], [hosts["decode"]], port=PD_FRONT_PORT, host="127.0.0.1"))
    return out


def pd_gpus_text(pd_tp: int, chosen: int | None) -> str:
    """How many GPUs the P/D pair needs (one TP group per role) against the planner's colocated count."""
    need = 2 * pd_tp
    head = f"The pair needs **{need} GPUs**, TP{pd_tp} per role"
    if chosen is None:
        return head + "."
    if need > chosen:
        return head + f": {need - chosen} more than the {chosen} the planner chose for one colocated server."
    if need < chosen:
        return head + f": {chosen - need} fewer than the {chosen} the planner chose for one colocated server."
    return head + f": the same {chosen} the planner chose for one colocated server."


def plan_result(sizes: Sizes, rec: Any, scale_out: dict[str, Any], users: int | None = None) -> PlanResult:
    """What the notebook's ``plan_cluster`` returned (the planner's recommendation and its launch
    commands), with the same deployment written for this course's launcher and as P/D servers.
    ``users``: the users asked for, when the page changed them from ``sizes.plan_users``."""
    from .. import launchers
    from ..catalog import load_model_config

    model, ctx = sizes.plan_model, sizes.plan_context
    hub = load_model_config(model).get("_infer_lab", {}).get("hf_id", model)
    tp = rec.plan.tp if rec.plan else 8
    dp = rec.plan.dp if rec.plan else 1
    ours = shlex.join(["infer-lab", "engines", "launch", "vllm", "--model", hub, "--tp", str(tp)]
                      + (["--dp", str(dp)] if dp > 1 else []) + ["--max-model-len", str(ctx)])
    pd = pd_commands(hub, tp, ctx)
    considered = [LayoutRow(p.gpu, p.parallelism, p.n_gpus, p.interconnect or "—", p.itl_ms, p.tokens_per_s,
                            p.input_tokens_per_s, p.allreduce_ms_per_step, p.meets_slo, p.usd_per_m_output_tokens,
                            p.joules_per_output_token) for p in rec.considered]
    return PlanResult(model, hub, sizes.plan_gpu, ctx, sizes.plan_itl_slo_ms, users or sizes.plan_users, scale_out["chosen"],
                      scale_out["parallelism"], scale_out["reason"], considered, shlex.join(scale_out["vllm"]),
                      shlex.join(scale_out["sglang"]), ours, pd, dict(launchers.DISTRIBUTED_POINTERS), tp)


def run_plan(lm: Any, sizes: Sizes) -> PlanResult:
    """Run the notebook's own experiment (``plan_cluster`` of ``infer_lab/notebooks/15_cluster.py``)."""
    plan = notebook_function(NUMBER, "plan_cluster")
    return plan_result(sizes, *plan(sizes.plan_model, sizes.plan_gpu, sizes.plan_context, sizes.plan_itl_slo_ms,
                                    sizes.plan_users))


def plan_text(p: PlanResult) -> str:
    head = (f"**The planner:** {p.model} for {p.min_users} users at {p.context:,} tokens within {p.itl_slo_ms:.0f} ms "
            f"ITL on {p.gpu}: " + (f"**{p.chosen} GPUs, {p.parallelism}** ({p.reason})." if p.chosen
                                   else f"nothing fits ({p.reason}); the commands are for 8 GPUs."))
    return "\n\n".join([
        head,
        f"Launch it with vLLM:\n\n```\n{p.vllm}\n```\n\nor SGLang:\n\n```\n{p.sglang}\n```\n\nor through this "
        f"course's launcher (same flags, health check, logs):\n\n```\n{p.infer_lab}\n```",
        "Disaggregated prefill/decode, one server per role on its own GPUs, with a proxy in front that sends each "
        "request to the prefill server, then to the decode server with the KV's address. "
        + pd_gpus_text(p.pd_tp, p.chosen) + f" On one node of {2 * p.pd_tp} GPUs, run each block's lines in order "
        f"(each in its own terminal), then send requests to port {PD_FRONT_PORT}. vLLM, with its NixlConnector and the "
        f"proxy script its guide runs from a clone of the vLLM repository:\n\n```\n"
        + "\n".join(v for k, v in p.disaggregated.items() if k.startswith("vllm")) + "\n```\n\nSGLang, with its PD "
        "mode and its router (SGLang's guide adds `--disaggregation-ib-device` to name the RDMA NIC the KV moves "
        "over):\n\n```\n"
        + "\n".join(v for k, v in p.disaggregated.items() if k.startswith("sglang")) + "\n```\n\nAcross two nodes, "
        "bind each server to an address the other node reaches (`--host`), point the proxy or router there, and for "
        "vLLM set `VLLM_NIXL_SIDE_CHANNEL_HOST` on the prefill node to its address, where the decode server fetches "
        "the KV.",
        "Across nodes, with KV-aware routing and autoscaled pools: " + "; ".join(p.pointers.values()) + ".",
        "Our engine stays on one device: it is the from-scratch demonstration of the mechanism, not a distributed "
        "server.",
    ])


# ---------------------------------------------------------------------------------------------
# Part 4: the simulator against our engine


def check_model(lm: Any) -> Any:
    """The model the engine check serves: ``lm`` on a CPU, else the embedded SmolLM2 on the CPU
    (the check fits a CPU engine's step times; a GPU's are measured the same way by the CLI)."""
    if lm is not None and lm.device.type == "cpu":
        return lm
    from ..models import load_model

    return load_model("smollm2-135m", device="cpu")


def check_prompts(lm: Any, sizes: Sizes) -> list[list[int]]:
    """The engine check's prompts: chat questions, or random ids when the model has no tokenizer."""
    n = sizes.check_prompts
    if lm.tokenizer is None or lm.is_random:
        return [lm.random_ids(1, 12 + 5 * i, seed=i)[0].tolist() for i in range(n)]
    return [lm.chat_ids(CHECK_QUESTIONS[i % len(CHECK_QUESTIONS)])[0].tolist() for i in range(n)]


def run_check(lm: Any, sizes: Sizes, slots: int = CHECK_SLOTS) -> SimVsEngine:
    """Run the notebook's own experiment (``simulator_vs_engine`` of ``infer_lab/notebooks/15_cluster.py``)."""
    cpu = check_model(lm)
    return notebook_function(NUMBER, "simulator_vs_engine")(cpu, check_prompts(cpu, sizes), sizes.check_new_tokens, slots)


def check_text(c: SimVsEngine) -> str:
    """Part 4 in words: what the check can show (the same steps as the engine's) first, then the
    times, with a verdict on them only when the fitted step cost explains the steps."""
    from ..analysis.plausibility import caution, line_fit_flags

    r = c.ratios()
    flags = line_fit_flags("the engine's step time", c.fit.a_s, c.fit.b_s_per_token, c.fit.r2, r2_floor=R2_FLOOR)
    schedule = ("the simulator's scheduler made **the same steps as the engine's, step for step**"
                if c.same_schedule else "the simulator's scheduler made **DIFFERENT steps from the engine's**")
    times = (f"Simulated / measured: makespan {r['makespan']:.3f}, mean ITL {r['mean_itl']:.3f}, mean first-token "
             f"time {r['mean_first_token']:.3f} (tolerances {', '.join(f'{k} ±{v:.0%}' for k, v in TOLERANCES.items())})")
    if flags:
        times += (": **no verdict on times**, because the step cost they rest on is not a cost model. "
                  + caution(flags))
    else:
        times += f": on times they **{'agree' if c.within() else 'DO NOT agree'}**."
    return (
        f"Our engine served {c.requests} requests with {c.max_num_seqs} slots in {len(c.engine_step_tokens)} steps "
        f"({c.threads} torch thread(s)), and {schedule}: that is what this check tests. Its steps fit "
        f"`{c.fit.a_s * 1e3:.1f} ms + {c.fit.b_s_per_token * 1e3:.2f} ms x tokens` (R² {c.fit.r2:.2f}), and the "
        f"simulator replays the steps on that same fit, " + (
            f"so its busy time matches the engine's by construction (ratio {c.busy_ratio:.4f}: a least-squares "
            f"fit's residuals sum to zero over the same steps). " if c.same_schedule else
            f"but over other steps, so even its busy time tests the fit (ratio {c.busy_ratio:.4f}). ")
        + f"{times} "
        "What is not tested here: the roofline step costs that parts 1 and 2 simulate with."
    )


CHECK_COLUMNS = [
    Column("what", "quantity", "text"), Column("engine", "engine, measured (ms)"),
    Column("sim", "simulator (ms)"), Column("ratio", "sim / engine", "ratio", digits=4),
]


def check_table(c: SimVsEngine):
    rows = [{"what": "makespan", "engine": c.engine_wall_s * 1e3, "sim": c.sim_makespan_s * 1e3,
             "ratio": c.makespan_ratio},
            {"what": "busy time (sum of steps)", "engine": c.engine_busy_s * 1e3, "sim": c.sim_makespan_s * 1e3,
             "ratio": c.busy_ratio},
            {"what": "mean ITL", "engine": c.engine_mean_itl_s * 1e3, "sim": c.sim_mean_itl_s * 1e3,
             "ratio": c.itl_ratio},
            {"what": "mean first token since start", "engine": c.engine_mean_first_token_s * 1e3,
             "sim": c.sim_mean_first_token_s * 1e3, "ratio": c.first_token_ratio}]
    return people_table(rows, CHECK_COLUMNS)


# ---------------------------------------------------------------------------------------------
# The chapter surface


@dataclass
class Result(ChapterResult):
    """Chapter 15's parts; a part not run is ``None``."""

    model: str = ""
    cluster: ClusterResult | None = None
    hetero: HeteroResult | None = None
    plan: PlanResult | None = None
    check: SimVsEngine | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "cluster": lambda: run_cluster(lm, sizes),
        "hetero": lambda: run_hetero(lm, sizes),
        "plan": lambda: run_plan(lm, sizes),
        "check": lambda: run_check(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {result.threads} torch thread(s)."]
    texts = [(result.cluster, cluster_text), (result.hetero, hetero_text), (result.plan, plan_text),
             (result.check, check_text)]
    lines += [fn(part) for part, fn in texts if part is not None]
    return "\n\n".join(lines)


def cluster_tables(c: ClusterResult) -> dict[str, Any]:
    return {f"Serving modes (simulated): {c.model} on {c.n_gpus} x {c.gpu}": people_table(
                [m for w in c.workloads for m in w.modes], MODE_COLUMNS),
            "Every P:D split (simulated)": people_table([m for w in c.workloads for m in w.splits], MODE_COLUMNS)}


def hetero_tables(h: HeteroResult) -> dict[str, Any]:
    return {
        f"Phase fitness per GPU (analytic): {h.model}": people_table(h.fitness, FITNESS_COLUMNS),
        "Heterogeneous vs homogeneous (simulated, chat)": people_table(h.reports, MODE_COLUMNS),
        "Wafer-scale chip: cited claims vs computed": people_table(wafer_rows(h.wafer), [
            Column("what", "quantity", "text"), Column("value", "value", "text"), Column("source", "source", "text")]),
        f"Attention/FFN split (analytic): {h.afd_model}": people_table([h.afd_colocated, h.afd_split], AFD_COLUMNS),
    }


def plan_tables(p: PlanResult) -> dict[str, Any]:
    return {f"Layouts the planner considered: {p.model} on {p.gpu}": people_table(p.considered, LAYOUT_COLUMNS)}


def tables(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.cluster:
        out.update(cluster_tables(result.cluster))
    if result.hetero:
        out.update(hetero_tables(result.hetero))
    if result.plan:
        out.update(plan_tables(result.plan))
    if result.check:
        out["Simulator vs our engine (this machine)"] = check_table(result.check)
    return out


def figures(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.cluster:
        out["cluster_itl"] = cluster_figure(result.cluster)
    return out


def saved() -> None:
    """Nothing saved from a real cluster yet: every number of this chapter is simulated, computed or
    measured on this machine (chapter 14 shows tensor-parallel runs saved from multi-GPU machines)."""
    return None
