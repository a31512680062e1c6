"""Chapter 06, "Quantization": fewer bytes per weight, and the quality price measured on real weights.

1. Formats: every linear layer quantized with each format, its reconstruction error measured.
   The embedded model's "fp32" weights were dequantized from a Q4_1 GGUF, so re-quantizing to
   Q4_1 with the same groups of 32 gives them back exactly: the baseline is already 4-bit.
2. Methods side by side: exact weight bytes, decode speed, perplexity and top-1 agreement.
3. Outlier features in the activations: why one scale per row fails (LLM.int8's motivation).
4. KV-cache quantization: int8 / fp8 with one scale per token per head.

Analytic and saved parts need no button: which big model fits one GPU in which format (the
memory model), and bitsandbytes on an H200 (saved): int8 reads half the bytes of bf16 and is
slower. The quantizers themselves are library code in :mod:`infer_lab.quant`.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/06_quantization.py`` (``layer_errors``, ``quantize_and_compare``,
``outlier_features``, ``kv_cache_quality``) that call :mod:`infer_lab.quant` directly. This module
sizes them, turns what they return into typed results, figures, tables and words, and runs the
very same functions for the tour, the tests and the Jupyter edition (``run_*``, through
:mod:`infer_lab.course.notebook_code`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis import memory as kv_memory
from ..attention.quality import VariantQuality
from ..catalog import get_gpu, list_gpus
from ..figures import finish
from ..models import EMBEDDED_GGUF
from ..quant.formats import INT8_MAX, NF4_FORMAT, quantize_q4_1
from ..quant.kv_formats import KV_DTYPES
from ..units import MB, count, fmt_bytes, human
from .chapter import NO_MODEL, ChapterResult, chapter_number, choose_size, run_parts
from .library_code import code_block
from .notebook_code import notebook_function
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "06"
SLUG = "quantization"
TITLE = "06 · Quantization: fewer bytes per weight, checked on real weights"
NEEDS_MODEL = True
PARTS = {
    "formats": "Quantize every layer and measure the error",
    "compare": "Quantize the model: bytes, speed, quality",
    "outliers": "Find the outlier features",
    "kv": "Measure KV-cache quantization",
}
ORIGIN_GROUP = 32  # Q4_1's block: 32 weights share one fp16 scale and one fp16 minimum
ALL_METHODS = ("int8", "fp8", "int4-g128", "int4-g64", "int4-g128-sym", "nf4", "q4_1")


@dataclass(frozen=True)
class Sizes:
    """What each part measures: methods, evaluation tokens, decode timing, layers checked."""

    size: str
    methods: tuple[str, ...]  # side by side in "compare"
    format_methods: tuple[str, ...]  # per-layer errors in "formats"
    format_block_stride: int  # check every n-th decoder block (1 = all)
    eval_tokens: int  # of the evaluation text, scored for perplexity
    eval_window: int
    prompt_tokens: int  # per held-out prompt, for top-1 agreement
    new_tokens: int  # decode timing
    repeats: int
    kv_eval_tokens: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: three methods on 128 tokens, seconds a part on 2 cores; ``full``: every method."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    formats = ("q4_1-g32", "int4-g32", "int4-g64", "nf4-g64", "int8")
    if size == "quick":
        return Sizes(size, methods=("int8", "q4_1", "int4-g64"), format_methods=formats, format_block_stride=10,
                     eval_tokens=128, eval_window=128, prompt_tokens=16, new_tokens=2, repeats=1,
                     kv_eval_tokens=128)
    methods = ALL_METHODS + (("bnb-int8", "bnb-nf4") if on_gpu and importlib.util.find_spec("bitsandbytes") else ())
    return Sizes(size, methods=methods, format_methods=formats + ("int4-g128", "fp8"), format_block_stride=1,
                 eval_tokens=2048, eval_window=256, prompt_tokens=96, new_tokens=32, repeats=5,
                 kv_eval_tokens=1024)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class LayerError:
    """One linear layer quantized with one method: stored bytes and reconstruction error."""

    method: str
    layer: str
    weights: int  # out_features x in_features
    stored_bytes: int  # codes + scales (+ zero points or minimums)
    rel_fro: float  # ||W - Ŵ|| / ||W||
    max_abs: float


@dataclass(frozen=True)
class FormatSummary:
    """One method over all checked layers."""

    method: str
    layers: int
    bits_per_weight: float  # stored bits / weights, scales included
    rel_error_mean: float
    rel_error_max: float
    max_abs: float
    exact_layers: int  # layers reconstructed bit for bit


@dataclass(frozen=True)
class FormatsResult:
    layers: list[LayerError]
    blocks_checked: list[int]
    n_blocks: int
    embedded: bool  # the weights are the embedded model's (dequantized from Q4_1)

    def summary(self) -> list[FormatSummary]:
        out = []
        for method in dict.fromkeys(r.method for r in self.layers):
            rows = [r for r in self.layers if r.method == method]
            out.append(FormatSummary(
                method, len(rows), 8 * sum(r.stored_bytes for r in rows) / sum(r.weights for r in rows),
                sum(r.rel_fro for r in rows) / len(rows), max(r.rel_fro for r in rows),
                max(r.max_abs for r in rows), sum(r.max_abs == 0 for r in rows)))
        return out

    def by_method(self) -> dict[str, FormatSummary]:
        return {s.method: s for s in self.summary()}


@dataclass(frozen=True)
class MethodRow:
    """One model (the baseline or a quantized copy) on every axis; ``None`` where not measured."""

    method: str
    weight_bytes: int
    compression: float  # baseline bytes / these bytes
    top1_agreement: float  # share of next tokens equal to the baseline's
    decode_tokens_per_s: float | None
    perplexity: float | None
    perplexity_change: float | None  # relative to the baseline
    layer_rel_error_mean: float | None
    decode_kernel: str | None = None  # what multiplied during the decode timing


@dataclass(frozen=True)
class Comparison:
    baseline: MethodRow
    methods: list[MethodRow]
    eval_scored_tokens: int | None
    prompt_tokens: int
    new_tokens: int
    repeats: int
    threads: int
    device: str

    @property
    def rows(self) -> list[MethodRow]:
        return [self.baseline, *self.methods]


@dataclass(frozen=True)
class OutlierRow:
    """The largest input feature of one linear layer, against the median feature (one forward pass)."""

    layer: str
    top_feature: int
    top_absmax: float
    median_absmax: float
    max_over_median: float


@dataclass(frozen=True)
class KVResult:
    rows: list[VariantQuality]
    eval_tokens: int
    skipped: str = ""  # why nothing was measured (random weights have no text to score)
    baseline_dtype: str = ""  # the dtype of the unrounded cache (the model's own), e.g. "fp32"


@dataclass
class Result(ChapterResult):
    """Chapter 06's measurements; a part not run is ``None``."""

    model: str = ""
    embedded: bool = False
    formats: FormatsResult | None = None
    compare: Comparison | None = None
    outliers: list[OutlierRow] | None = None
    kv: KVResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# Running the notebook's experiments (the code is in infer_lab/notebooks/06_quantization.py)

