"""Attention variants and FlashAttention, written to be read (course module 06).

* :mod:`.core`: masks, RoPE, the textbook formula and the SDPA reference.
* :mod:`.variants`: one :class:`Attention` layer with a KV cache for MHA/GQA/MQA/sliding window.
* :mod:`.mla`: multi-head latent attention with naive and weight-absorbed decode.
* :mod:`.flash`: tiled online-softmax attention and the HBM-bytes analysis.
* :mod:`.hf`: MQA conversion of a real model, and running it with quantized KV or a window.
* :mod:`.memory`: KV bytes / max users / decode roofline per variant, from :mod:`infer_lab.analysis`.
"""

from .core import allowed_mask, apply_rope, naive_attention, rope_cos_sin, sdpa_attention
from .flash import (
    flash_attention,
    naive_attention_hbm_bytes,
    score_matrix_bytes,
    tiled_attention_hbm_bytes,
)
from .hf import convert_to_mqa, patched_attention
from .mla import MLACache, MLAConfig, MultiHeadLatentAttention
from .variants import Attention, AttentionConfig, KVCache

__all__ = [
    "Attention",
    "AttentionConfig",
    "KVCache",
    "MLACache",
    "MLAConfig",
    "MultiHeadLatentAttention",
    "allowed_mask",
    "apply_rope",
    "convert_to_mqa",
    "flash_attention",
    "naive_attention",
    "naive_attention_hbm_bytes",
    "patched_attention",
    "rope_cos_sin",
    "score_matrix_bytes",
    "sdpa_attention",
    "tiled_attention_hbm_bytes",
]
