"""Chapter 12 · Speculative decoding: exercises.

Fill in each function, then run `infer-lab check 12`. A proposer drafts k tokens d_1..d_k;
the target model checks them all in one forward pass.
"""

import torch


def verify_greedy(drafts: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """Greedy verification of one sequence's drafts.

    ``target_argmax`` has ``len(drafts) + 1`` entries: entry i is the target's greedy token at
    the position of draft i+1 (the last one follows the last draft).

    Returns:
        ``(tokens, accepted)``: the tokens to append (the kept drafts, then one token of the
        target's own) and how many drafts were kept.
    """
    raise NotImplementedError


def acceptance_probability(p_token: float, q_token: float) -> float:
    """The probability of keeping a drafted token under speculative sampling.

    ``p_token`` is the target's probability of the drafted token, ``q_token`` (> 0) the
    probability with which the draft proposed it.
    """
    raise NotImplementedError


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to sample from when a draft is rejected (vocab-sized, sums to 1).

    Together with :func:`acceptance_probability` it must make the emitted token follow the
    target's ``p`` exactly, whatever the draft's ``q``.
    """
    raise NotImplementedError


def tokens_per_pass(alpha: float, k: int) -> float:
    """Predict the expected tokens one target pass yields with ``k`` drafts.

    Each draft is kept with probability ``alpha``, independently, but only while all drafts
    before it were kept; the target always adds one token of its own.
    """
    raise NotImplementedError


def ngram_lookup(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Prompt lookup: draft up to ``k`` tokens by finding the text's ending earlier in the text.

    For n from ``max_n`` down to ``min_n``: take the last n tokens; find their most recent
    earlier occurrence (one that ends before the last token); propose the tokens that followed
    it, at most ``k``. The first n that matches wins; no match proposes ``[]``.
    """
    raise NotImplementedError
