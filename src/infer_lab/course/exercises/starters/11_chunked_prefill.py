"""Chapter 11 · Chunked prefill: exercises.

Fill in each function, then run `infer-lab check 11`. The setting for both: ``num_decoding``
requests are decoding (one token per step each) when a prompt of ``prompt_len`` tokens
arrives. With chunked prefill a step computes at most ``budget`` tokens (assume
``num_decoding < budget``), decodes first; without it, a prompt is computed whole in one step.
"""


def chunk_sizes(prompt_len: int, budget: int, num_decoding: int) -> list[int]:
    """Predict the prompt tokens computed in each step until the prompt is prefilled (chunked)."""
    raise NotImplementedError


def worst_step_tokens(prompt_len: int, num_decoding: int, budget: int, chunked: bool) -> int:
    """Predict the most tokens one step computes while the prompt is prefilled (decodes included)."""
    raise NotImplementedError


def split_budget(tokens_to_compute: list[int], budget: int | None) -> list[int]:
    """How many tokens each running request computes in the next step: chunked prefill's split.

    Build it: the engine's scheduler calls this once per step, before any waiting request joins.
    ``tokens_to_compute`` holds what every running request still has to compute, oldest request
    first: 1 for a request that decodes, more for a prompt that is still being prefilled.
    ``budget`` is the step's token budget, or ``None`` when chunked prefill is off (no budget:
    every request computes all it has in one step, however long).

    Returns:
        one count per running request, in the same order: the tokens it computes this step
        (0: it waits a step). The counts never add up to more than the budget, so a long prompt
        is computed in chunks over several steps; what they leave of the budget goes to the
        waiting requests (chapter 09's ``admit_tokens``).
    """
    raise NotImplementedError
