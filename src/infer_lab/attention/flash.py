"""FlashAttention's idea in plain torch: tiles and an online softmax, never the full score matrix.

A GPU kernel keeps one query tile in SRAM and streams key/value tiles past it. Here the loops are
ordinary Python so every quantity has a name: ``running_max`` (largest score seen so far per
query), ``running_sum`` (softmax denominator rescaled to that max) and ``output_acc`` (the
unnormalized weighted sum of values). This is for reading and testing, not for speed.
"""

from __future__ import annotations

import math

import torch

from .reference import expand_kv_heads, position_mask


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    window: int | None = None,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> torch.Tensor:
    """Tiled attention with an online softmax; equal to softmax(QK^T·scale)V up to rounding.

    Shapes as in :mod:`infer_lab.attention.reference` (queries are the last ``q_len`` positions).
    Tiles that the causal/window mask hides completely are skipped, which is where the causal
    variant saves about half the work.
    """
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, got block_q={block_q}, block_k={block_k}")
    k = expand_kv_heads(k, q.shape[1])
    v = expand_kv_heads(v, q.shape[1])
    q_len, kv_len = q.shape[-2], k.shape[-2]
    offset = kv_len - q_len  # absolute position of query 0
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for q_start in range(0, q_len, block_q):
        q_tile = q[..., q_start : q_start + block_q, :].float()
        rows = q_tile.shape[-2]
        first_query_pos, last_query_pos = offset + q_start, offset + q_start + rows - 1
        running_max = torch.full((*q_tile.shape[:-1], 1), float("-inf"), device=q.device)
        running_sum = torch.zeros_like(running_max)
        output_acc = torch.zeros(*q_tile.shape[:-1], v.shape[-1], device=q.device)
        for k_start in range(0, kv_len, block_k):
            k_end = min(k_start + block_k, kv_len)
            if causal and k_start > last_query_pos:
                break  # every later key is in the future of every query of this tile
            if window is not None and k_end - 1 <= first_query_pos - window:
                continue  # the whole key tile slid out of every query's window
            scores = (q_tile @ k[..., k_start:k_end, :].float().transpose(-2, -1)) * scale
            if causal or window is not None:
                mask = position_mask(
                    torch.arange(first_query_pos, last_query_pos + 1, device=q.device),
                    torch.arange(k_start, k_end, device=q.device),
                    causal,
                    window,
                )
                scores = scores.masked_fill(~mask, float("-inf"))
            running_max, running_sum, output_acc = online_softmax_tile(
                scores, v[..., k_start:k_end, :].float(), running_max, running_sum, output_acc)
        out[..., q_start : q_start + rows, :] = (output_acc / running_sum).to(q.dtype)
    return out


def online_softmax_tile(
    scores: torch.Tensor,
    v_tile: torch.Tensor,
    running_max: torch.Tensor,
    running_sum: torch.Tensor,
    output_acc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one key/value tile into a query tile's running softmax: FlashAttention's inner step.

    ``scores (..., rows, tile)`` are this tile's scaled (and masked) scores, ``v_tile (..., tile, d)``
    its values. Whenever a larger score appears, what was summed so far is rescaled by
    ``exp(old max - new max)``, so ``output_acc / running_sum`` is always the softmax-weighted
    sum of the values seen so far. Returns the new ``(running_max, running_sum, output_acc)``.
    """
    new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
    # A row that has seen only masked keys keeps max -inf; use 0 so exp() gives 0, not NaN.
    safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    correction = torch.exp(running_max - safe_max)
    probs = torch.exp(scores - safe_max)
    running_sum = running_sum * correction + probs.sum(dim=-1, keepdim=True)
    output_acc = output_acc * correction + probs @ v_tile
    return new_max, running_sum, output_acc


def naive_attention_hbm_bytes(
    seq_len: int, head_dim: int, heads: int = 1, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """HBM bytes moved by unfused attention (prefill, ``seq_len`` queries and keys).

    Per head: read Q and K (2·N·d), write the scores S (N²), read S and write P = softmax(S)
    (2·N²), read P and V (N² + N·d), write O (N·d): ``4·N·d + 4·N²`` elements.
    """
    n, d = seq_len, head_dim
    return (4 * n * d + 4 * n * n) * heads * batch * bytes_per_element


def tiled_attention_hbm_bytes(
    seq_len: int,
    head_dim: int,
    heads: int = 1,
    batch: int = 1,
    bytes_per_element: int = 2,
    block_q: int = 128,
) -> int:
    """HBM bytes moved by tiled (flash) attention: Q read and O written once, K and V once per query tile.

    Per head: ``2·N·d + 2·N·d·ceil(N / block_q)`` elements. ``block_q`` is bounded by SRAM (the
    paper picks about M / (4·d) for M bytes of on-chip memory). No N² term: the scores never leave SRAM.
    """
    n, d = seq_len, head_dim
    tiles = math.ceil(n / block_q)
    return (2 * n * d + 2 * n * d * tiles) * heads * batch * bytes_per_element


def score_matrix_bytes(seq_len: int, heads: int, batch: int = 1, bytes_per_element: int = 2) -> int:
    """Memory the naive path must allocate for one layer's scores: ``batch·heads·N²`` elements."""
    return batch * heads * seq_len * seq_len * bytes_per_element