FORMAT_GROUP = 64  # weights per scale of the 4-bit rows; the notebook's formats cell starts at the same number
OUTLIER_PROMPT = "Explain what a KV cache is."
OUTLIER_LAYER = "q_proj"


def formats_result(lm: Any, errors: dict[str, dict[int, list[dict[str, Any]]]]) -> FormatsResult:
    """The notebook's ``layer_errors`` (method -> block -> per-layer stats) as a typed result."""
    rows = [LayerError(method, f"layers.{index}.{r['layer']}", r["out_features"] * r["in_features"],
                       r["bytes_after"], r["rel_fro"], r["max_abs"])
            for method, blocks in errors.items() for index, stats in blocks.items() for r in stats]
    checked = list(next(iter(errors.values()))) if errors else []
    return FormatsResult(rows, checked, len(lm.model.model.layers), lm.source == "embedded")


def run_formats(lm: Any, sizes: Sizes) -> FormatsResult:
    """Run the notebook's own ``layer_errors`` with this size's formats."""
    layer_errors = notebook_function(NUMBER, "layer_errors")
    return formats_result(lm, layer_errors(lm, sizes.format_methods, block_stride=sizes.format_block_stride))


def _method_row(row: dict[str, Any]) -> MethodRow:
    return MethodRow(row["method"], row["weight_bytes"], row.get("compression", 1.0), row["top1_agreement"],
                     row.get("decode_tokens_per_s"), row.get("perplexity"), row.get("perplexity_change"),
                     row.get("layer_rel_error_mean"), row.get("decode_kernel"))


