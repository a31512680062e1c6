"""Attention variants and FlashAttention, written to be read (the library under chapter 07).

* :mod:`.reference`: masks, the textbook formula and the SDPA reference (RoPE is the engine's,
  :mod:`infer_lab.engine.layers`).
* :mod:`.variants`: one :class:`Attention` layer with a KV cache for MHA/GQA/MQA/sliding window.
* :mod:`.mla`: multi-head latent attention with naive and weight-absorbed decode.
* :mod:`.flash`: tiled online-softmax attention and the HBM-bytes analysis.
* :mod:`.equivalence`: a layer against SDPA, in one prefill and token by token through its cache.
* :mod:`.hf`: MQA conversion of a real transformers model, and running it with quantized KV or a window.
* :mod:`.quality`: the perplexity price of those changes, measured on a real model.
* :mod:`.kv_sizing`: KV bytes, max users and predicted decode per variant, from :mod:`infer_lab.analysis`.

Timing attention kernels on a device is a benchmark: :mod:`infer_lab.bench.attention`.
"""

from .equivalence import decode_token_by_token, diff_from_sdpa
from .flash import (
    PAPER_HBM_TRAFFIC,
    CitedHBMTraffic,
    FlashTiling,
    flash_attention,
    kv_rows_read,
    naive_attention_hbm_bytes,
    online_softmax_tile,
    score_matrix_bytes,
    tiled_attention_hbm_bytes,
)
from .hf import convert_to_mqa, patched_attention
from .mla import MLACache, MLAConfig, MultiHeadLatentAttention
from .reference import allowed_mask, naive_attention, sdpa_attention
from .variants import Attention, AttentionConfig, KVCache

__all__ = [
    "PAPER_HBM_TRAFFIC",
    "Attention",
    "AttentionConfig",
    "CitedHBMTraffic",
    "FlashTiling",
    "KVCache",
    "MLACache",
    "MLAConfig",
    "MultiHeadLatentAttention",
    "allowed_mask",
    "convert_to_mqa",
    "decode_token_by_token",
    "diff_from_sdpa",
    "flash_attention",
    "kv_rows_read",
    "naive_attention",
    "naive_attention_hbm_bytes",
    "online_softmax_tile",
    "patched_attention",
    "score_matrix_bytes",
    "sdpa_attention",
    "tiled_attention_hbm_bytes",
]
