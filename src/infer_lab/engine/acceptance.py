"""Speculative decoding's verification: which drafted tokens the target keeps, and the next token.

A proposer guesses ``k`` tokens ``d_1 .. d_k``. The target model then runs *one* forward pass
over ``[t, d_1, .., d_k]`` (``t`` is the newest real token) and produces ``k + 1`` next-token
distributions ``p_0 .. p_k``: ``p_{i-1}`` is what the target wants at the position of ``d_i``.

* **Greedy**: keep the longest prefix on which the draft equals the target's argmax, then add
  the target's own token at the first disagreement (or after the last draft). The output is
  exactly what plain greedy decoding would produce, only computed in fewer target passes.
* **Sampling** (Leviathan et al. 2023; Chen et al. 2023): keep ``d_i`` with probability
  ``min(1, p(d_i) / q(d_i))``, where ``q`` is the distribution the draft sampled it from. At the
  first rejection, sample from the residual ``norm(max(p - q, 0))`` and stop. If every draft is
  kept, sample one more token from ``p_k``. Each emitted token is then distributed exactly as
  the target's own sample would be, whatever the draft proposed.

Either way a pass yields between 1 and ``k + 1`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one sequence's draft: tokens to append, how many drafts were kept."""

    tokens: list[int]  # accepted drafts, then the target's own token
    accepted: int  # how many of the drafted tokens were kept (0 .. k)
    proposed: int  # k


def verify_greedy(drafts: list[int], target_argmax: list[int]) -> Verdict:
    """Greedy verification: ``target_argmax`` has ``len(drafts) + 1`` entries (argmax of p_0 .. p_k)."""
    if len(target_argmax) != len(drafts) + 1:
        raise ValueError(f"need {len(drafts) + 1} target tokens for {len(drafts)} drafts, got {len(target_argmax)}")
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target_argmax[accepted]:
        accepted += 1
    return Verdict(drafts[:accepted] + [target_argmax[accepted]], accepted, len(drafts))


def verify_sampling(drafts: list[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                    generator: torch.Generator | None) -> Verdict:
    """Rejection-sampling verification.

    Args:
        drafts: the ``k`` drafted token ids.
        draft_probs: ``(k, vocab)``: the distribution each draft was sampled from; ``None``
            when the proposer is deterministic (n-gram lookup), i.e. ``q`` is a point mass on
            each draft, so a draft is kept with probability ``p(d_i)``.
        target_probs: ``(k + 1, vocab)``: the target's distributions ``p_0 .. p_k`` after
            temperature / top-k / top-p, fp32, rows summing to 1.
        generator: the request's random generator (same seed, same tokens).

    If ``p == q`` on the whole support every draft is kept; the residual's 0/0 is guarded anyway.
    """
    k = len(drafts)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} target distributions for {k} drafts, got {target_probs.shape[0]}")
    for i, token in enumerate(drafts):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[token] = 1.0
        else:
            q = draft_probs[i]
        keep = min(1.0, float(p[token]) / max(float(q[token]), 1e-30))
        if float(torch.rand((), generator=generator)) < keep:
            continue
        residual = (p - q).clamp_min(0)
        total = float(residual.sum())
        residual = residual / total if total > 0 else p
        token_out = int(torch.multinomial(residual, 1, generator=generator))
        return Verdict(drafts[:i] + [token_out], i, k)
    bonus = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return Verdict(list(drafts) + [bonus], k, k)


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Tokens one target pass yields when each draft is kept independently with probability ``alpha``.

    ``1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)``.
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Wall-time speedup over plain decoding: tokens per pass / (k * c + 1).

    ``cost_ratio`` c is the time of one draft step over the time of one target step.
    """
    return expected_tokens_per_pass(alpha, k) / (k * cost_ratio + 1)


def alpha_from_tokens_per_pass(tokens_per_pass: float, k: int, tol: float = 1e-9) -> float:
    """The i.i.d. acceptance ``alpha`` that would give ``tokens_per_pass`` at ``k``, by bisection.

    The inverse of :func:`expected_tokens_per_pass`, which rises monotonically in ``alpha``
    from 1 (alpha = 0) to ``k + 1`` (alpha = 1).
    """
    if not 1 <= tokens_per_pass <= k + 1:
        raise ValueError(f"tokens per pass must be in [1, {k + 1}], got {tokens_per_pass}")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if expected_tokens_per_pass(mid, k) < tokens_per_pass:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
