"""Part 3 of chapter 07: the quality price on real weights (GQA pooled to MQA, a window, KV caches)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...attention.quality import VariantQuality
from ...figures import finish, subplots
from ..ch06_quantization import baseline_note
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes


@dataclass(frozen=True)
class QualityResult:
    rows: list[VariantQuality]
    eval_tokens: int
    model: str  # lm.describe(): model, weights, hardware
    model_name: str
    embedded: bool
    skipped: str = ""


QUALITY_WINDOW = 32  # tokens each query sees in the sliding-window row (the notebook's quality cell reads it)


def quality_result(lm: Any, rows: list[VariantQuality], eval_tokens: int) -> QualityResult:
    """The notebook's ``attention_quality`` rows as a result (random weights: why nothing was measured)."""
    embedded = lm.source == "embedded"
    if not rows:
        return QualityResult([], 0, lm.describe(), lm.name, embedded,
                             skipped=f"{lm.name} has random weights: there is no text quality to measure")
    return QualityResult(rows, eval_tokens, lm.describe(), lm.name, embedded)


def run_quality(lm: Any, sizes: Sizes) -> QualityResult:
    """Run the notebook's own ``attention_quality`` at this size."""
    attention_quality = notebook_function(NUMBER, "attention_quality")
    rows = attention_quality(lm, sizes.eval_tokens, QUALITY_WINDOW, sizes.quality_include)
    return quality_result(lm, rows, sizes.eval_tokens)


def perplexity_change_text(row: VariantQuality) -> str:
    """'perplexity +1.5%' for small changes, 'perplexity ×884' (or ×3.46) for large ones."""
    ratio = 1 + row.perplexity_change
    if ratio >= 10:
        return f"perplexity ×{ratio:,.0f}"
    if ratio >= 2:
        return f"perplexity ×{ratio:.2f}"
    return f"perplexity {100 * row.perplexity_change:+.1f}%"


def quality_text(quality: QualityResult) -> str:
    if quality.skipped:
        return quality.skipped
    base = quality.rows[0]
    parts = []
    for r in quality.rows[1:]:
        saving = r.note or f"{base.kv_bytes_per_token / r.kv_bytes_per_token:.2f}× less KV per token"
        parts.append(f"{r.variant}: {perplexity_change_text(r)} ({r.perplexity:,.1f} vs {base.perplexity:.1f}), {saving}")
    text = "; ".join(parts) + f". Over {quality.eval_tokens} tokens of the shipped evaluation text."
    text += (" Without uptraining, pooling K/V heads is far from free: that is why GQA and MQA models are "
             "trained (or uptrained) that way.")
    note = baseline_note(quality.embedded)
    return text + ("\n\n" + note if note else "")


QUALITY_COLUMNS = [
    Column("variant", "attention", "text"), Column("perplexity", "perplexity"),
    Column("perplexity_change", "perplexity change", "pct"), Column("perplexity_ratio", "× as trained", "ratio"),
    Column("kv_bytes_per_token", "KV per token (B), measured", "int"), Column("note", "note", "text"),
]


def quality_table(quality: QualityResult):
    return people_table(quality.rows, QUALITY_COLUMNS)


def quality_figure(quality: QualityResult, source: str):
    """Perplexity of each variant relative to the model as trained (log axis: MQA without uptraining is far off)."""
    rows = quality.rows
    fig, ax = subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    ratios = [r.perplexity_ratio for r in rows]
    ax.barh([r.variant for r in rows], [x - 1 for x in ratios], left=1, color="#8172b3")  # bars start at 1×
    ax.set_xscale("log")
    ax.set_xlim(min(0.9, 0.9 * min(ratios)), 1.5 * max(ratios))
    ax.axvline(1, color="k", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("perplexity / perplexity as trained (log; 1 = no change)")
    ax.set_title(f"The quality price of cheaper attention\n{source}", fontsize=9)
    finish(fig)
    return fig
