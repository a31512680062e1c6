"""Section 1 of chapter 06: every linear layer quantized with each format (the notebook's ``layer_errors``),
and the note that the baseline is already 4-bit, with its measured proof."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matplotlib.ticker import MaxNLocator

from ...figures import finish, subplots
from ...models import EMBEDDED_GGUF
from ...quant.formats import quantize_q4_1
from ...units import human
from ..library_code import code_block
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


ORIGIN_GROUP = 32  # Q4_1's block: 32 weights share one fp16 scale and one fp16 minimum


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


def group_quantize_code() -> str:
    """The group-wise 4-bit quantizer the engine's int4 path uses (GGUF's Q4_1), as the page shows it."""
    return code_block(quantize_q4_1)


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


FORMAT_COLUMNS = [
    Column("method", "format", "text"), Column("layers", "layers", "int"),
    Column("bits_per_weight", "bits per weight (scales included)"),
    Column("rel_error_mean", "mean error ‖W−Ŵ‖/‖W‖", "pct"), Column("rel_error_max", "worst layer", "pct"),
    Column("exact_layers", "layers exact", "int"),
]


def formats_table(formats: FormatsResult):
    return people_table(formats.summary(), FORMAT_COLUMNS)


def formats_figure(formats: FormatsResult, source: str):
    """Relative reconstruction error of every checked layer, one marker series per format."""
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
