"""Part 2's findings in words (``scaling``): sublinear TP, a small model, replicas, fast mode and the quote, each with its table."""

from __future__ import annotations

from typing import Any

from ...analysis.capacity import ENERGY_ASSUMPTION
from ...analysis.parallel import FrontierPoint, Layout, LayoutStep, predict_layout_decode
from .scaling import (
    LAYOUT_LESSON,
    SCALING_LESSON,
    SMALL_MODEL_LESSON,
    ScalingResult,
    lesson_columns,
    scaling_tables,
)
from .scenario import TALK_FAST_MODE_COMPUTE, TALK_FAST_MODE_SPEEDUP, TALK_TP_SPEEDUP_AT_4


def _layout_step(model: str, p: FrontierPoint) -> LayoutStep:
    """The predicted decode step behind a frontier point (the frontier's own inputs: one TP group, bf16)."""
    return predict_layout_decode(model, p.gpu, Layout(tp=p.tp, dp=p.replicas), p.batch, p.context)


def _by_batch(points: list[FrontierPoint], tp: int) -> dict[int, FrontierPoint]:
    return {p.batch: p for p in points if p.tp == tp}


def allreduce_reason_text(wide: LayoutStep, narrow: LayoutStep) -> str:
    """Where two TP groups' GPU time per step goes at the same batch, from their layout steps
    (:func:`infer_lab.analysis.parallel.predict_layout_decode`): how many all-reduces each makes, how long
    they take per step, and the GPU time (GPUs x seconds) in all-reduces and in compute."""
    w_name, n_name = wide.layout.label, narrow.layout.label
    tw, tn = wide.layout.tp, narrow.layout.tp

    def gpu_ms(tp: int, seconds: float) -> float:
        return tp * seconds * 1e3

    def compare(a: float, b: float) -> str:
        return "the same" if abs(a - b) <= 0.01 * max(a, b) else ("more" if a > b else "less")

    count = (f"Both make the same {wide.allreduce_count} all-reduces per step"
             if wide.allreduce_count == narrow.allreduce_count else
             f"{w_name} makes {wide.allreduce_count} all-reduces per step against {narrow.allreduce_count} for "
             f"{n_name}")
    ar_w, ar_n = gpu_ms(tw, wide.allreduce_s), gpu_ms(tn, narrow.allreduce_s)
    c_w, c_n = gpu_ms(tw, wide.compute_s), gpu_ms(tn, narrow.compute_s)
    return (f"{count}; at batch {wide.batch} they take {wide.allreduce_s * 1e3:.2f} ms of each {w_name} step "
            f"against {narrow.allreduce_s * 1e3:.2f} ms of each {n_name} step, with all {tw} GPUs waiting on them "
            f"against {tn}. Per step that is {compare(ar_w, ar_n)} GPU time in all-reduces ({ar_w:.1f} GPU-ms "
            f"against {ar_n:.1f}) and {compare(c_w, c_n)} in compute ({c_w:.1f} against {c_n:.1f}).")


def fixed_batch_text(points: list[FrontierPoint], model: str | None = None) -> str:
    """The widest TP group against the next narrower one at the same batch per group, in words: which
    is dearer per token (tokens/s per GPU, hence J and $ per token) at the batches both run, and,
    when the widest group alone makes the frontier, the point of the narrower one it beats on both.
    With ``model`` (the frontier's), why, at the smallest batch both run: :func:`allreduce_reason_text`
    of the two layouts' predicted decode steps."""
    tps = sorted({p.tp for p in points})
    if len(tps) < 2:
        return ""
    wide, narrow = _by_batch(points, tps[-1]), _by_batch(points, tps[-2])
    shared = sorted(set(wide) & set(narrow))
    if not shared:
        return ""
    dearer = [b for b in shared if wide[b].tokens_per_s_per_gpu < narrow[b].tokens_per_s_per_gpu]
    w_name, n_name = wide[shared[0]].layout, narrow[shared[0]].layout

    def pair(b: int) -> str:
        w, n = wide[b], narrow[b]
        return (f"at batch {b} it costs {w.joules_per_token:.1f} J/token against {n.joules_per_token:.1f} "
                f"({w.tokens_per_s_per_gpu:,.1f} vs {n.tokens_per_s_per_gpu:,.1f} tok/s per GPU)")

    ends = pair(shared[0]) + (f", and {pair(shared[-1])}" if len(shared) > 1 else "")
    if len(dearer) == len(shared):
        verdict = (f"At a fixed batch per TP group the widest group, {w_name}, is the **dearer** per token at every "
                   f"batch both run: against {n_name}, {ends}.")
    elif not dearer:
        verdict = (f"At a fixed batch per TP group the widest group, {w_name}, is the **cheaper** per token at every "
                   f"batch both run: against {n_name}, {ends}.")
    else:
        cheaper = [b for b in shared if b not in dearer]
        verdict = (f"At a fixed batch per TP group the widest group, {w_name}, is the dearer per token at batch "
                   f"{', '.join(map(str, dearer))} and the cheaper at batch {', '.join(map(str, cheaper))} against "
                   f"{n_name}: {ends}.")
    if model is not None:
        verdict += " " + allreduce_reason_text(*(_layout_step(model, side[shared[0]]) for side in (wide, narrow)))
    front = [p for p in points if p.on_frontier]
    if not front or any(p.tp != tps[-1] for p in front):
        return verdict
    best = max(narrow.values(), key=lambda p: p.tokens_per_s_per_gpu)
    beats = [p for p in front if p.tokens_per_s_per_user >= best.tokens_per_s_per_user
             and p.tokens_per_s_per_gpu >= best.tokens_per_s_per_gpu]
    if not beats:
        return verdict
    win = max(beats, key=lambda p: p.tokens_per_s_per_gpu)
    return (verdict + f" It still makes the whole frontier because it fits bigger batches: up to {max(wide)} users "
            f"per group against {max(narrow)} for {n_name}, whose most economical point (batch {best.batch}: "
            f"{best.tokens_per_s_per_user:.1f} tok/s per user, {best.tokens_per_s_per_gpu:,.0f} tok/s per GPU) is "
            f"beaten on both by {w_name} at batch {win.batch} ({win.tokens_per_s_per_user:.1f} and "
            f"{win.tokens_per_s_per_gpu:,.0f}).")