def comparison_result(lm: Any, result: dict[str, Any], prompt_tokens: int, new_tokens: int,
                      repeats: int) -> Comparison:
    """The notebook's ``quantize_and_compare`` (``quant.compare_methods``'s dict) as a typed result."""
    base = result["baseline"]
    return Comparison(_method_row(base), [_method_row(r) for r in result["methods"]],
                      base.get("eval_scored_tokens"), prompt_tokens, new_tokens, repeats,
                      torch.get_num_threads(), lm.describe())


def run_compare(lm: Any, sizes: Sizes, methods: tuple[str, ...] | list[str] | None = None) -> Comparison:
    """Run the notebook's own ``quantize_and_compare`` with this size's methods."""
    experiment = notebook_function(NUMBER, "quantize_and_compare")
    raw = experiment(lm, tuple(methods or sizes.methods), eval_tokens=sizes.eval_tokens,
                     prompt_tokens=sizes.prompt_tokens, new_tokens=sizes.new_tokens, repeats=sizes.repeats)
    return comparison_result(lm, raw, sizes.prompt_tokens, sizes.new_tokens, sizes.repeats)


def outlier_rows(rows: list[dict[str, Any]]) -> list[OutlierRow]:
    """The notebook's ``outlier_features`` (``quant.linear_input_outliers``) as typed rows."""
    return [OutlierRow(r["layer"], r["top_features"][0], r["top_absmax"][0], r["median_feature_absmax"],
                       r["max_over_median"]) for r in rows]


def run_outliers(lm: Any, sizes: Sizes) -> list[OutlierRow]:
    """Run the notebook's own ``outlier_features`` on the chapter's prompt and layers."""
    return outlier_rows(notebook_function(NUMBER, "outlier_features")(lm, OUTLIER_PROMPT, OUTLIER_LAYER))


def kv_result(lm: Any, rows: list[VariantQuality], eval_tokens: int) -> KVResult:
    """The notebook's ``kv_cache_quality`` rows as a result (random weights: why nothing was measured)."""
    if not rows:
        return KVResult([], 0, skipped=f"{lm.name} has random weights: there is no text quality to measure")
    return KVResult(rows, eval_tokens, baseline_dtype=dtype_label(lm.dtype))


def run_kv(lm: Any, sizes: Sizes) -> KVResult:
    """Run the notebook's own ``kv_cache_quality`` at this size."""
    rows = notebook_function(NUMBER, "kv_cache_quality")(lm, sizes.kv_eval_tokens, KV_DTYPES)
    return kv_result(lm, rows, sizes.kv_eval_tokens)


def group_quantize_code() -> str:
    """The group-wise 4-bit quantizer the engine's int4 path uses (GGUF's Q4_1), as the page shows it."""
    return code_block(quantize_q4_1)


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def dtype_label(dtype: Any) -> str:
    """'fp32', 'bf16' or 'fp16' for a torch dtype (its torch name otherwise)."""
    name = str(dtype).replace("torch.", "")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name, name)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL, embedded=lm is not None and lm.source == "embedded")
    return run_parts(result, parts, PARTS, {
        "formats": lambda: run_formats(lm, sizes),
        "compare": lambda: run_compare(lm, sizes),
        "outliers": lambda: run_outliers(lm, sizes),
        "kv": lambda: run_kv(lm, sizes),
    })


# ---------------------------------------------------------------------------------------------
# The baseline is already 4-bit


