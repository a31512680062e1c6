"""Section 2 of chapter 15: heterogeneous hardware, the cited wafer-scale data point and the attention/FFN split."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...catalog import get_cited_chip, get_cited_system_claim, get_gpu
from ...cluster import hetero
from ...cluster.attention_ffn import AFDPoint
from ...cluster.hetero import PhaseFitness
from ...cluster.report import ClusterReport
from ...units import fmt_bytes, human
from ..notebook_code import notebook_function
from ..tables import Column
from .cluster import ModeRow, _mode_row
from .scenario import (
    AFD_CONTEXT,
    AFD_GPU,
    AFD_GPUS,
    AFD_MODEL,
    HETERO_GPUS,
    HETERO_SPLIT,
    NUMBER,
    SERVING_SLO,
)

if TYPE_CHECKING:
    from .scenario import Sizes


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
