"""Prefill on a compute-dense GPU, decode on a bandwidth-dense one, and the cited wafer-scale chip.

*Compute-dense* means many FLOP/s per byte/s of memory bandwidth: a high ridge point. Prefill is
compute-bound, so it wants FLOP/s (per dollar). *Bandwidth-dense* means a low ridge point:
decode is memory-bound and wants bytes/s and memory to hold KV (per dollar).
:func:`phase_fitness` scores every catalog GPU on both phases for one model;
:func:`heterogeneous_pick` names the pair; :func:`compare_heterogeneous` simulates it against
the homogeneous clusters of the same GPUs.

The wafer-scale SRAM chip of the talk is a *cited* data point (``data/cited_chips.json``), not a
catalog GPU: :func:`wafer_scale_data_point` puts the talk's claims next to what the vendor's
figures and the roofline say.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..analysis.memory import weight_bytes
from ..catalog import get_cited_chip, get_gpu, list_gpus
from .costs import RooflineStepCost, StepBatch
from .report import SLO, ClusterReport, summarize
from .scenarios import kv_capacity_tokens, run_colocated, run_disaggregated
from .workloads import TraceRequest


@dataclass(frozen=True)
class PhaseFitness:
    """One GPU's fitness for each phase of one model (single GPU, TP1). Rates per $/hour."""

    gpu: str
    ridge_point: float
    fits: bool
    prefill_tokens_per_s: float | None
    prefill_tokens_per_s_per_usd_hour: float | None
    decode_batch: int
    decode_tokens_per_s: float | None
    decode_tokens_per_s_per_usd_hour: float | None
    usd_per_hour: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def phase_fitness(
    model: Any,
    gpus: list[str] | None = None,
    prompt_tokens: int = 4096,
    context: int = 4096,
    tpot_slo_ms: float = 50.0,
    max_batch: int = 256,
) -> list[PhaseFitness]:
    """Prefill tokens/s and decode tokens/s (largest batch within memory and the TPOT SLO) per
    catalog GPU, and the same per dollar-hour."""
    rows = []
    for name in gpus or list_gpus():
        spec = get_gpu(name)
        cap = kv_capacity_tokens(model, spec.name)
        if cap < context:
            rows.append(
                PhaseFitness(
                    spec.name,
                    spec.ridge_point(),
                    False,
                    None,
                    None,
                    0,
                    None,
                    None,
                    spec.price_usd_per_hour,
                )
            )
            continue
        cost = RooflineStepCost(model, spec.name)
        pre = prompt_tokens / cost(StepBatch.prefill(prompt_tokens))
        batch = min(max_batch, cap // context)
        while batch > 1 and cost(StepBatch.decode(batch, context)) * 1e3 > tpot_slo_ms:
            batch -= 1
        dec = batch / cost(StepBatch.decode(batch, context))
        price = spec.price_usd_per_hour
        rows.append(
            PhaseFitness(
                spec.name,
                spec.ridge_point(),
                True,
                pre,
                pre / price,
                batch,
                dec,
                dec / price,
                price,
            )
        )
    return rows


@dataclass(frozen=True)
class HeterogeneousPick:
    """Which GPU to prefill on and which to decode on, and why."""

    prefill_gpu: str
    decode_gpu: str
    by: str
    fitness: list[PhaseFitness]

    @property
    def heterogeneous(self) -> bool:
        return self.prefill_gpu != self.decode_gpu

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill_gpu": self.prefill_gpu,
            "decode_gpu": self.decode_gpu,
            "by": self.by,
            "heterogeneous": self.heterogeneous,
            "fitness": [f.as_dict() for f in self.fitness],
        }