def baseline_note(embedded: bool, formats: FormatsResult | None = None) -> str:
    """What the "fp32" baseline really is; with a formats result, the measured proof."""
    if not embedded:
        return ""
    text = (
        f"**The baseline is already 4-bit.** The embedded model's fp32 weights were dequantized from "
        f"`{EMBEDDED_GGUF}`: every linear layer was stored as Q4_1 (4-bit codes, an fp16 scale and an fp16 "
        f"minimum per group of {ORIGIN_GROUP} weights). Every int4 / NF4 quality number in this course is "
        "measured against a model that has already paid one 4-bit rounding, so it shows the cost of a "
        "*second* rounding onto another grid, not of quantizing a full-precision model."
    )
    proof = baseline_proof(formats) if formats else ""
    return text + (" " + proof if proof else "")


def baseline_proof(formats: FormatsResult) -> str:
    """The measured proof that the embedded baseline is Q4_1 ('' without that format): shown under
    the formats part, once, while the note itself stands once at the top of the notebook."""
    origin = formats.by_method().get(f"q4_1-g{ORIGIN_GROUP}")
    if not (formats.embedded and origin):
        return ""
    others = [s for s in formats.summary() if s.method != origin.method and s.bits_per_weight < 8]
    worst = ", ".join(f"{s.method} {100 * s.rel_error_mean:.1f}%" for s in others)
    return (
        f"Measured proof that the baseline is already 4-bit: re-quantized to Q4_1 with groups of {ORIGIN_GROUP}, "
        f"{origin.exact_layers} of {origin.layers} checked layers come back bit for bit (largest error "
        f"{human(origin.max_abs)}); the other 4-bit grids move the same weights by {worst} (mean relative "
        "error per layer)."
    )


# ---------------------------------------------------------------------------------------------
# Words


def formats_text(formats: FormatsResult) -> str:
    summary = formats.summary()
    best = min((s for s in summary if s.exact_layers < s.layers), key=lambda s: s.rel_error_mean)
    lines = [
        f"Checked {summary[0].layers} linear layers (blocks {', '.join(map(str, formats.blocks_checked))} of "
        f"{formats.n_blocks}) per format. Smallest error of a format that changes the weights: "
        f"**{best.method}**, {100 * best.rel_error_mean:.2f}% mean relative error at "
        f"{best.bits_per_weight:.2f} bits per weight (scales included)."
    ]
    proof = baseline_proof(formats)
    return "\n\n".join(lines + ([proof] if proof else []))


def guess_text(comparison: Comparison, guess_pct: float | None) -> str:
    """The learner's guess (the first method's bytes as a % of the baseline's) beside the measured share."""
    if guess_pct is None or not comparison.methods:
        return ""
    first = comparison.methods[0]
    share = 100 * first.weight_bytes / comparison.baseline.weight_bytes
    return (f"**Your guess:** {first.method} keeps {human(guess_pct)}% of the {comparison.baseline.method} bytes; "
            f"**measured: {share:.1f}%** ({fmt_bytes(first.weight_bytes)} of "
            f"{fmt_bytes(comparison.baseline.weight_bytes)}). ")


