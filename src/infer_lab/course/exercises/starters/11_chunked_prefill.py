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
