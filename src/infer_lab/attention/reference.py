"""The reference attention: masks, and softmax(QK^T / sqrt(d)) V written out and through SDPA.

RoPE is not here: every attention layer of the package uses the engine's one implementation
(:mod:`infer_lab.engine.layers`: ``rope_inverse_frequencies``, ``rope_cos_sin``, ``apply_rope``).

Shapes everywhere: ``q`` is ``(batch, heads, q_len, head_dim)``; ``k`` and ``v`` are
``(batch, kv_heads, kv_len, head_dim)`` with ``heads`` a multiple of ``kv_heads``. The queries are
the *last* ``q_len`` positions of the ``kv_len`` keys (prefill: ``q_len == kv_len``; cached
decode: ``q_len == 1``), which is how causal and sliding-window masks line up during decoding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def allowed_mask(
    q_len: int,
    kv_len: int,
    causal: bool = True,
    window: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """Boolean ``(q_len, kv_len)`` mask, True where a query may attend; ``None`` means "everything".

    Query ``i`` sits at absolute position ``kv_len - q_len + i``. Causal: keys at or before it.
    Sliding window ``w``: additionally only the last ``w`` keys (itself included).
    """
    if not causal and window is None:
        return None
    return position_mask(
        torch.arange(kv_len - q_len, kv_len, device=device),
        torch.arange(kv_len, device=device),
        causal,
        window,
    )


def position_mask(
    query_pos: torch.Tensor, key_pos: torch.Tensor, causal: bool = True, window: int | None = None
) -> torch.Tensor:
    """Boolean ``(len(query_pos), len(key_pos))`` mask from absolute positions (True = may attend)."""
    q_pos, k_pos = query_pos[:, None], key_pos[None, :]
    allowed = torch.ones(len(query_pos), len(key_pos), dtype=torch.bool, device=query_pos.device)
    if causal:
        allowed &= k_pos <= q_pos
    if window is not None:
        if window < 1:
            raise ValueError(f"window must be >= 1 token, got {window}")
        allowed &= k_pos > q_pos - window
    return allowed


def expand_kv_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Repeat each of the ``kv_heads`` K/V heads for its group of query heads: ``(b, kv, t, d) -> (b, heads, t, d)``."""
    kv_heads = x.shape[1]
    if n_heads % kv_heads:
        raise ValueError(
            f"{n_heads} query heads cannot be split into groups over {kv_heads} KV heads"
        )
    return x.repeat_interleave(n_heads // kv_heads, dim=1)


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The textbook formula, materializing the full ``(q_len, kv_len)`` score matrix."""
    k = expand_kv_heads(k, q.shape[1])
    v = expand_kv_heads(v, q.shape[1])
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale
    mask = allowed_mask(q.shape[-2], k.shape[-2], causal, window, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return weights @ v


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The same computation through ``torch.nn.functional.scaled_dot_product_attention`` (the reference)."""
    mask = allowed_mask(q.shape[-2], k.shape[-2], causal, window, q.device)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
