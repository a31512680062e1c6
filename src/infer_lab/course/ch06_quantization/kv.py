"""Section 4 of chapter 06: KV-cache quantization, int8 / fp8 (the notebook's ``kv_cache_quality``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...attention.quality import VariantQuality
from ...quant.kv_formats import KV_DTYPES
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class KVResult:
    rows: list[VariantQuality]
    eval_tokens: int
    skipped: str = ""  # why nothing was measured (random weights have no text to score)
    baseline_dtype: str = ""  # the dtype of the unrounded cache (the model's own), e.g. "fp32"


def kv_result(lm: Any, rows: list[VariantQuality], eval_tokens: int) -> KVResult:
    """The notebook's ``kv_cache_quality`` rows as a result (random weights: why nothing was measured)."""
    if not rows:
        return KVResult([], 0, skipped=f"{lm.name} has random weights: there is no text quality to measure")
    return KVResult(rows, eval_tokens, baseline_dtype=dtype_label(lm.dtype))


def run_kv(lm: Any, sizes: Sizes) -> KVResult:
    """Run the notebook's own ``kv_cache_quality`` at this size."""
    rows = notebook_function(NUMBER, "kv_cache_quality")(lm, sizes.kv_eval_tokens, KV_DTYPES)
    return kv_result(lm, rows, sizes.kv_eval_tokens)


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def dtype_label(dtype: Any) -> str:
    """'fp32', 'bf16' or 'fp16' for a torch dtype (its torch name otherwise)."""
    name = str(dtype).replace("torch.", "")
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name, name)


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


KV_COLUMNS = [
    Column("variant", "KV cache", "text"), Column("perplexity", "perplexity"),
    Column("perplexity_change", "perplexity change", "pct"),
    Column("kv_bytes_per_token", "KV per token (B)", "int"), Column("note", "note", "text"),
]


def kv_table(kv: KVResult):
    return people_table(kv.rows, KV_COLUMNS)
