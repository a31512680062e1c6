"""Chapter 16 · Where next: exercises.

Fill in each function, then run `infer-lab check 16`. Bandwidths are bytes/s in one
direction, times seconds, FLOP/s per second.
"""


def kv_transfer_s(context: int, kv_bytes_per_token: int, link_Bps: float, latency_s: float) -> float:
    """Predict the time to send one prompt's KV cache from the GPU that prefilled it to the one
    that will decode it (disaggregated serving), over a link of ``link_Bps`` and ``latency_s``."""
    raise NotImplementedError


def recompute_over_reload(params: int, kv_bytes_per_token: int, peak_flops: float, link_Bps: float) -> float:
    """Predict how many times longer recomputing a cached prefix takes than reloading its KV.

    Recompute: a prefill of the prefix on the GPU, compute-bound: 2 FLOP per weight per token
    at ``peak_flops`` (leave out attention). Reload: the prefix's KV (``kv_bytes_per_token``
    per token) over a link of ``link_Bps`` from CPU memory. Both grow with the prefix length,
    so the ratio does not depend on it.
    """
    raise NotImplementedError


def users_with_smaller_kv(kv_budget_bytes: int, kv_bytes_per_user: int, bytes_per_value_before: int,
                          bytes_per_value_after: int) -> int:
    """Predict how many users fit in ``kv_budget_bytes`` once each cached value takes
    ``bytes_per_value_after`` bytes instead of ``bytes_per_value_before`` (one user's cache was
    ``kv_bytes_per_user``)."""
    raise NotImplementedError
