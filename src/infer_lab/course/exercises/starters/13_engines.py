"""Chapter 13 · Engines: exercises.

Fill in each function, then run `infer-lab check 13`. Times are seconds after the request
was sent unless a name says ms. TTFT: send -> first token; E2E: send -> last token.
"""


def tpot_s(ttft_s: float, e2e_s: float, output_tokens: int) -> float | None:
    """Time per output token of one request: the average gap between its tokens after the first.

    None when the request produced fewer than 2 tokens.
    """
    raise NotImplementedError


def itl_and_tpot_means(token_times_s: list[list[float]]) -> tuple[float, float]:
    """Predict the mean ITL and the mean TPOT of a set of requests.

    ``token_times_s[i]`` lists when request i received each of its tokens (seconds after its
    send; the first is its TTFT). ITL pools every gap between consecutive tokens of every
    request (token-weighted); TPOT is one value per request (request-weighted).

    Returns:
        ``(mean ITL, mean TPOT)`` in seconds.
    """
    raise NotImplementedError


def goodput_per_s(requests: list[tuple[float, float | None] | None], ttft_slo_ms: float,
                  tpot_slo_ms: float, duration_s: float) -> float:
    """Requests per second that met both SLOs over a run of ``duration_s`` seconds.

    ``requests[i]`` is ``(ttft_s, tpot_s)`` of a request that succeeded (``tpot_s`` None when
    it produced one token), or None for a request that failed.
    """
    raise NotImplementedError