def scaling_text(s: ScalingResult) -> str:
    """Part 2's findings, every number from ``s``."""
    return "\n\n".join(scaling_paragraphs(s).values())


def scaling_paragraphs(s: ScalingResult) -> dict[str, str]:
    """Part 2's findings, one paragraph each: 'sublinear', 'small', then 'replicas', 'fast' and
    'quote' when the layouts and the frontier allow them."""
    sxm1, sxm4, sxm8 = s.row("H100-SXM", 1), s.row("H100-SXM", 4), s.row("H100-SXM", 8)
    pcie4 = s.row("H100-PCIe", 4)
    small1, small2 = s.small_model_rows[0], s.small_model_rows[1]
    pcie = {r.parallelism: r for r in s.layouts if r.gpu == "H100-PCIe"}
    nvl = {r.parallelism: r for r in s.layouts if r.gpu == "H100-SXM"}
    lines = {}
    lines["sublinear"], lines["small"] = (
        f"**Sublinear:** {s.model} at {s.batch} users x {s.context:,} tokens on H100 SXM: ITL "
        f"{sxm1.itl_ms:.1f} ms at TP1{'' if sxm1.fits else ' (a reference: it does not fit one GPU)'}, "
        f"{sxm4.itl_ms:.1f} ms at TP4 "
        f"({sxm4.speedup_vs_tp1:.2f}x for 4x the GPUs; all-reduces are {sxm4.allreduce_share:.0%} of the step), "
        f"{sxm8.itl_ms:.1f} ms at TP8 ({sxm8.speedup_vs_tp1:.2f}x). On PCIe TP4 gives {pcie4.speedup_vs_tp1:.2f}x. "
        f"A public talk on inference reported that 4x GPUs gave about {TALK_TP_SPEEDUP_AT_4:.0f}x the speed: this model is more optimistic, because "
        "it assumes every GPU runs at its roofline and NCCL's best latencies; real kernels at small per-GPU "
        "batches lose more.",
        f"**A small model {'is slower' if small2.itl_ms > small1.itl_ms else 'gains little'} with TP:** "
        f"{s.small_model} at batch {s.small_batch} x {s.small_context} tokens on H100 SXM: "
        f"{small1.itl_ms * 1e3:.0f} µs at TP1, {small2.itl_ms * 1e3:.0f} µs at TP2, of which "
        f"{small2.allreduce_ms * 1e3:.0f} µs are its {s.small_allreduces} all-reduces: per-call latency, not "
        "bandwidth, sets their cost, the same tax part 1 measured on this CPU.",
    )
    if "DP4" in pcie and "TP4" in pcie and "TP4" in nvl and "DP4" in nvl:
        best_pcie = max(pcie.values(), key=lambda r: r.tokens_per_s)
        best_nvl = max(nvl.values(), key=lambda r: r.tokens_per_s)
        lines["replicas"] = (
            f"**PCIe: replicas beat pure TP.** {s.layouts_model} on 4 x H100 PCIe within {s.itl_slo_ms:.0f} ms ITL: "
            f"DP4 serves {pcie['DP4'].tokens_per_s:,.0f} output tok/s, TP4 {pcie['TP4'].tokens_per_s:,.0f} "
            f"(its all-reduces: {pcie['TP4'].allreduce_ms_per_step:.1f} ms per step). On NVLink TP4 serves "
            f"{nvl['TP4'].tokens_per_s:,.0f} vs DP4 {nvl['DP4'].tokens_per_s:,.0f}. Neither extreme is the best "
            f"layout, though: the most output tokens/s on PCIe come from **{best_pcie.parallelism}** "
            f"({best_pcie.tokens_per_s:,.0f} tok/s) and on NVLink from **{best_nvl.parallelism}** "
            f"({best_nvl.tokens_per_s:,.0f} tok/s): a little TP for the memory, replicas for the rest (the table "
            "has every layout)."
        )
    if s.fast is not None:
        f = s.fast
        lines["fast"] = (
            "**Fast mode, computed:** a fast mode sells each user more speed at a higher GPU cost per token (a "
            f"public talk on inference described one spending what seems to be about {TALK_FAST_MODE_COMPUTE:.0f}x the "
            "tokens (read as a price) for about "
            f"{TALK_FAST_MODE_SPEEDUP:.0f}x the speed; how this model compares is below). "
            f"From the most economical frontier point within 50 ms ITL "
            f"({f.baseline.layout}, batch {f.baseline.batch}, {f.baseline.tokens_per_s_per_user:.0f} tok/s per user), "
            f"the cheapest point at least {TALK_FAST_MODE_SPEEDUP:.0f}x faster per user is {f.fast.layout} at batch "
            f"{f.fast.batch}: **{f.speedup:.2f}x the speed for {f.compute_ratio:.2f}x the GPU time per token** "
            f"(energy {f.fast.joules_per_token / f.baseline.joules_per_token:.2f}x, $ per million tokens "
            f"{f.fast.usd_per_m_tokens:.2f} vs {f.baseline.usd_per_m_tokens:.2f}). {ENERGY_ASSUMPTION}"
        )
        t = s.at_talk_compute
        reach = (f"the model reaches {TALK_FAST_MODE_COMPUTE:.0f}x the GPU time per token (the quote's ratio, read "
                 f"as cost) only at {t.speedup:.2f}x speed "
                 f"({t.layout}, batch {t.batch})" if t else
                 f"no point on this frontier costs {TALK_FAST_MODE_COMPUTE:.0f}x the GPU time per token")
        on_frontier = sorted({p.layout for p in s.frontier if p.on_frontier})
        how = ("the same layout at a smaller batch" if f.fast.layout == f.baseline.layout
               else f"{f.fast.layout} instead of {f.baseline.layout}, at batch {f.fast.batch}")
        lines["quote"] = (
            f"**What the model shows, and where it differs from the quote:** a public talk on inference described a provider's \"fast mode\" that spends what seems to be about "
            f"{TALK_FAST_MODE_COMPUTE:.0f}x as many tokens per token as the regular mode for about "
            f"{TALK_FAST_MODE_SPEEDUP:.0f}x the speed (read as a price ratio), with no mechanism named beyond sitting at the "
            f"fast end of the frontier. This model's frontier is made of {', '.join(on_frontier)} only. "
            + "".join(t + " " for t in [fixed_batch_text(s.frontier, s.model)] if t)
            + "The model's fast point is "
            f"**{how}**: speed bought mostly by serving fewer users at once, and {reach}. What is real in both: speed "
            "per user costs GPU time per token, at an increasing rate. What the model leaves out, and a product pays: "
            "kernels far from the roofline at batch 1-8, all-reduce latencies worse than NCCL's best, a tail-latency "
            "SLO. The quote does not say which model, GPU or batch it meant; read its "
            f"{TALK_FAST_MODE_COMPUTE:.0f}x as a claim about one product."
        )
    return lines


SCALING_FINDINGS = {"sublinear": SCALING_LESSON, "small": SMALL_MODEL_LESSON, "replicas": LAYOUT_LESSON,
                    "fast": None}  # in the order of scaling_tables; None: the figure is the lesson


def scaling_finding(s: ScalingResult, key: str) -> tuple[str, Any, str, Any]:
    """One of part 2's findings as the page shows it: (its paragraph, its table with only the
    columns it reads or None, the full table's title, the full table)."""
    if key not in SCALING_FINDINGS:
        raise ValueError(f"key must be one of {', '.join(SCALING_FINDINGS)}, got {key!r}")
    title, full = list(scaling_tables(s).items())[list(SCALING_FINDINGS).index(key)]
    columns = SCALING_FINDINGS[key]
    return (scaling_paragraphs(s).get(key, ""), lesson_columns(full, columns) if columns else None, title, full)
