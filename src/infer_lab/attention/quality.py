"""The quality price of cheaper attention, measured on a real model.

:func:`measure_variant_quality`: the perplexity of the model's own attention (GQA for SmolLM2),
of the mean-pooled MQA conversion, of a sliding window and of int8/fp8 KV caches, next to the
KV bytes per token measured from the cache tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..evaluation import eval_token_ids, perplexity
from ..harness import cache_tensor_bytes
from ..quant.kv_formats import kv_bytes_per_element
from .hf import convert_to_mqa, patched_attention


@dataclass(frozen=True)
class VariantQuality:
    """Perplexity of one attention variant on the evaluation text, and its KV bytes per token."""

    variant: str
    perplexity: float
    perplexity_change: float  # relative to the model as trained: 0.05 = 5% worse
    kv_bytes_per_token: float
    note: str = ""

    @property
    def perplexity_ratio(self) -> float:
        """Perplexity / perplexity as trained (1.0 = unchanged)."""
        return 1 + self.perplexity_change

    @property
    def family(self) -> str:
        """'MQA', 'sliding', or the model's own attention ('GQA-3', 'own')."""
        return self.variant.split(" ")[0]


def _cache_bytes_per_token(model, ids: torch.Tensor) -> float:
    from transformers import DynamicCache  # defers transformers

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(ids[None], cache=cache, use_cache=True)
    return cache_tensor_bytes(cache) / ids.numel()


def measure_variant_quality(
    lm,
    eval_tokens: int = 512,
    eval_window: int = 256,
    window: int | None = None,
    kv_dtypes: tuple[str, ...] = ("int8", "fp8"),
    include: tuple[str, ...] = ("mqa", "window", "kv"),
) -> list[VariantQuality]:
    """Perplexity and measured KV bytes/token for the model's own attention and its cheaper variants.

    ``include`` picks the rows after the baseline: ``'mqa'``, ``'window'``, ``'kv'`` (quantized caches).
    ``window`` defaults to a quarter of ``eval_window`` so the window actually cuts context.
    KV bytes for the quantized caches count codes plus one fp32 scale per token per head.
    """
    if lm.tokenizer is None:
        raise ValueError(f"{lm.name} has no tokenizer: perplexity needs real weights and text")
    cfg = lm.model.config
    ids = eval_token_ids(lm.tokenizer, eval_tokens)
    window = window or max(eval_window // 4, 1)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    own_kv = _cache_bytes_per_token(lm.model, ids[:16])
    base = perplexity(lm.model, ids, window=eval_window).perplexity
    own = (
        f"GQA-{cfg.num_key_value_heads}"
        if 1 < cfg.num_key_value_heads < cfg.num_attention_heads
        else "own"
    )
    rows = [VariantQuality(f"{own} (as trained)", base, 0.0, own_kv)]
    if "mqa" in include:
        mqa = convert_to_mqa(lm.model)
        ppl = perplexity(mqa, ids, window=eval_window).perplexity
        rows.append(VariantQuality("MQA (mean-pooled, no uptraining)", ppl, ppl / base - 1,
                                   _cache_bytes_per_token(mqa, ids[:16])))
        del mqa
    if "window" in include:
        with patched_attention(lm.model, window=window):
            ppl = perplexity(lm.model, ids, window=eval_window).perplexity
        rows.append(VariantQuality(f"sliding window {window}", ppl, ppl / base - 1, own_kv,
                                   f"KV stops growing at {window} tokens"))
    element = lm.model.dtype.itemsize
    for kv_dtype in kv_dtypes if "kv" in include else ():
        with patched_attention(lm.model, kv_dtype=kv_dtype):
            ppl = perplexity(lm.model, ids, window=eval_window).perplexity
        rows.append(VariantQuality(f"{own} + {kv_dtype} KV cache", ppl, ppl / base - 1,
                                   own_kv * kv_bytes_per_element(kv_dtype, head_dim) / element,
                                   "codes + one fp32 scale per token per head"))
    return rows
