"""Checks and measurements behind the module-06 scorecard.

* :func:`equivalence_report`: every variant and backend against torch SDPA, prefill and cached decode.
* :func:`measure_variant_quality`: on a real model, the perplexity of its own attention (GQA for
  SmolLM2), of the mean-pooled MQA conversion, of a sliding window and of int8/fp8 KV caches,
  next to the KV bytes per token measured from the cache tensors.
"""

from __future__ import annotations

from typing import Any

import torch


def equivalence_report(seed: int = 0) -> list[dict[str, Any]]:
    """Max |output - SDPA output| for each variant/backend, prefill and token-by-token cached decode."""
    from .mla import MLAConfig, MultiHeadLatentAttention
    from .variants import Attention, AttentionConfig

    torch.manual_seed(seed)
    x = torch.randn(1, 12, 64)
    rows = []

    def decode(layer, prefix: int, **kwargs) -> torch.Tensor:
        cache = layer.new_cache()
        outs = [layer(x[:, :prefix], cache, **kwargs)]
        outs += [layer(x[:, i : i + 1], cache, **kwargs) for i in range(prefix, x.shape[1])]
        return torch.cat(outs, dim=1)

    with torch.inference_mode():
        for kv, window in ((None, None), (2, None), (1, None), (2, 4)):
            layer = Attention(AttentionConfig(64, 4, kv, window=window))
            reference = layer(x, backend="sdpa")
            for backend in ("naive", "flash"):
                rows.append(
                    {
                        "variant": layer.config.kind,
                        "path": backend,
                        "prefill_max_abs_diff": float(
                            (layer(x, backend=backend) - reference).abs().max()
                        ),
                        "decode_max_abs_diff": float(
                            (decode(layer, 8, backend=backend) - reference).abs().max()
                        ),
                    }
                )
        mla = MultiHeadLatentAttention(MLAConfig(64, 4, 16, 8, 4, 8))
        reference = mla(x, backend="sdpa")
        for path in ("naive", "absorbed"):
            rows.append(
                {
                    "variant": "MLA",
                    "path": path,
                    "prefill_max_abs_diff": float((mla(x, decode=path) - reference).abs().max()),
                    "decode_max_abs_diff": float(
                        (decode(mla, 8, decode=path) - reference).abs().max()
                    ),
                }
            )
    return rows


def _cache_bytes_per_token(model, ids: torch.Tensor) -> float:
    from transformers import DynamicCache

    from ..harness import cache_tensor_bytes

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
) -> list[dict[str, Any]]:
    """Perplexity and measured KV bytes/token for the model's own attention and its cheaper variants.

    ``include`` picks the rows after the baseline: ``'mqa'``, ``'window'``, ``'kv'`` (quantized caches).
    ``window`` defaults to a quarter of ``eval_window`` so the window actually cuts context.
    KV bytes for the quantized caches count codes plus one fp32 scale per token per head.
    """
    from ..evaluation import eval_token_ids, perplexity
    from ..quant.kv import kv_bytes_per_element
    from .hf import convert_to_mqa, patched_attention

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
    rows = [
        {
            "variant": f"{own} (as trained)",
            "perplexity": base,
            "perplexity_change": 0.0,
            "kv_bytes_per_token": own_kv,
        }
    ]
    if "mqa" in include:
        mqa = convert_to_mqa(lm.model)
        ppl = perplexity(mqa, ids, window=eval_window).perplexity
        rows.append(
            {
                "variant": "MQA (mean-pooled, no uptraining)",
                "perplexity": ppl,
                "perplexity_change": ppl / base - 1,
                "kv_bytes_per_token": _cache_bytes_per_token(mqa, ids[:16]),
            }
        )
        del mqa
    if "window" in include:
        with patched_attention(lm.model, window=window):
            ppl = perplexity(lm.model, ids, window=eval_window).perplexity
        rows.append(
            {
                "variant": f"sliding window {window}",
                "perplexity": ppl,
                "perplexity_change": ppl / base - 1,
                "kv_bytes_per_token": own_kv,
                "note": f"KV stops growing at {window} tokens",
            }
        )
    element = lm.model.dtype.itemsize
    for kv_dtype in kv_dtypes if "kv" in include else ():
        with patched_attention(lm.model, kv_dtype=kv_dtype):
            ppl = perplexity(lm.model, ids, window=eval_window).perplexity
        rows.append(
            {
                "variant": f"{own} + {kv_dtype} KV cache",
                "perplexity": ppl,
                "perplexity_change": ppl / base - 1,
                "kv_bytes_per_token": own_kv * kv_bytes_per_element(kv_dtype, head_dim) / element,
            }
        )
    return rows


def quality_notes(rows: list[dict[str, Any]], model_name: str) -> dict[str, str]:
    """Scorecard notes from :func:`measure_variant_quality` rows, saying which model and setting they measured."""
    notes = {}
    for row in rows:
        family = row["variant"].split(" ")[0]
        if family not in ("MQA", "sliding"):
            continue
        ratio = 1 + row["perplexity_change"]
        change = (
            f"perplexity x{ratio:.0f}"
            if ratio >= 3
            else f"perplexity {100 * row['perplexity_change']:+.1f}%"
        )
        notes[family] = f"measured on {model_name}, {row['variant']}: {change}"
    return notes
