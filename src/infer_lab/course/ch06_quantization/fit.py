"""Chapter 06's analytic part: which big model fits one GPU in which format, and the formats' byte counts in words."""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis import memory as kv_memory
from ...catalog import get_gpu, list_gpus
from ...quant.formats import NF4_FORMAT
from ...units import fmt_bytes
from ..chapter import chapter_number
from ..tables import Column, people_table
from .scenario import part_number

FIT_GPUS = ("H100-SXM", "H200", "A100-80GB", "L40S", "RTX-Pro-6000-Blackwell")
FIT_MODELS = ("gpt-oss-120b", "llama-3-70b", "mistral-7b")
FIT_DTYPES = ("bf16", "fp8", "int8", "int4", "mxfp4")


@dataclass(frozen=True)
class FitRow:
    """Weights of one model in one format, and the users of ``context`` tokens one GPU holds beside them."""

    model: str
    weight_dtype: str
    weight_bytes: int
    max_users: dict[str, int]  # GPU name -> users (0: the weights leave no room for one user)


def fit_rows(gpus: tuple[str, ...] = FIT_GPUS, models: tuple[str, ...] = FIT_MODELS,
             dtypes: tuple[str, ...] = FIT_DTYPES, context: int = 4096) -> list[FitRow]:
    """Weight bytes per format (analytic) and max concurrent users on each one GPU."""
    known = [g for g in gpus if g in set(list_gpus())]
    rows = []
    for model in models:
        for dtype in dtypes:
            users = {}
            for gpu in known:
                report = kv_memory.fit(model, get_gpu(gpu).memory_bytes, context, weight_dtype=dtype)
                users[gpu] = report.max_users if report.kv_budget_bytes > 0 else 0
            rows.append(FitRow(model, dtype, kv_memory.weight_bytes(model, dtype).total, users))
    return rows


def fit_table(rows: list[FitRow] | None = None, context: int = 4096):
    rows = rows if rows is not None else fit_rows(context=context)
    gpus = list(rows[0].max_users)
    flat = [{"model": r.model, "weight_dtype": r.weight_dtype, "weight_bytes": r.weight_bytes, **r.max_users}
            for r in rows]
    return people_table(flat, [Column("model", "model", "text"), Column("weight_dtype", "weights in", "text"),
                               Column("weight_bytes", "weights", "bytes")]
                        + [Column(g, f"users of {context:,} tokens on one {g}", "int") for g in gpus])


def gpt_oss_text(dtypes: tuple[str, ...] = FIT_DTYPES, context: int = 4096) -> str:
    """Which of the table's formats leave room on one H100 for GPT-OSS-120B's KV (the same fit as the table)."""
    sizes_text = ", ".join(f"{fmt_bytes(kv_memory.weight_bytes('gpt-oss-120b', d).total)} in {d}" for d in dtypes)
    spec = get_gpu("H100-SXM")
    h100, gpu_size = spec.memory_bytes, f"{spec.memory_gib:g} GiB"
    reports = {d: kv_memory.fit("gpt-oss-120b", h100, context, weight_dtype=d) for d in dtypes}
    fits = [f"{d} ({r.max_users:,} users of {context:,} tokens)" for d, r in reports.items() if r.kv_budget_bytes > 0]
    why = (" " + shipped_format_text("gpt-oss-120b", "mxfp4", "int4")) if {"mxfp4", "int4"} <= set(dtypes) else ""
    return (f"GPT-OSS-120B's weights: {sizes_text}.{why} On one H100 ({gpu_size}) only the 4-bit formats leave "
            f"room for KV: {', '.join(fits) or 'none'}. OpenAI ships it in mxfp4, which is why it runs on one "
            f"{gpu_size} GPU." if fits and all(kv_memory.weight_format(d).bits <= 4.5 for d, r in reports.items()
                                                if r.kv_budget_bytes > 0)
            else f"GPT-OSS-120B's weights: {sizes_text}.{why} On one H100 ({gpu_size}) these leave room for KV: "
                 f"{', '.join(fits) or 'none'}.")


