"""Chapter 15 · The cluster: reference solutions."""


def colocated_capacity_rps(n_gpus: int, prefill_s: float, decode_step_s: float, decode_batch: int,
                           output_tokens: int) -> float:
    """GPUs over one request's GPU time: its prefill plus its 1/batch share of each decode step."""
    busy = prefill_s + output_tokens * decode_step_s / decode_batch
    return n_gpus / busy


def step_cost_fit(tokens: list[int], seconds: list[float]) -> tuple[float, float]:
    """Ordinary least squares with an intercept: b = cov(tokens, seconds) / var(tokens), a = mean(s) - b mean(t)."""
    n = len(tokens)
    mt, ms = sum(tokens) / n, sum(seconds) / n
    cov = sum((t - mt) * (s - ms) for t, s in zip(tokens, seconds, strict=True))
    var = sum((t - mt) ** 2 for t in tokens)
    b = cov / var
    return ms - b * mt, b
