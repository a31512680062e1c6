"""Chapter 02 · Feel the pain: reference solutions."""


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, users: int,
                   bytes_per_value: int) -> int:
    """K and V (2) per KV head per layer per token, for every user."""
    return 2 * layers * kv_heads * head_dim * bytes_per_value * tokens * users


def itl_floor_s(weight_bytes: int, kv_bytes_per_token: int, context: int, batch: int,
                bandwidth_Bps: float) -> float:
    """All weights once, plus every sequence's own KV cache, at the memory bandwidth."""
    return (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth_Bps
