"""Chapter 07 · Attention variants and FlashAttention: exercises.

Fill in each function, then run `infer-lab check 07`.
"""

import torch


def online_softmax_update(
    running_max: torch.Tensor,
    running_sum: torch.Tensor,
    output_acc: torch.Tensor,
    scores: torch.Tensor,
    values: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one tile of keys into the running softmax state, as FlashAttention does.

    For ``n`` queries: ``running_max`` and ``running_sum`` are ``(n, 1)`` (start: -inf and 0),
    ``output_acc`` is ``(n, d)`` (start: 0), ``scores`` is this tile's ``(n, tile)`` scaled
    QK^T and ``values`` its ``(tile, d)`` V. Keep the unnormalized sum of exp(score - max)
    times V in ``output_acc`` and the sum of exp(score - max) in ``running_sum``; when the
    max grows, what was accumulated must be brought to the new max. The caller finishes
    with ``output_acc / running_sum``. In a paged KV store's tile loop (stage 3 of the build
    track) the same update gets leading head dimensions: ``(..., n, 1)``, ``(..., n, tile)``,
    ``(..., tile, d)``.

    Returns:
        ``(new_max, new_sum, new_acc)``.
    """
    raise NotImplementedError


def expand_kv_heads(kv: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Give each of ``n_heads`` query heads its KV head: ``(b, kv_heads, t, d) -> (b, n_heads, t, d)``.

    In grouped-query attention consecutive query heads share a KV head: with 8 query heads
    over 2 KV heads, query heads 0-3 use KV head 0 and 4-7 use KV head 1.
    """
    raise NotImplementedError


def mha_over_mla(heads: int, k_head_dim: int, v_head_dim: int, mha_layers: int,
                 kv_lora_rank: int, qk_rope_head_dim: int, mla_layers: int) -> float:
    """Predict how many times more an MHA model caches per token than an MLA model.

    MHA caches, per layer and token, a K of ``k_head_dim`` and a V of ``v_head_dim`` values
    for every one of ``heads`` heads; MLA a latent of ``kv_lora_rank`` values plus one RoPE key
    of ``qk_rope_head_dim``. Compare whole models: ``mha_layers`` against ``mla_layers`` (the
    same bytes per value on both sides).
    """
    raise NotImplementedError
