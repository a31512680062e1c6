"""Chapter 05 · Capacity planner: reference solutions."""

from infer_lab.analysis.roofline import gpu_roof, predict_decode


def usd_per_million_tokens(usd_per_hour: float, tokens_per_s: float) -> float:
    """Dollars per second over tokens per second, times a million."""
    return usd_per_hour / 3600 / tokens_per_s * 1e6


def users_within_itl_slo(model: str, gpu: str, context: int, itl_slo_ms: float, memory_users: int) -> int:
    """Binary search for the last batch whose predicted step is within the SLO."""
    roof = gpu_roof(gpu)
    lo, hi = 0, memory_users
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if predict_decode(model, roof, mid, context).time_s * 1e3 <= itl_slo_ms:
            lo = mid
        else:
            hi = mid - 1
    return lo


def users_at_context(kv_budget_bytes: int, kv_bytes_per_token: int, context: int, window: int | None) -> int:
    """The budget over one user's cache, which stops growing at the window."""
    cached = context if window is None else min(context, window)
    return max(0, kv_budget_bytes // (kv_bytes_per_token * cached))
