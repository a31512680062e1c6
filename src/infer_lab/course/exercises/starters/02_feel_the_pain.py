"""Chapter 02 · Feel the pain: exercises.

Fill in each function, then run `infer-lab check 02`. Bytes are plain bytes (GB = 1e9 B),
times are seconds.
"""


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, users: int,
                   bytes_per_value: int) -> int:
    """Predict the bytes of the KV cache for ``users`` sequences of ``tokens`` tokens each.

    Every layer keeps, for every token, one key vector and one value vector of ``head_dim``
    values per KV head. ``bytes_per_value`` is 4 in fp32 (the CPU default), 2 in bf16.

    Returns:
        bytes (an int).
    """
    raise NotImplementedError


def itl_floor_s(weight_bytes: int, kv_bytes_per_token: int, context: int, batch: int,
                bandwidth_Bps: float) -> float:
    """Predict the time of one decode step (the inter-token latency), in seconds.

    At small batches a decode step is limited by memory: it reads every weight once, and
    every one of the ``batch`` sequences reads its whole KV cache (``context`` tokens of
    ``kv_bytes_per_token`` bytes each). Assume the device streams bytes at ``bandwidth_Bps``
    (bytes per second) and the arithmetic hides behind it.
    """
    raise NotImplementedError