def compare_text(comparison: Comparison, embedded: bool, guess_pct: float | None = None) -> str:
    base = comparison.baseline
    parts = []
    for m in comparison.methods:
        line = f"**{m.method}**: {m.compression:.2f}× smaller ({fmt_bytes(m.weight_bytes)})"
        if m.perplexity_change is not None:
            line += f", perplexity {100 * m.perplexity_change:+.1f}%"
        line += f", {100 * m.top1_agreement:.0f}% of next tokens unchanged"
        if m.decode_tokens_per_s and base.decode_tokens_per_s:
            line += f", decode {m.decode_tokens_per_s / base.decode_tokens_per_s:.2f}× the baseline's tokens/s"
            if m.decode_kernel:
                line += f" ({m.decode_kernel})"
        parts.append(line)
    text = guess_text(comparison, guess_pct) + "; ".join(parts) + "."
    text += (f" Decode timed over {comparison.new_tokens} tokens × {comparison.repeats} run(s) on "
             f"{comparison.device}, {count(comparison.threads, 'torch thread')}, through transformers' generate. "
             "Quality is the readable reference's (dequantize, then multiply); the decode timing runs the "
             "same codes through a fused kernel that dequantizes inside the matmul (PyTorch's "
             "`_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu`, bf16 activations inside), so only the "
             "small codes cross the memory bus: decode streams every weight once per token, so fewer bytes "
             "decode faster. A method without such a kernel (NF4, fp8) is timed on the reference, which "
             "rebuilds the float matrix every call and is slower than not quantizing.")
    slower = [m for m in comparison.methods if m.decode_tokens_per_s and base.decode_tokens_per_s
              and m.compression > 1 and m.decode_tokens_per_s < base.decode_tokens_per_s]
    if slower:
        text += (" **Fewer bytes, yet slower:** " + ", ".join(
            f"{m.method} reads {m.compression:.2f}× fewer bytes and decodes at "
            f"{m.decode_tokens_per_s / base.decode_tokens_per_s:.2f}× the baseline's speed" for m in slower)
            + ". The chapter's premise, that the bytes of the weights set decode's speed limit, is a bound for a "
            "kernel that reads the packed weights directly. A path timed on the readable reference turns the packed "
            "weights back into floats on every step, which costs more work and memory traffic than the float read it "
            "replaces, so its time is the unpacking's, not the bytes'; a fused kernel (as int8 and int4 use here) is "
            "what turns fewer bytes into speed.")
    if comparison.new_tokens * comparison.repeats < 16:
        text += (f" Decode speed here comes from only {comparison.new_tokens * comparison.repeats} timed token(s): "
                 "read the ratios as rough.")
    if comparison.eval_scored_tokens:
        text += f" Perplexity over {comparison.eval_scored_tokens} scored tokens of the shipped evaluation text."
    if embedded:
        text += " All quality numbers are against the Q4_1-derived baseline (see above): int4 here is a second 4-bit rounding."
    return text


def median_feature_steps(max_over_median: float, levels: int = INT8_MAX) -> str:
    """What one int8 activation scale that reaches the largest feature leaves the median one, in words.

    The scale maps the largest |value| to ``levels`` steps, so the median feature, ``max_over_median``
    times smaller, gets ``levels / max_over_median`` of them; under half a step it rounds to zero.
    """
    steps = levels / max_over_median
    if steps < 0.5:
        return (f"{steps:.2f} of int8's {levels} steps on each side of zero, less than half a step: "
                "the median feature rounds to zero")
    return f"{steps:.1f} of int8's {levels} steps on each side of zero"


FROM_SCRATCH_PARTS = ("formats", "compare")  # the parts whose formats are this course's own (infer_lab.quant)


def part_number(key: str) -> int:
    """The 1-based number of part ``key`` on the page, in :data:`PARTS` order."""
    return list(PARTS).index(key) + 1


def weight_only_text() -> str:
    """What this chapter's formats quantize: the from-scratch ones only the weights; bitsandbytes' int8
    (``quant/bnb.py``, run on a GPU) is LLM.int8, which quantizes the activations too."""
    first, last = (part_number(k) for k in FROM_SCRATCH_PARTS)
    return (f"The from-scratch formats of parts {first}-{last} (`infer_lab.quant`) quantize **only the weights**: "
            "activations stay in float (dequantize, then multiply), so these outliers set none of their scales. "
            f"The `bnb-int8` that part {last} adds on a GPU (with bitsandbytes installed) is different: it is LLM.int8 "
            "itself, which "
            "quantizes the activations too and keeps their outlier feature columns in 16-bit")


def outliers_text(outliers: list[OutlierRow]) -> str:
    """The largest activation outlier measured, and what it would cost a per-token int8 activation scale.

    The from-scratch formats are weight-only, so the words say where these outliers matter instead:
    activation quantization (LLM.int8, which the GPU's ``bnb-int8`` runs; SmoothQuant) and the weights
    they multiply (AWQ).
    """
    worst = max(outliers, key=lambda r: r.max_over_median)
    share = sum(r.max_over_median >= 10 for r in outliers)
    kind = worst.layer.rsplit(".", 1)[-1]
    return (
        f"In `{worst.layer}` input feature {worst.top_feature} reaches {worst.top_absmax:.1f}, "
        f"**{worst.max_over_median:.0f}×** the median feature; {share} of {len(outliers)} `{kind}` layers have an "
        "input feature at least 10× their median. If the activations were quantized to int8 with one scale per "
        f"token, a scale that reaches that feature would leave the median one "
        f"{median_feature_steps(worst.max_over_median)}. {weight_only_text()}. The weight-only formats do not pay "
        "this cost; LLM.int8 (outlier features kept in 16-bit) and SmoothQuant (their scale moved into the "
        "weights) are how activation quantization avoids it, and it is why AWQ protects the weight columns these "
        "features multiply."
    )


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


