"""Chapter 07 · Attention variants and FlashAttention: reference solutions."""

import torch


def online_softmax_update(
    running_max: torch.Tensor,
    running_sum: torch.Tensor,
    output_acc: torch.Tensor,
    scores: torch.Tensor,
    values: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rescale what was accumulated to the new max, then add this tile's share."""
    new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
    correction = torch.exp(running_max - new_max)  # exp(-inf) = 0 on the first tile
    probs = torch.exp(scores - new_max)
    new_sum = running_sum * correction + probs.sum(dim=-1, keepdim=True)
    new_acc = output_acc * correction + probs @ values
    return new_max, new_sum, new_acc


def expand_kv_heads(kv: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Repeat each KV head for its consecutive group of query heads."""
    return kv.repeat_interleave(n_heads // kv.shape[1], dim=1)


def mha_over_mla(heads: int, k_head_dim: int, v_head_dim: int, mha_layers: int,
                 kv_lora_rank: int, qk_rope_head_dim: int, mla_layers: int) -> float:
    """All-layer values per token on each side (bytes per value cancel)."""
    mha = mha_layers * heads * (k_head_dim + v_head_dim)
    mla = mla_layers * (kv_lora_rank + qk_rope_head_dim)
    return mha / mla
