"""Clusters to simulate and the comparisons the course makes with them.

- :func:`colocated` / :func:`disaggregated` build the instances of a cluster from the catalog
  (KV capacity from the memory equation, step costs from the roofline unless measured costs
  are passed in).
- :func:`compare_modes` runs one trace through colocated (with and without chunked prefill) and
  disaggregated serving on the same GPUs.
- :func:`best_pd_ratio` sweeps P:D on a fixed number of GPUs and picks the ratio with the most
  goodput.
- :func:`saturation` pushes a trace far past capacity to compare the modes' throughput: what
  vLLM's documentation says disaggregation does not raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.memory import kv_bytes_per_token as per_token
from ..analysis.parallel import Layout, kv_replication, replica_fit
from ..catalog import get_gpu
from ..units import require_positive
from .costs import RooflineStepCost, StepBatch, StepCostModel
from .report import SLO, ClusterReport, summarize
from .sim import InstanceSpec, SimResult, simulate
from .workloads import TraceRequest, get_workload, make_trace

DEFAULT_MODEL = "llama-3-8b"
CHUNK_TOKENS = (
    2048  # chunked-prefill token budget per step (a parameter; vLLM's is configurable too)
)
WHOLE_PROMPT_TOKENS = 16384  # without chunking: whole prompts batched up to this many tokens


def kv_bytes_per_token(model: Any, kv_dtype: str = "bf16") -> int:
    """Bytes of one token's K/V over all layers (what a disaggregated cluster moves per prompt token)."""
    return per_token(model, kv_dtype)