def kv_text(kv: KVResult, embedded: bool) -> str:
    if kv.skipped:
        return kv.skipped
    base, rest = kv.rows[0], kv.rows[1:]
    unit = DTYPE_BYTES.get(kv.baseline_dtype)
    bf16 = base.kv_bytes_per_token * 2 / unit if unit else None  # the same cache in bf16, a GPU's default

    def saving(r: Any) -> str:
        text = f"{base.kv_bytes_per_token / r.kv_bytes_per_token:.2f}× less KV per token than this model's "
        text += f"{kv.baseline_dtype} cache" if kv.baseline_dtype else "unrounded cache"
        if bf16 is not None and kv.baseline_dtype != "bf16":
            text += f" ({bf16 / r.kv_bytes_per_token:.2f}× less than a bf16 cache, a GPU's default)"
        return text

    text = "; ".join(f"{r.variant}: perplexity {100 * r.perplexity_change:+.1f}%, {saving(r)}" for r in rest)
    text += f" (over {kv.eval_tokens} tokens). Weights are unchanged: KV precision is a separate choice."
    if embedded:
        text += " The weights are the Q4_1-derived baseline; only the cache is rounded here."
    return text


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.embedded:
        lines.append(baseline_note(True))
    if result.formats:
        lines.append(formats_text(result.formats))
    if result.compare:
        lines.append(compare_text(result.compare, result.embedded))
    if result.outliers:
        lines.append(outliers_text(result.outliers))
    if result.kv:
        lines.append(kv_text(result.kv, result.embedded))
    lines += [gpt_oss_text(), scale_schemes_text(), nf4_scheme_text(), qat_vs_ptq_text()]
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Tables

FORMAT_COLUMNS = [
    Column("method", "format", "text"), Column("layers", "layers", "int"),
    Column("bits_per_weight", "bits per weight (scales included)"),
    Column("rel_error_mean", "mean error ‖W−Ŵ‖/‖W‖", "pct"), Column("rel_error_max", "worst layer", "pct"),
    Column("exact_layers", "layers exact", "int"),
]
COMPARE_COLUMNS = [
    Column("method", "method", "text"), Column("weight_bytes", "weights", "bytes"),
    Column("compression", "smaller by", "ratio"),
    Column("perplexity", "perplexity", missing="— (random weights)"),
    Column("perplexity_change", "perplexity change", "pct", missing="—"),
    Column("top1_agreement", "next token unchanged", "pct"),
    Column("decode_tokens_per_s", "decode tok/s (1 / ITL p50)"),
    Column("decode_kernel", "decode kernel", "text", missing="F.linear (unquantized)"),
    Column("layer_rel_error_mean", "mean layer error", "pct", missing="— (unquantized)"),
]
OUTLIER_COLUMNS = [
    Column("layer", "layer", "text"), Column("top_feature", "largest feature", "int"),
    Column("top_absmax", "its max |x|"), Column("median_absmax", "median feature max |x|"),
    Column("max_over_median", "largest / median", "ratio"),
]
KV_COLUMNS = [
    Column("variant", "KV cache", "text"), Column("perplexity", "perplexity"),
    Column("perplexity_change", "perplexity change", "pct"),
    Column("kv_bytes_per_token", "KV per token (B)", "int"), Column("note", "note", "text"),
]


def formats_table(formats: FormatsResult):
    return people_table(formats.summary(), FORMAT_COLUMNS)


def compare_table(comparison: Comparison):
    return people_table(comparison.rows, COMPARE_COLUMNS)


def outliers_table(outliers: list[OutlierRow], top: int = 8):
    return people_table(sorted(outliers, key=lambda r: -r.max_over_median)[:top], OUTLIER_COLUMNS)


