"""Section 2 of chapter 06: methods side by side, bytes, speed and quality (the notebook's ``quantize_and_compare``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...figures import finish, subplots
from ...units import MB, count, fmt_bytes, human
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


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


def compare_table(comparison: Comparison):
    return people_table(comparison.rows, COMPARE_COLUMNS)


def compare_figure(comparison: Comparison, source: str):
    """Bars of exact weight MB per method, with perplexity (or top-1 agreement) on a second axis."""
    rows = comparison.rows
    names = [r.method for r in rows]
    fig, ax = subplots(figsize=(7, 3.6))
    ax.bar(names, [r.weight_bytes / MB for r in rows], color="#4c72b0")
    ax.set(ylabel="weight memory (MB = 10⁶ B, exact)", ylim=(0, None))
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
