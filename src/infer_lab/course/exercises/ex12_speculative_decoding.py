"""Chapter 12's exercises: greedy verification, the sampling acceptance rule, tokens per pass, prompt lookup."""

from __future__ import annotations

import random

import torch

from ...engine.acceptance import expected_tokens_per_pass, verify_greedy, verify_sampling
from ...engine.proposers import NgramProposer
from . import Exercise
from .checking import plain

NUMBER = "12"
SLUG = "speculative_decoding"
TITLE = "12 · Speculative decoding"

GREEDY_CASES = (([5, 6, 7], [5, 6, 7, 8]), ([5, 6, 7], [5, 9, 7, 8]), ([5, 6, 7], [1, 6, 7, 8]), ([], [4]),
                ([3, 3], [3, 3, 3]), ([2, 4, 6, 8], [2, 4, 6, 9, 1]))


def check_verify_greedy(fns, r) -> None:
    for drafts, target in GREEDY_CASES:
        case = f"drafts {drafts}, target argmax {target}"
        got = r.call(fns.verify_greedy, list(drafts), list(target), case=case)
        verdict = verify_greedy(drafts, target)
        expected = (verdict.tokens, verdict.accepted)
        got = (list(got[0]), got[1]) if isinstance(got, (tuple, list)) and len(got) == 2 else got
        r.equal(case, got, expected, hint="keep drafts while they equal the target's argmax at their position; "
                                         "then append the target's own token at the first disagreement (or "
                                         "after the last draft): a pass always yields at least one token")


def _distribution(g: torch.Generator, vocab: int, peaked: bool = False) -> torch.Tensor:
    logits = torch.randn(vocab, generator=g, dtype=torch.float64) * (3.0 if peaked else 1.0)
    return torch.softmax(logits, dim=0)


def _pairs():
    g = torch.Generator().manual_seed(11)
    p = _distribution(g, 8)
    yield FIRST_PAIR, p, _distribution(g, 8)
    yield "a confident draft (peaked q)", p, _distribution(g, 8, peaked=True)
    point = torch.zeros(8, dtype=torch.float64)
    point[3] = 1.0
    yield "a deterministic draft (n-gram lookup: q is a point mass)", p, point
    yield "a draft equal to the target", p, p.clone()
    half = torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0, 0], dtype=torch.float64)
    yield "a draft that never proposes half the target's tokens", torch.full((8,), 1 / 8, dtype=torch.float64), half


FIRST_PAIR = "a random draft q vs target p"
ENGINE_RUNS = 2000
ENGINE_TOL = 0.04  # about 3.5 standard deviations of a frequency over 2000 runs
EXACT_TOL = 1e-6  # "exactly p" in float32 arithmetic (torch's default dtype): a few ulp of 6e-8