def kv_table(kv: KVResult):
    return people_table(kv.rows, KV_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.formats:
        out["Reconstruction error per format, real weights"] = formats_table(result.formats)
    if result.compare:
        out["Methods side by side"] = compare_table(result.compare)
    if result.outliers:
        out["Largest input features of the q projections"] = outliers_table(result.outliers)
    if result.kv and result.kv.rows:
        out["KV-cache quantization"] = kv_table(result.kv)
    out["Which model fits one GPU (analytic)"] = fit_table()
    return out


# ---------------------------------------------------------------------------------------------
# Figures


def formats_figure(formats: FormatsResult, source: str):
    """Relative reconstruction error of every checked layer, one marker series per format."""
    from matplotlib.ticker import MaxNLocator

    from ..figures import subplots

    fig, ax = subplots(figsize=(8, 3.6))
    for s in formats.summary():
        rows = [r for r in formats.layers if r.method == s.method]
        exact = " — exact, every layer" if s.exact_layers == s.layers else ""
        ax.plot(range(len(rows)), [100 * r.rel_fro for r in rows], ".-", ms=5, lw=0.6, clip_on=False, zorder=3,
                label=f"{s.method} ({s.bits_per_weight:.2f} bits/weight){exact}")
    ax.set(xlabel=f"linear layer (blocks {', '.join(map(str, formats.blocks_checked))}, model order)",
           ylabel="‖W − Ŵ‖ / ‖W‖ (%)", ylim=(0, None))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"Per-layer error of each format\n{source}", fontsize=9)
    finish(fig)
    return fig


def compare_figure(comparison: Comparison, source: str):
    """Bars of exact weight MB per method, with perplexity (or top-1 agreement) on a second axis."""
    from ..figures import subplots

    rows = comparison.rows
    names = [r.method for r in rows]
    fig, ax = subplots(figsize=(7, 3.6))
    ax.bar(names, [r.weight_bytes / MB for r in rows], color="#4c72b0")
    ax.set(ylabel="weight memory (MB = 1e6 B, exact)", ylim=(0, None))
    twin = ax.twinx()
    if rows[0].perplexity is not None:
        twin.plot(names, [r.perplexity for r in rows], "o-", color="#dd8452")
        twin.set_ylabel("perplexity (lower is better)", color="#dd8452")
    else:
        twin.plot(names, [100 * r.top1_agreement for r in rows], "o-", color="#dd8452")
        twin.set_ylabel("next token unchanged (%)", color="#dd8452")
    twin.set_ylim(0, None)
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_title(f"Weight memory vs quality\n{source}", fontsize=9)
    finish(fig)
    return fig


def outliers_figure(outliers: list[OutlierRow], source: str):
    """Largest / median input feature per layer (a log axis when the ratios span a decade or more)."""
    from ..figures import subplots

    ratios = [r.max_over_median for r in outliers]
    fig, ax = subplots(figsize=(7, 3))
    ax.bar(range(len(outliers)), ratios, color="#c44e52")
    if max(ratios) / min(ratios) >= 10:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, None)
    ax.set(xlabel="decoder block (q projection input)", ylabel="largest / median feature (×)")
    ax.set_title(f"Outlier features in the activations\n{source}", fontsize=9)
    finish(fig)
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.formats:
        out["formats"] = formats_figure(result.formats, result.model)
    if result.compare:
        out["compare"] = compare_figure(result.compare, result.model)
    if result.outliers:
        out["outliers"] = outliers_figure(result.outliers, result.model)
    return out


# ---------------------------------------------------------------------------------------------
# Analytic: which model fits one GPU in which format

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


# ---------------------------------------------------------------------------------------------
# Saved: bitsandbytes on an H200


@dataclass(frozen=True)
class WeightRead:
    """One linear layer in one format at one batch: the bytes it must read vs the time it took."""

    format: str
    batch: int
    weight_bytes: int
    floor_s: float  # weight bytes / datasheet bandwidth
    measured_s: float

    @property
    def achieved_Bps(self) -> float:
        return self.weight_bytes / self.measured_s

    @property
    def measured_over_floor(self) -> float:
        return self.measured_s / self.floor_s


FORMAT_BITS = {"bf16": 16, "int8": 8, "nf4": 4}


