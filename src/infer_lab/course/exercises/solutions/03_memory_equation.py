"""Chapter 03 · The memory equation: reference solutions."""

import math


def kv_gb_70b_128k() -> float:
    """80 layers x (K + V) x 8 KV heads x 128 values x 2 bytes, times 131,072 tokens, in GB."""
    layers, kv_heads, head_dim, bytes_per_value = 80, 8, 128, 2
    per_token = layers * 2 * kv_heads * head_dim * bytes_per_value
    return per_token * 128 * 1024 / 1e9


def mla_kv_bytes_per_token(layers: int, kv_lora_rank: int, qk_rope_head_dim: int,
                           bytes_per_value: int) -> int:
    """One latent plus one shared RoPE key per layer per token."""
    return layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_value


def quantized_bytes(n_weights: int, bits: int, group_size: int | None, scale_bits: int) -> int:
    """Codes plus one scale per (possibly short) group, rounded up to whole bytes."""
    total_bits = n_weights * bits
    if group_size:
        total_bits += math.ceil(n_weights / group_size) * scale_bits
    return math.ceil(total_bits / 8)


def max_users(usable_bytes: int, weight_bytes: int, overhead_bytes: int, kv_bytes_per_user: int) -> int:
    """What is left after weights and overhead, in whole users (never negative)."""
    budget = usable_bytes - weight_bytes - overhead_bytes
    return max(0, budget // kv_bytes_per_user)
