"""Chapter 05 · Capacity planner: exercises.

Fill in each function, then run `infer-lab check 05`. Money in US dollars, times in
seconds unless a name says ms, bytes are plain bytes.
"""

from infer_lab.analysis.roofline import gpu_roof, predict_decode  # noqa: F401  (for users_within_itl_slo)


def usd_per_million_tokens(usd_per_hour: float, tokens_per_s: float) -> float:
    """What one million output tokens cost, in $, when the GPUs cost ``usd_per_hour`` in all
    and produce ``tokens_per_s`` output tokens per second."""
    raise NotImplementedError


def users_within_itl_slo(model: str, gpu: str, context: int, itl_slo_ms: float, memory_users: int) -> int:
    """The largest batch (at most ``memory_users``) whose decode step meets the ITL SLO.

    ``predict_decode(model, gpu_roof(gpu), batch, context).time_s`` is the predicted step
    (seconds) at ``batch`` sequences of ``context`` tokens; the SLO is in milliseconds. The
    step grows with the batch. Return 0 when not even one user meets it.
    """
    raise NotImplementedError


def users_at_context(kv_budget_bytes: int, kv_bytes_per_token: int, context: int, window: int | None) -> int:
    """How many users of ``context`` tokens each fit in ``kv_budget_bytes`` of KV memory.

    ``kv_bytes_per_token`` is all layers together. ``window`` is None, or the sliding window
    every layer uses: such a layer keeps only its last ``window`` tokens. A budget of 0 or
    less holds nobody.
    """
    raise NotImplementedError