def weight_reads(bnb_rows: list[dict[str, Any]], out_features: int, in_features: int,
                 bandwidth_Bps: float) -> list[WeightRead]:
    """Rows ``{"batch", "bf16_us", "int8_us", "nf4_us"}`` as bytes read vs time (the floor at ``bandwidth_Bps``)."""
    out = []
    for row in bnb_rows:
        for fmt, bits in FORMAT_BITS.items():
            nbytes = out_features * in_features * bits // 8
            out.append(WeightRead(fmt, row["batch"], nbytes, nbytes / bandwidth_Bps, row[f"{fmt}_us"] * 1e-6))
    return out


WEIGHT_READ_COLUMNS = [
    Column("format", "format", "text"), Column("batch", "batch", "int"), Column("weight_bytes", "weight (codes only)", "bytes"),
    Column("floor_s", "memory floor (µs)", scale=1e6), Column("measured_s", "measured (µs)", scale=1e6),
    Column("achieved_Bps", "achieved (GB/s)", scale=1e-9), Column("measured_over_floor", "measured / floor", "ratio"),
]
BNB_SHAPE = (14336, 4096)  # out, in: one Mistral-7B MLP up projection, as the baseline script measured it


def bnb_text(reads: list[WeightRead], datasheet_Bps: float, copy_Bps: float | None, nf4_error: float | None) -> str:
    """Why LLM.int8 is slower than bf16 at batch 1, every number from the saved rows."""
    b1 = {r.format: r for r in reads if r.batch == 1}
    bf16, int8, nf4 = b1["bf16"], b1["int8"], b1["nf4"]
    share = int8.achieved_Bps / datasheet_Bps
    text = (
        f"At batch 1, int8 reads {100 * int8.weight_bytes / bf16.weight_bytes:.0f}% of bf16's bytes yet takes "
        f"**{int8.measured_s / bf16.measured_s:.1f}× longer** ({int8.measured_s * 1e6:.0f} µs vs "
        f"{bf16.measured_s * 1e6:.0f} µs). It reaches {int8.achieved_Bps / 1e9:.0f} GB/s: "
        f"**{100 * share:.1f}% of the {datasheet_Bps / 1e12:.1f} TB/s datasheet bandwidth, about 1/{1 / share:.0f}**"
    )
    if copy_Bps:
        text += f" ({100 * int8.achieved_Bps / copy_Bps:.1f}% of the {copy_Bps / 1e12:.2f} TB/s measured copy)"
    text += (
        ". LLM.int8 quantizes the activations, splits out outlier features and runs them in 16-bit, multiplies "
        f"in int8 and dequantizes the output: several kernels per call. NF4 takes {nf4.measured_s * 1e6:.0f} µs, "
        f"{nf4.measured_s / bf16.measured_s:.1f}× bf16, for a quarter of the bytes."
    )
    if nf4_error is not None:
        text += f" NF4's output differs from bf16's by {100 * nf4_error:.1f}% (relative norm, random weights)."
    return text


def saved() -> SavedView | None:
    """bitsandbytes int8 / NF4 on one H200 linear layer, from the saved HF baseline run."""
    found = [s for s in load_saved("h200-hf-baseline-*.json") if s.data.get("bnb_linear")]
    if not found:
        return None
    src = found[0]
    datasheet = get_gpu("H200").bandwidth_Bps
    copy = src.data.get("copy_TBps")
    reads = weight_reads(src.data["bnb_linear"], *BNB_SHAPE, datasheet)
    return SavedView(
        title=(f"bitsandbytes {src.data.get('bnb', '')} on {src.device}: one {BNB_SHAPE[1]}×{BNB_SHAPE[0]} "
               "linear layer, random weights"),
        source=src,
        tables={"Bytes read vs time, per format and batch": people_table(reads, WEIGHT_READ_COLUMNS)},
        notes=[bnb_text(reads, datasheet, copy * 1e12 if copy else None, src.data.get("bnb_err_nf4_rel")),
               f"Memory floor: weight bytes / the {datasheet / 1e12:.1f} TB/s datasheet bandwidth.",
               f"Measured by: {src.command}"],
    )
