"""Stage 6 · Sampling and speculation: the next token, and speculative decoding's two rules.

After each forward pass the engine's step loop hands the logits to your ``Sampler``:

* ``sample``: one token per request that is not speculating this step. A greedy request takes
  the argmax; any other draws from ``softmax(filter(logits / temperature))`` where the filter
  keeps the top-k tokens, then the top-p nucleus of those. Draw with the request's **own**
  ``torch.Generator`` (the one passed in for its row), never the global RNG: a request with a seed
  must get the same tokens every time, whatever else the engine runs beside it.
* ``verify``: a request that carries ``k`` speculative guesses ``d_1 .. d_k`` gets ``k + 1`` rows
  of logits from one forward pass (row ``i`` is the target's next-token distribution ``p_i`` at
  the position of guess ``d_{i+1}``; the last row follows the last guess). Greedy requests keep
  guesses while they equal the argmax. Sampling requests follow the speculative sampling rule
  (Leviathan et al. 2023; Chen et al. 2023): keep ``d_i`` with probability ``min(1, p(d_i) / q(d_i))``;
  at the first rejection draw from ``norm(max(p - q, 0))`` and stop; if every guess is kept,
  draw one more (bonus) token from ``p_k``. Every emitted token is then distributed exactly as
  the target's own sample, whatever the guesses were.

The guesses come from your ``NgramProposer`` (prompt lookup): the text's last ``n`` tokens,
found earlier in the text, and what followed them there. No model, so ``q`` is a point mass on
each guess (``draft_probs`` is ``None``).

Dtypes and devices: logits are float32, ``(rows, vocab)``, on the model's device (the CPU in the
checks); ``draft_probs`` is float32 ``(k, vocab)`` or ``None``. Return plain Python ints (a list or
tuple; numpy or tensor values are converted for you).

Write the small functions first (chapter 12's exercises), then the two classes from them.
Check it: ``infer-lab check engine sampling``. Your sampler and proposer then run inside the real
engine: the samples are tested against the target's distribution (a statistical test at a stated
false-alarm rate), greedy speculation is compared token for token with transformers, and
speculating sampling requests are checked to follow the target's distribution. The library's
version: ``src/infer_lab/engine/sampling.py`` (``Sampler``), ``acceptance.py`` and
``proposers.py`` (``NgramProposer``).
"""

import torch

from infer_lab.engine.proposers import Proposal  # noqa: F401  (propose returns one per request)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logits`` ``(vocab,)`` float32 (already divided by the temperature) with every token outside
    the kept set set to ``-inf``; the kept ones unchanged. A new tensor: leave the input as it was.

    * top-k (``0 < top_k < vocab``; 0 = no limit): keep the ``top_k`` largest logits. Where several
      tie for the k-th place you may keep all of them or break the tie: either is right.
    * then top-p (``top_p < 1``; 1.0 = no limit): over what top-k left, renormalized, keep the
      smallest set of most likely tokens whose probability sums to at least ``top_p``. The token
      whose probability takes the sum to ``top_p`` or past it is kept; the most likely token is
      always kept.
    """
    raise NotImplementedError


def verify_greedy(drafts: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """Greedy verification of one request's guesses.

    ``target_argmax`` has ``len(drafts) + 1`` entries: entry ``i`` is the target's greedy token at
    the position of guess ``i + 1`` (the last one follows the last guess).

    Returns ``(tokens, kept)``: the kept guesses (the longest prefix that agrees with the target),
    then one token of the target's own; ``kept`` is how many guesses were kept. A pass always
    yields at least one token.
    """
    raise NotImplementedError


def acceptance_probability(p_token: float, q_token: float) -> float:
    """The probability of keeping a guess: ``p_token`` is the target's probability of it, ``q_token``
    (> 0) the probability with which the draft proposed it. A probability: in [0, 1]."""
    raise NotImplementedError


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to draw from when a guess is rejected: ``(vocab,)``, non-negative, summing to 1.

    With :func:`acceptance_probability` it must make the emitted token follow the target's ``p``
    exactly, whatever the draft's ``q``.
    """
    raise NotImplementedError


def ngram_lookup(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Prompt lookup: up to ``k`` guesses from the text's ending found earlier in the text.

    For ``n`` from ``max_n`` down to ``min_n``: take the last ``n`` tokens; find their most recent
    earlier occurrence anywhere in ``tokens`` (one that starts before the suffix does; it may
    overlap the suffix); propose the tokens that followed it, at most ``k``. The first ``n`` that
    matches wins; nothing matches: ``[]``.
    """
    raise NotImplementedError


class Sampler:
    """The engine's sampler. The engine builds one with ``Sampler()``."""

    def sample(self, logits: torch.Tensor, params: list, generators: list) -> list[int]:
        """One token id per row of ``logits`` ``(rows, vocab)`` float32.

        Row ``i`` belongs to a request with ``params[i]`` (a ``SamplingParams``: ``greedy``,
        ``temperature``, ``top_k``, ``top_p``) and its own ``generators[i]`` (a ``torch.Generator``;
        ``None`` for greedy requests). Greedy rows: the argmax. Others: one draw from
        ``softmax(filter_logits(row / temperature, top_k, top_p))`` with ``generators[i]``.
        """
        raise NotImplementedError

    def verify(self, drafts: list[int], draft_probs: torch.Tensor | None, logits: torch.Tensor, params,
               generator: torch.Generator | None) -> tuple[list[int], int]:
        """Verify ``k = len(drafts)`` guesses against the target's ``logits`` ``(k + 1, vocab)`` float32.

        ``draft_probs`` ``(k, vocab)``: the distribution ``q_i`` each guess was drawn from, or ``None``
        for a deterministic proposer (``q_i`` is a point mass on ``d_i``). ``params`` is the request's
        ``SamplingParams`` (the target's ``p_i`` is ``softmax(filter_logits(logits[i] / T, ...))``),
        ``generator`` its own generator (``None`` when greedy).

        Returns ``(tokens, kept)``: the ``kept`` guesses that were kept, then exactly one token of the
        target's own (``len(tokens) == kept + 1``).
        """
        raise NotImplementedError


class NgramProposer:
    """Speculative guesses by prompt lookup. The engine builds one with ``NgramProposer(max_n)``
    (``speculative="ngram:N"``; 3 by default) and looks for n-grams of ``max_n`` down to 1 tokens."""

    def __init__(self, max_n: int) -> None:
        raise NotImplementedError

    def propose(self, seqs: list, ks: list[int]) -> list:
        """One ``Proposal(tokens)`` per request in ``seqs`` (engine ``Sequence``s: ``seq.all_ids`` is the
        prompt and the output so far), at most ``ks[i]`` guesses for ``seqs[i]`` (0: none)."""
        raise NotImplementedError

    def rollback(self, seq, num_valid: int) -> None:
        """After verification: ``seq``'s first ``num_valid`` tokens are final; forget any state kept
        for guesses beyond them (a draft model's cache would roll back here)."""
        raise NotImplementedError

    def release(self, seq) -> None:
        """``seq`` finished or left: drop anything kept for it."""
        raise NotImplementedError
