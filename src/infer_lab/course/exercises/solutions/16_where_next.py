"""Chapter 16 · Where next: reference solutions."""


def kv_transfer_s(context: int, kv_bytes_per_token: int, link_Bps: float, latency_s: float) -> float:
    """Latency plus the cache's bytes at the link's one-way bandwidth."""
    return latency_s + context * kv_bytes_per_token / link_Bps


def recompute_over_reload(params: int, kv_bytes_per_token: int, peak_flops: float, link_Bps: float) -> float:
    """(2 x params / peak) seconds per token to recompute, over (KV bytes / link) seconds per token to reload."""
    return (2 * params / peak_flops) / (kv_bytes_per_token / link_Bps)


def users_with_smaller_kv(kv_budget_bytes: int, kv_bytes_per_user: int, bytes_per_value_before: int,
                          bytes_per_value_after: int) -> int:
    """The same budget over the smaller per-user cache, in whole users."""
    per_user = kv_bytes_per_user * bytes_per_value_after // bytes_per_value_before
    return max(0, kv_budget_bytes // per_user)