def shipped_format_text(model: kv_memory.ModelLike, shipped: str, other: str) -> str:
    """Why ``model``'s weights in its ``shipped`` format (as released: the config's ``quantization_config``)
    are larger or smaller than in ``other`` applied to every matmul: bits per weight, and the modules the
    released checkpoint leaves in 16 bits (``modules_to_not_convert``)."""
    a, b = kv_memory.weight_bytes(model, shipped), kv_memory.weight_bytes(model, other)
    format_a, format_b = kv_memory.weight_format(shipped), kv_memory.weight_format(other)
    bits_a, bits_b = format_a.bits_per_element, format_b.bits_per_element
    order = "larger" if a.total > b.total else "smaller"
    both = f" although both store {format_a.bits}-bit codes" if format_a.bits == format_b.bits else ""
    bits = f"{shipped} stores {bits_a:g} bits per weight, {other} {bits_b:g}"
    if not a.kept_modules:
        return f"{shipped} is {order} than {other}: {bits}, over the same weights."
    kept = ", ".join(f"`{m}`" for m in a.kept_modules)
    return (f"{shipped} is {order} than {other}{both}: {bits}, and the {shipped} row counts "
            f"the checkpoint as released, whose config keeps {kept} out of {shipped} (`modules_to_not_convert`): "
            f"{fmt_bytes(a.other_bytes)} stay in bf16 against {fmt_bytes(b.other_bytes)} in the {other} row, which "
            "quantizes every decoder matmul.")


def scale_schemes_text(model: str = "mistral-7b") -> str:
    """Why the planner's int8/fp8 bytes (chapter 03) differ from this chapter's kernels, computed.

    The planner counts int8 with one fp16 scale per 128 weights and fp8 with one scale per tensor;
    :mod:`infer_lab.quant` stores one scale per output row for both. Per row means one scale per
    ``hidden_size`` weights for most matmuls, so it is approximated here with that group size.
    """
    shape = kv_memory.as_shape(model)
    planner_int8 = kv_memory.weight_bytes(shape, "int8").total
    planner_fp8 = kv_memory.weight_bytes(shape, "fp8").total
    per_row = kv_memory.weight_bytes(shape, "int8", group_size=shape.hidden).total
    return (
        f"**Two scale schemes, two byte counts.** The memory equation of chapter {chapter_number('memory_equation')} "
        f"(which the capacity planner of chapter {chapter_number('capacity_planner')} uses) counts int8 with one fp16 "
        f"scale per 128 weights and fp8 with one scale per tensor; the kernels here keep one scale per output row "
        f"for both. For {model}: int8 weights are {planner_int8 / 1e9:.3f} GB in the planner's scheme and "
        f"{per_row / 1e9:.3f} GB with a scale per row of {shape.hidden:,} weights (the int8 and fp8 "
        f"kernels here); fp8 with one scale per tensor is {planner_fp8 / 1e9:.3f} GB. The scheme moves the bytes "
        f"by {abs(planner_int8 - per_row) / per_row:.1%}: the planner's answers hold for either. What the scheme "
        "changes is quality (a finer scale follows an outlier), which this chapter measures."
    )


def nf4_scheme_text(model: str = "mistral-7b") -> str:
    """NF4's one definition, shared by the memory equation (chapter 03) and this chapter's quantizer.

    Both read :data:`infer_lab.quant.formats.NF4_FORMAT` (the planner's ``WEIGHT_FORMATS['nf4']``):
    4-bit codes plus one absmax per group, stored as bitsandbytes stores it without double
    quantization, which is how this course's bitsandbytes run loads it (``quant/bnb.py``).
    """
    fmt = NF4_FORMAT
    nf4 = kv_memory.weight_bytes(model, "nf4").total
    return (f"**NF4 is one format in both chapters:** {fmt.bits}-bit codes plus one {fmt.scale_bits}-bit absmax per "
            f"{fmt.group_size} weights, {fmt.bits_per_element:g} bits per weight, as bitsandbytes stores it without "
            f"double quantization (the setting of this course's bitsandbytes run); {model}'s weights in NF4 are "
            f"{nf4 / 1e9:.2f} GB in chapter {chapter_number('memory_equation')}'s table, and the NF4 rows of part "
            f"{part_number('formats')} count the same bits.")


def qat_vs_ptq_text() -> str:
    """Post-training quantization (what this chapter does) against quantization-aware training."""
    return (
        "**After training, or during it.** Everything measured here is *post-training quantization* (PTQ): take "
        "finished weights, round them, and measure what the rounding cost. It needs no training data beyond a "
        "little calibration text, and its quality loss is whatever the rounding does. *Quantization-aware "
        "training* (QAT) rounds during training instead: the forward pass uses the quantized weights and the "
        "gradients flow through the rounding (a straight-through estimator), so the model learns weights that "
        "survive it. QAT costs a training run and recovers much of what PTQ loses at 4 bits and below; a model "
        "shipped in a low-bit format by its trainer (gpt-oss in mxfp4 is one) was usually trained or fine-tuned "
        "with that format in mind, which is why it loses less than the same rounding applied afterwards. Nothing "
        "is trained in this course, so its quality numbers are PTQ's."
    )