def heterogeneous_pick(
    model: Any, gpus: list[str] | None = None, by: str = "ridge", **kwargs: Any
) -> HeterogeneousPick:
    """The prefill GPU and the decode GPU for ``model`` among ``gpus`` (those that hold it).

    ``by="ridge"``: the most compute-dense (highest FLOP per byte) for prefill and the most
    bandwidth-dense (lowest) for decode, the talk's rule. ``by="usd"``: the best prefill tokens
    per dollar and the best decode tokens per dollar (can be the same GPU: then there is no
    heterogeneous gain at these prices).
    """
    rows = phase_fitness(model, gpus, **kwargs)
    ok = [r for r in rows if r.fits]
    if not ok:
        raise ValueError(f"{model} fits none of {', '.join(r.gpu for r in rows)} on one GPU")
    if by == "ridge":
        pre = max(ok, key=lambda r: r.ridge_point)
        dec = min(ok, key=lambda r: r.ridge_point)
    elif by == "usd":
        pre = max(ok, key=lambda r: r.prefill_tokens_per_s_per_usd_hour)
        dec = max(ok, key=lambda r: r.decode_tokens_per_s_per_usd_hour)
    else:
        raise ValueError(f"by must be 'ridge' or 'usd', got {by!r}")
    return HeterogeneousPick(pre.gpu, dec.gpu, by, rows)


def compare_heterogeneous(
    model: Any,
    trace: list[TraceRequest],
    prefill_gpu: str,
    decode_gpu: str,
    n_prefill: int,
    n_decode: int,
    slo: SLO | None = None,
    kv_link: str = "infiniband-ndr400",
) -> list[ClusterReport]:
    """The heterogeneous P:D cluster next to the same P:D on one GPU type (each) and colocated
    on the decode GPU type with the same GPU count. Compare ``goodput_per_usd_hour``."""
    n = n_prefill + n_decode
    return [
        summarize(
            run_disaggregated(
                model, trace, n_prefill, n_decode, prefill_gpu, decode_gpu, kv_link=kv_link
            ),
            slo,
        ),
        summarize(
            run_disaggregated(
                model, trace, n_prefill, n_decode, prefill_gpu, prefill_gpu, kv_link=kv_link
            ),
            slo,
        ),
        summarize(
            run_disaggregated(
                model, trace, n_prefill, n_decode, decode_gpu, decode_gpu, kv_link=kv_link
            ),
            slo,
        ),
        summarize(run_colocated(model, trace, decode_gpu, n, chunked_prefill=True), slo),
    ]


def wafer_scale_data_point(
    model: str = "llama-3-70b", chip: str = "Cerebras-WSE-3", gpu: str = "H100-SXM"
) -> dict[str, Any]:
    """The talk's wafer-scale claims next to the vendor figures and a bandwidth-only bound.

    ``bandwidth_ratio`` is computed from the vendor's 21 PB/s and the catalog's H100 HBM
    (about 6,300x, not the talk's 7,000x). The batch-1 decode bounds read every weight once
    per token at each device's memory bandwidth; they are bounds, not predictions, and the gap
    between a 6,300x bandwidth ratio and a claimed 5x speed-up says the wafer's per-token
    latency is set by something else (compute at batch 1, the wafer fabric, several wafers for a
    model larger than 44 GB).
    """
    c = get_cited_chip(chip)
    g = get_gpu(gpu)
    weights = weight_bytes(model).total
    return {
        "chip": c.name,
        "label": "cited data point (vendor figures + the talk's claims), not a catalog GPU",
        "source": c.source,
        "talk_claims": c.talk_claims,
        "claimed_speedup": c.claimed_speedup(),
        "bandwidth_ratio": c.bandwidth_ratio_vs(g.name),
        "bandwidth_ratio_claimed": c.talk_claims.get("bandwidth_vs_h100_hbm"),
        "model": model,
        "weight_bytes": weights,
        "chips_to_hold_weights": -(-weights // int(c.on_chip_memory_gb * 1e9)),
        "batch1_bound_tokens_per_s": {
            c.name: c.bandwidth_Bps / weights,
            g.name: g.bandwidth_Bps / weights,
        },
    }
