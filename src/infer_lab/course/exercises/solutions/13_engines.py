"""Chapter 13 · Engines: reference solutions."""


def tpot_s(ttft_s: float, e2e_s: float, output_tokens: int) -> float | None:
    """n tokens have n - 1 gaps after the first one."""
    if output_tokens < 2:
        return None
    return (e2e_s - ttft_s) / (output_tokens - 1)


def itl_and_tpot_means(token_times_s: list[list[float]]) -> tuple[float, float]:
    """ITL: the mean of all gaps pooled; TPOT: the mean of each request's own average gap."""
    gaps = [times[i + 1] - times[i] for times in token_times_s for i in range(len(times) - 1)]
    tpots = [tpot_s(t[0], t[-1], len(t)) for t in token_times_s]
    tpots = [t for t in tpots if t is not None]
    return sum(gaps) / len(gaps), sum(tpots) / len(tpots)


def goodput_per_s(requests: list[tuple[float, float | None] | None], ttft_slo_ms: float,
                  tpot_slo_ms: float, duration_s: float) -> float:
    """Successful requests within both SLOs, per second of the run."""
    good = 0
    for request in requests:
        if request is None:
            continue
        ttft, tpot = request
        if ttft * 1e3 <= ttft_slo_ms and (tpot is None or tpot * 1e3 <= tpot_slo_ms):
            good += 1
    return good / duration_s
