"""Part 4 of chapter 07: the scorecard, quality, memory and speed per variant (analytic memory, roofline speed)."""

from __future__ import annotations

from ...attention.kv_sizing import ScorecardRow, scorecard
from ...figures import finish, subplots
from ..tables import Column, people_table
from .quality import QualityResult, perplexity_change_text
from .scenario import DEFAULT_CONTEXT, DEFAULT_GPU


def quality_notes(quality: QualityResult | None) -> dict[str, str]:
    """Scorecard notes from measured rows ('MQA', 'sliding'), saying which model and setting they measured:
    the cost of converting a model trained with full attention, without training it again."""
    if quality is None:
        return {}
    return {row.family: f"measured here, converting {quality.model_name} without retraining ({row.variant}): "
                        f"{perplexity_change_text(row)}"
            for row in quality.rows if row.family in ("MQA", "sliding")}


def scorecard_rows(gpu: str = DEFAULT_GPU, context: int = DEFAULT_CONTEXT,
                   quality: QualityResult | None = None) -> list[ScorecardRow]:
    measured = quality_notes(quality)
    return scorecard("mistral-7b", gpu, context, measured_quality=measured) + scorecard("deepseek-v3", gpu, context)


SCORECARD_COLUMNS = [
    Column("model", "model", "text"), Column("variant", "variant", "text"), Column("quality", "quality", "text"),
    Column("kv_bytes_per_token", "KV per token", "bytes"), Column("n_gpus", "GPUs", "int"),
    Column("max_users", "max users", "int"),
    Column("decode_tok_s_batch1", "decode tok/s, batch 1 (roofline)"),
    Column("decode_tok_s_at_max_users", "decode tok/s at max users (roofline)"),
]


def scorecard_table(rows: list[ScorecardRow]):
    return people_table(rows, SCORECARD_COLUMNS)


def scorecard_figure(rows: list[ScorecardRow], title: str):
    """Two panels per variant: KV bytes per token (memory) and predicted decode tokens/s at max users."""
    names = [f"{r.model} · {r.variant}" for r in rows]
    fig, (left, right) = subplots(1, 2, figsize=(9, 0.35 * len(rows) + 1.5), sharey=True)
    left.barh(names, [r.kv_bytes_per_token for r in rows], color="#55a868")
    left.set_xscale("log")
    left.set_xlabel("KV bytes per token, all layers (log)")
    right.barh(names, [r.decode_tok_s_at_max_users for r in rows], color="#c44e52")
    right.set_xlabel("decode tok/s at max users (roofline)")
    right.set_xlim(0, None)
    left.invert_yaxis()
    fig.suptitle(title, fontsize=9)
    finish(fig)
    return fig
