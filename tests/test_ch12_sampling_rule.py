"""Speculative sampling keeps the target's distribution: a statistical test of the engine's rule.

``verify_sampling`` (Leviathan et al. 2023; Chen et al. 2023) keeps draft ``d_i`` with probability
``min(1, p(d_i) / q(d_i))``, else samples the residual ``norm(max(p - q, 0))`` and stops, and adds a
bonus token from ``p_k`` when every draft is kept. Then the token at every position of a pass is
distributed as the target's own ``p_i``, whatever the draft proposed. The test draws many passes
on small fixed distributions (seeded) and runs a chi-square goodness-of-fit test per position.

False-alarm rate: each chi-square test rejects a correct rule with probability :data:`FALSE_ALARM`
(1e-4); the three runs of correct rules here make nine such tests (positions 0, 1, 2 each), so a
correct rule fails with probability under 9e-4. The seeds are fixed, so the outcome is repeatable. Near-miss rules, each a one-line change a learner might
make, must fail; a correct rule written differently must pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from infer_lab.engine.acceptance import Verdict, verify_sampling

FALSE_ALARM = 1e-4
VOCAB = 5  # chi-square with VOCAB - 1 = 4 degrees of freedom (even: closed-form tail)
# Target rows p_0..p_2 and draft rows q_1..q_2: different shapes, every token possible.
P = torch.tensor([[0.50, 0.20, 0.15, 0.10, 0.05],
                  [0.05, 0.15, 0.20, 0.25, 0.35],
                  [0.20, 0.20, 0.20, 0.20, 0.20]])
Q = torch.tensor([[0.10, 0.10, 0.20, 0.30, 0.30],
                  [0.30, 0.30, 0.20, 0.10, 0.10]])
NGRAM_DRAFTS = [0, 3]  # a deterministic proposer's guesses (q a point mass on each)


def chi2_sf_even_df(x: float, df: int) -> float:
    """P(chi-square with ``df`` (even) degrees of freedom > x) = exp(-x/2) sum_{j < df/2} (x/2)^j / j!."""
    assert df % 2 == 0
    return math.exp(-x / 2) * sum((x / 2) ** j / math.factorial(j) for j in range(df // 2))


def chi2_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = float(counts.sum())
    expected = n * probs.double()
    stat = float(((counts.double() - expected) ** 2 / expected).sum())
    return chi2_sf_even_df(stat, len(probs) - 1)


def position_counts(rule: Callable[..., Verdict], k: int, n: int, seed: int,
                    sampled_drafts: bool = True) -> tuple[torch.Tensor, list[int]]:
    """Run ``n`` passes of ``rule`` with k drafts (sampled from Q, or the fixed
    :data:`NGRAM_DRAFTS` when ``sampled_drafts`` is False): counts[i, t] of token t at position i of the emitted
    tokens, and how many passes kept every draft but did not emit k + 1 tokens."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(k + 1, VOCAB, dtype=torch.long)
    missing_bonus = 0
    for _ in range(n):
        if sampled_drafts:
            drafts = [int(torch.multinomial(Q[i], 1, generator=gen)) for i in range(k)]
            verdict = rule(drafts, Q[:k], P[: k + 1], gen)
        else:
            verdict = rule(NGRAM_DRAFTS[:k], None, P[: k + 1], gen)
        for i, token in enumerate(verdict.tokens):
            counts[i, token] += 1
        missing_bonus += verdict.accepted == k and len(verdict.tokens) != k + 1
    return counts, [missing_bonus]


def assert_target_distribution(counts: torch.Tensor) -> None:
    for i, row in enumerate(counts):
        p = chi2_p_value(row, P[i])
        assert p > FALSE_ALARM, f"position {i}: tokens {row.tolist()} vs target {P[i].tolist()}, p = {p:.2e}"


# Near misses: one-line changes of the rule.
def residual_is_p(drafts, draft_probs, target_probs, generator):
    """At a rejection, sample p itself instead of the residual max(p - q, 0)."""
    for i, token in enumerate(drafts):
        p, q = target_probs[i], draft_probs[i]
        if float(torch.rand((), generator=generator)) < min(1.0, float(p[token] / q[token])):
            continue
        return Verdict(drafts[:i] + [int(torch.multinomial(p, 1, generator=generator))], i, len(drafts))
    return Verdict(list(drafts) + [int(torch.multinomial(target_probs[-1], 1, generator=generator))],
                   len(drafts), len(drafts))


def inverted_ratio(drafts, draft_probs, target_probs, generator):
    """Keep a draft with probability min(1, q(d) / p(d)): the ratio upside down."""
    flipped = lambda i, t: min(1.0, float(draft_probs[i][t] / target_probs[i][t]))  # noqa: E731
    for i, token in enumerate(drafts):
        if float(torch.rand((), generator=generator)) < flipped(i, token):
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
        return Verdict(drafts[:i] + [int(torch.multinomial(residual, 1, generator=generator))], i, len(drafts))
    return Verdict(list(drafts) + [int(torch.multinomial(target_probs[-1], 1, generator=generator))],
                   len(drafts), len(drafts))


def point_mass_rule(drafts, draft_probs, target_probs, generator):
    """Correct, written differently: treat a sampled draft as a fixed guess (keep it with p(d), else
    sample p without d). It keeps fewer drafts than the engine's rule, but the tokens are still p's."""
    return verify_sampling(drafts, None, target_probs, generator)


def no_bonus(drafts, draft_probs, target_probs, generator):
    """Forget the bonus token when every draft is kept."""
    verdict = verify_sampling(drafts, draft_probs, target_probs, generator)
    return Verdict(verdict.tokens[: len(drafts)], verdict.accepted, verdict.proposed)


@pytest.mark.parametrize("sampled_drafts", [True, False], ids=["draft-model", "ngram"])
def test_the_engines_rule_reproduces_the_target_distribution(sampled_drafts):
    counts, (missing_bonus,) = position_counts(verify_sampling, k=2, n=6000, seed=11,
                                               sampled_drafts=sampled_drafts)
    assert counts[0].sum() == 6000 and counts[2].sum() > 300  # every position was reached often
    assert_target_distribution(counts)
    assert missing_bonus == 0


@pytest.mark.parametrize("rule", [residual_is_p, inverted_ratio], ids=lambda r: r.__name__)
def test_a_near_miss_rule_is_caught(rule):
    counts, _ = position_counts(rule, k=2, n=6000, seed=11)
    with pytest.raises(AssertionError, match="position"):
        assert_target_distribution(counts)


def test_a_correct_rule_written_differently_passes():
    counts, (missing_bonus,) = position_counts(point_mass_rule, k=2, n=6000, seed=12)
    assert_target_distribution(counts)
    assert missing_bonus == 0


def test_a_forgotten_bonus_token_is_caught():
    counts, (missing_bonus,) = position_counts(no_bonus, k=2, n=2000, seed=11)
    assert counts[2].sum() == 0 and missing_bonus > 0
