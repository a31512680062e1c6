"""Chapter 15 · The cluster: exercises.

Fill in each function, then run `infer-lab check 15`. Times are seconds, rates per second.
"""


def colocated_capacity_rps(n_gpus: int, prefill_s: float, decode_step_s: float, decode_batch: int,
                           output_tokens: int) -> float:
    """Predict the requests/s a colocated cluster of ``n_gpus`` (one instance per GPU) sustains.

    Each request costs its GPU one prefill (``prefill_s``) and ``output_tokens`` decode steps, each
    of ``decode_step_s`` but shared by the ``decode_batch`` requests decoding together.
    """
    raise NotImplementedError


def step_cost_fit(tokens: list[int], seconds: list[float]) -> tuple[float, float]:
    """Least-squares fit of ``seconds = a + b x tokens`` to an engine's steps: return ``(a, b)``.

    ``tokens[i]`` is the number of tokens step ``i`` computed, ``seconds[i]`` its time. ``a`` is
    what a step costs whatever it computes (reading the weights), ``b`` each token's extra.
    """
    raise NotImplementedError