def kv_capacity_tokens(
    model: Any,
    gpu: str,
    tp: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
) -> int:
    """Tokens of KV one instance (a TP group of ``tp``) holds next to its weights (0 if they do not fit)."""
    report = replica_fit(model, gpu, Layout(tp=tp), 1, 1, weight_dtype, kv_dtype, memory_fraction)
    per_token = kv_bytes_per_token(model, kv_dtype) * kv_replication(model, tp)
    return max(0, int(report.kv_budget_bytes // per_token))


def instance(
    model: Any,
    gpu: str,
    role: str,
    tp: int = 1,
    cost: StepCostModel | None = None,
    chunked_prefill: bool = False,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int | None = None,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
    link: Any = None,
    name: str = "",
) -> InstanceSpec:
    """One instance of ``model`` on a TP group of ``tp`` ``gpu``s, sized from the catalog."""
    spec = get_gpu(gpu)
    capacity = kv_capacity_tokens(model, spec.name, tp, weight_dtype, kv_dtype, memory_fraction)
    if capacity <= 0:
        raise ValueError(f"{model} does not fit a TP{tp} group of {spec.name} with room for KV")
    budget = max_num_batched_tokens or (CHUNK_TOKENS if chunked_prefill else WHOLE_PROMPT_TOKENS)
    return InstanceSpec(
        role=role,
        cost=cost or RooflineStepCost(model, spec.name, tp, weight_dtype, kv_dtype, link=link),
        n_gpus=tp,
        kv_capacity_tokens=capacity,
        gpu=spec.name,
        name=name,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        chunked_prefill=chunked_prefill,
        usd_per_hour=spec.price_usd_per_hour * tp,
    )


def colocated(
    model: Any, gpu: str, n_gpus: int, tp: int = 1, chunked_prefill: bool = False, **kwargs: Any
) -> list[InstanceSpec]:
    """``n_gpus // tp`` colocated instances (each prefills and decodes)."""
    if n_gpus % tp:
        raise ValueError(f"{n_gpus} GPUs do not split into TP{tp} groups")
    return [
        instance(
            model,
            gpu,
            "colocated",
            tp,
            chunked_prefill=chunked_prefill,
            name=f"colocated-{i}",
            **kwargs,
        )
        for i in range(n_gpus // tp)
    ]


def disaggregated(
    model: Any,
    n_prefill: int,
    n_decode: int,
    prefill_gpu: str,
    decode_gpu: str | None = None,
    tp_prefill: int = 1,
    tp_decode: int = 1,
    prefill_cost: StepCostModel | None = None,
    decode_cost: StepCostModel | None = None,
    **kwargs: Any,
) -> list[InstanceSpec]:
    """``n_prefill`` prefill instances and ``n_decode`` decode instances (counts of TP groups)."""
    require_positive("n_prefill", n_prefill)
    require_positive("n_decode", n_decode)
    decode_gpu = decode_gpu or prefill_gpu
    pre = [
        instance(
            model,
            prefill_gpu,
            "prefill",
            tp_prefill,
            cost=prefill_cost,
            name=f"prefill-{i}",
            **kwargs,
        )
        for i in range(n_prefill)
    ]
    dec = [
        instance(
            model, decode_gpu, "decode", tp_decode, cost=decode_cost, name=f"decode-{i}", **kwargs
        )
        for i in range(n_decode)
    ]
    return pre + dec


def default_kv_link(prefill_gpu: str, decode_gpu: str, n_gpus: int) -> str:
    """The link KV travels on: the GPU's own scale-up link when prefill and decode share one
    server (same GPU type, at most 8 GPUs), else one InfiniBand NDR NIC per GPU."""
    a, b = get_gpu(prefill_gpu), get_gpu(decode_gpu)
    if a.name == b.name and n_gpus <= a.link().max_group:
        return a.interconnect
    return "infiniband-ndr400"


def parse_ratio(text: str) -> tuple[int, int]:
    """``'3:5'`` -> (3, 5): prefill and decode instance counts."""
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"--disaggregated wants P:D such as 2:6, got {text!r}") from None
    require_positive("prefill instances", p)
    require_positive("decode instances", d)
    return p, d


# ---------------------------------------------------------------------------------------------
# Load


def capacity_rps(
    model: Any,
    gpu: str,
    n_gpus: int,
    prompt_tokens: int,
    output_tokens: int,
    tp: int = 1,
    decode_batch: int = 64,
    cost: StepCostModel | None = None,
) -> float:
    """A rough requests/s a colocated cluster sustains: per-request GPU time is one prefill plus
    its share of ``decode_batch``-wide decode steps. Used to pick a sensible default rate."""
    per = cost or RooflineStepCost(model, gpu, tp)
    context = prompt_tokens + output_tokens // 2
    batch = max(
        1,
        min(
            decode_batch,
            kv_capacity_tokens(model, gpu, tp) // max(1, prompt_tokens + output_tokens),
        ),
    )
    busy = (
        per(StepBatch.prefill(prompt_tokens))
        + output_tokens * per(StepBatch.decode(batch, context)) / batch
    )
    return (n_gpus // tp) / busy


def trace_for(
    model: Any,
    workload: str,
    gpu: str,
    n_gpus: int,
    requests: int = 300,
    load: float = 0.7,
    rate_per_s: float | None = None,
    seed: int = 0,
    tp: int = 1,
) -> list[TraceRequest]:
    """A trace of ``workload`` at ``rate_per_s``, or at ``load`` x the cluster's rough capacity."""
    shape = get_workload(workload)
    rate = rate_per_s or load * capacity_rps(
        model, gpu, n_gpus, shape.prompt_tokens, shape.output_tokens, tp
    )
    return make_trace(shape, requests, rate, seed=seed)


# ---------------------------------------------------------------------------------------------
# Comparisons


def run_colocated(
    model: Any,
    trace: list[TraceRequest],
    gpu: str,
    n_gpus: int,
    tp: int = 1,
    chunked_prefill: bool = False,
    **kwargs: Any,
) -> SimResult:
    """Simulate ``trace`` on colocated instances."""
    return simulate(colocated(model, gpu, n_gpus, tp, chunked_prefill, **kwargs), trace)


def run_disaggregated(
    model: Any,
    trace: list[TraceRequest],
    n_prefill: int,
    n_decode: int,
    prefill_gpu: str,
    decode_gpu: str | None = None,
    tp_prefill: int = 1,
    tp_decode: int = 1,
    kv_link: Any = None,
    kv_dtype: str = "bf16",
    **kwargs: Any,
) -> SimResult:
    """Simulate ``trace`` on P prefill + D decode instances with the KV moved over ``kv_link``."""
    decode_gpu = decode_gpu or prefill_gpu
    insts = disaggregated(
        model,
        n_prefill,
        n_decode,
        prefill_gpu,
        decode_gpu,
        tp_prefill,
        tp_decode,
        kv_dtype=kv_dtype,
        **kwargs,
    )
    link = kv_link or default_kv_link(prefill_gpu, decode_gpu, sum(i.n_gpus for i in insts))
    return simulate(insts, trace, kv_bytes_per_token(model, kv_dtype), link)


@dataclass(frozen=True)
class ModeComparison:
    """One trace on the same GPUs: colocated, colocated with chunked prefill, and every P:D."""

    workload: str
    gpu: str
    n_gpus: int
    tp: int
    colocated: ClusterReport
    colocated_chunked: ClusterReport
    disaggregated: list[ClusterReport]
    best_disaggregated: ClusterReport | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "gpu": self.gpu,
            "n_gpus": self.n_gpus,
            "tp": self.tp,
            "colocated": self.colocated.as_dict(),
            "colocated_chunked": self.colocated_chunked.as_dict(),
            "disaggregated": [r.as_dict() for r in self.disaggregated],
            "best_disaggregated": self.best_disaggregated.as_dict()
            if self.best_disaggregated
            else None,
            "best_pd_ratio": self.best_disaggregated.layout if self.best_disaggregated else None,
        }


def _goodput_key(r: ClusterReport) -> tuple:
    return (r.goodput_rps_per_gpu, r.slo_attainment, -(r.itl_ms.p99 if r.itl_ms else 0.0))


def best_pd_ratio(
    model: Any,
    trace: list[TraceRequest],
    gpu: str,
    n_gpus: int,
    tp: int = 1,
    slo: SLO | None = None,
    ratios: list[tuple[int, int]] | None = None,
    **kwargs: Any,
) -> tuple[ClusterReport | None, list[ClusterReport]]:
    """Every P:D split of ``n_gpus // tp`` instances (or ``ratios``); the best by goodput per GPU."""
    instances = n_gpus // tp
    if instances < 2:
        raise ValueError("disaggregation needs at least two instances (one prefill, one decode)")
    ratios = ratios or [(p, instances - p) for p in range(1, instances)]
    reports = [
        summarize(
            run_disaggregated(model, trace, p, d, gpu, tp_prefill=tp, tp_decode=tp, **kwargs), slo
        )
        for p, d in ratios
    ]
    best = max(reports, key=_goodput_key) if reports else None
    return best, reports


def compare_modes(
    model: Any,
    trace: list[TraceRequest],
    gpu: str,
    n_gpus: int,
    tp: int = 1,
    slo: SLO | None = None,
    workload: str = "",
    ratios: list[tuple[int, int]] | None = None,
    kv_link: Any = None,
) -> ModeComparison:
    """The same trace on the same GPUs, colocated (plain and chunked) vs disaggregated."""
    plain = summarize(run_colocated(model, trace, gpu, n_gpus, tp, False), slo)
    chunked = summarize(run_colocated(model, trace, gpu, n_gpus, tp, True), slo)
    best, reports = best_pd_ratio(model, trace, gpu, n_gpus, tp, slo, ratios, kv_link=kv_link)
    return ModeComparison(workload, gpu, n_gpus, tp, plain, chunked, reports, best)


def saturation(
    model: Any,
    workload: str,
    gpu: str,
    n_gpus: int,
    requests: int = 400,
    overload: float = 20.0,
    seed: int = 0,
    tp: int = 1,
    ratios: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Throughput ceilings: the trace arrives ``overload`` x faster than the cluster's rough
    capacity, so every mode runs flat out. Compares colocated (plain and chunked) with the
    best P:D split by output tokens/s per GPU (the strongest disaggregated baseline).

    The decode batch only fills when ``requests`` well exceeds instances x ``max_num_seqs``
    (256): for decode-heavy work at the default size the ceilings are those of a partly
    filled batch, for every mode alike.
    """
    trace = trace_for(model, workload, gpu, n_gpus, requests, load=overload, seed=seed, tp=tp)
    plain = summarize(run_colocated(model, trace, gpu, n_gpus, tp, False))
    chunked = summarize(run_colocated(model, trace, gpu, n_gpus, tp, True))
    instances = n_gpus // tp
    ratios = ratios or [(p, instances - p) for p in range(1, instances)]
    splits = [
        summarize(run_disaggregated(model, trace, p, d, gpu, tp_prefill=tp, tp_decode=tp))
        for p, d in ratios
    ]
    best = max(splits, key=lambda r: r.output_tokens_per_s_per_gpu)
    return {
        "colocated": plain,
        "colocated_chunked": chunked,
        "best_disaggregated": best,
        "disaggregated": splits,
        "colocated_over_best_disaggregated": max(
            plain.output_tokens_per_s_per_gpu, chunked.output_tokens_per_s_per_gpu
        )
        / best.output_tokens_per_s_per_gpu,
    }
