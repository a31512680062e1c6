"""Chapter 10 · Prefix caching: exercises.

Fill in each function, then run `infer-lab check 10`. Prompts are lists of token ids.
"""


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """One hash per FULL block of ``tokens`` (a partial last block gets none).

    Two requests may share block i's K/V only if their tokens agree on block i AND on every
    block before it (K/V depend on the whole prefix). Make each block's hash depend on both:
    Python's ``hash()`` of a tuple of ints is deterministic.
    """
    raise NotImplementedError


def reused_tokens(shared: int, new_prompt_len: int, block_size: int, cache: str) -> int:
    """Predict how many of a new prompt's tokens the prefix cache hands over.

    An earlier request, now cached, shared the new prompt's first ``shared`` tokens (then
    differed). ``cache`` is ``"hash"`` (vLLM style: whole blocks of ``block_size``) or
    ``"radix"`` (SGLang style with this engine's copy-on-write of a partly matching block: token
    by token). The last prompt token is always computed, because its logits give the first
    output token.
    """
    raise NotImplementedError


def shared_prompt_hit_rate(n_requests: int, system_tokens: int, user_tokens: int, block_size: int,
                           cache: str) -> float:
    """Predict the prefix-cache hit rate of requests that share a system prompt.

    Request i is the same ``system_tokens``-token system prompt followed by ``user_tokens``
    tokens of its own; requests run one after another, each cached when done. Hit rate =
    prompt tokens found in the cache / all prompt tokens (a fraction, 0..1).
    """
    raise NotImplementedError