def _engine_first_token_frequencies(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """How often the engine's verify_sampling emits each token first, one draft sampled from q per run."""
    g = torch.Generator().manual_seed(111)
    counts = torch.zeros_like(p)
    target = torch.stack([p, p]).float()
    for _ in range(ENGINE_RUNS):
        draft = int(torch.multinomial(q.float(), 1, generator=g))
        verdict = verify_sampling([draft], q.float()[None], target, g)
        counts[verdict.tokens[0]] += 1
    return counts / ENGINE_RUNS


def check_sampling_rule(fns, r) -> None:
    for name, p, q in _pairs():
        case = f"{name}: the emitted token's distribution"
        accept = torch.zeros_like(p)
        for x in range(len(p)):
            if q[x] > 0:
                a = r.call(fns.acceptance_probability, float(p[x]), float(q[x]), case=case)
                accept[x] = float(a)
        if bool((accept < 0).any() or (accept > 1 + 1e-12).any()):
            x = int(((accept < 0) | (accept > 1 + 1e-12)).nonzero()[0])
            r.record(case, False, f"acceptance probability {float(accept[x]):.4g} for p={float(p[x]):.4g}, "
                                  f"q={float(q[x]):.4g} is not a probability: keep it in [0, 1] (min(1, ...))")
            continue
        kept = q * accept  # drafted AND kept
        rejected = 1 - float(kept.sum())
        emitted = kept.clone()
        if rejected > 1e-12:
            residual = r.call(fns.residual_distribution, p.clone(), q.clone(), case=case)
            residual = torch.as_tensor(residual, dtype=torch.float64)
            if abs(float(residual.sum()) - 1) > EXACT_TOL:
                r.record(case, False, f"the residual sums to {float(residual.sum()):.6g}: it is sampled from, "
                                      "so normalize it to sum 1")
                continue
            emitted = emitted + rejected * residual
        worst = int((emitted - p).abs().argmax())
        err = float((emitted - p).abs().max())
        r.record(case, err < EXACT_TOL,
                 f"equals the target p exactly (max |difference| {err:.1e})" if err < EXACT_TOL else
                 f"P(token {worst}) is {float(emitted[worst]):.5f} but the target gives {float(p[worst]):.5f} "
                 f"(max |difference| {err:.3g}): the output must follow p whatever the draft; keep a draft with "
                 f"min(1, p/q) and on rejection sample from max(p - q, 0), normalized")
        if err < EXACT_TOL and name == FIRST_PAIR:
            gap = float((_engine_first_token_frequencies(p, q) - emitted).abs().max())
            r.record(f"{name}: the engine's verify_sampling, {ENGINE_RUNS} seeded runs", gap < ENGINE_TOL,
                     f"emits your distribution to within {gap:.3f} (sampling noise; allowed {ENGINE_TOL})")


ALPHA_CASES = ((0.0, 4), (0.5, 4), (0.7, 5), (0.9, 8), (1.0, 4), (0.8, 0), (0.3, 1))


def check_tokens_per_pass(fns, r) -> None:
    for alpha, k in ALPHA_CASES:
        case = f"acceptance {alpha:g}, {k} drafts per pass"
        got = r.call(fns.tokens_per_pass, alpha, k, case=case)
        expected = expected_tokens_per_pass(alpha, k)
        r.close(case, got, expected, rel_tol=1e-9, unit="tokens/pass",
                wrong={"the drafts alone: the target's own token comes on top": expected - 1,
                       "k x alpha + 1: draft i is kept only if drafts 1..i-1 were too": k * alpha + 1}
                if 0 < alpha < 1 and k > 1 else None)


def _ngram_cases():
    rng = random.Random(11)
    noise = [rng.randrange(5) for _ in range(40)]
    yield [1, 2, 3, 9, 9, 1, 2, 3], 3, 3, 1
    yield [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2], 4, 3, 1
    yield [7, 8, 1, 7, 8, 2, 7, 8], 2, 2, 1
    yield [4, 5, 6], 3, 3, 1
    yield [1, 2, 1, 3, 1, 4, 1], 5, 3, 2
    yield [1, 2, 1, 3, 1, 4, 1], 5, 3, 1
    yield noise, 4, 3, 1
    yield [5, 1, 2, 1, 1], 3, 1, 1  # the latest occurrence of [1] ends right where the suffix starts
    yield [3, 1, 2, 1, 2], 2, 3, 2  # [1, 2] occurs at 1..2, just before the suffix at 3..4


def _lookup_variant(tokens: list[int], k: int, max_n: int, min_n: int, *, skip_adjacent: bool = False,
                    oldest: bool = False, shortest: bool = False) -> list[int]:
    """NgramProposer.lookup with one known mistake, to name it when the learner's answer equals it."""
    length = len(tokens)
    sizes = list(range(min(max_n, length - 1), min_n - 1, -1))
    for n in (reversed(sizes) if shortest else sizes):
        suffix = tokens[length - n:]
        starts = list(range(length - n - (2 if skip_adjacent else 1), -1, -1))
        for start in (reversed(starts) if oldest else starts):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def check_ngram(fns, r) -> None:
    for tokens, k, max_n, min_n in _ngram_cases():
        case = f"tokens {tokens if len(tokens) < 16 else str(tokens[:12])[:-1] + ', ...]'}, k={k}, n from {max_n} down to {min_n}"
        got = plain(r.call(fns.ngram_lookup, list(tokens), k, max_n, min_n, case=case))
        expected = NgramProposer(max_n, min_n).lookup(tokens, k)
        hints = [("skip_adjacent", "the occurrence that ends right where the suffix starts counts too: scan "
                                   "starts from len(tokens) - n - 1"),
                 ("oldest", "the MOST RECENT earlier occurrence wins: scan from the end backwards"),
                 ("shortest", "try the LONGEST suffix first (n from max_n down to min_n)")]
        hint = next((text for flag, text in hints if got != expected
                     and got == _lookup_variant(tokens, k, max_n, min_n, **{flag: True})), None)
        r.equal(case, got, expected,
                hint=hint or "try the longest suffix first; the most recent earlier occurrence wins; propose the "
                             "(at most k) tokens that followed it; nothing when no n-gram matches")


EXERCISES = [
    Exercise("verify_greedy", "Greedy verification", "implement",
             "Keep the drafted tokens the target agrees with and add the target's own; checked against the "
             "engine's verify_greedy.", check_verify_greedy),
    Exercise("acceptance_probability", "The speculative sampling rule", "implement",
             "Write the acceptance probability and the residual distribution of speculative sampling; checked "
             "exactly: the emitted token must follow the target's distribution whatever the draft.",
             check_sampling_rule, functions=("acceptance_probability", "residual_distribution")),
    Exercise("tokens_per_pass", "Tokens per target pass", "predict",
             "Predict the tokens one target pass yields from the acceptance rate and the draft length; "
             "checked against the engine's expected_tokens_per_pass.", check_tokens_per_pass),
    Exercise("ngram_lookup", "Prompt lookup", "implement",
             "Propose drafts by finding the text's last n-gram earlier in it; checked against the engine's "
             "NgramProposer.lookup.", check_ngram),
]
