"""Stage 6, sampling and speculation: the starter fails, the solution passes, near misses are caught by
name, and correct answers written differently pass."""

from __future__ import annotations

import pytest
from track_helpers import (
    assert_near_miss_caught,
    assert_variant_passes,
    check_text,
    failures,
    mutated,
    solution_result,
)

from infer_lab.course import track

KEY = "sampling"


def test_the_starter_is_not_done_and_the_solution_passes(tmp_path, track_solutions):
    starter = track.starter_path(track.stage(KEY)).read_text()
    assert check_text(KEY, starter, tmp_path).status == "todo"
    result = solution_result(track_solutions, KEY)
    assert result.passed, failures(result)
    assert result.tokens_identical and len(result.engine_runs) == 2
    details = {o.case: o.detail for o in result.outcomes}
    # The runs really exercised what they claim: guesses kept and rejected inside the engine.
    engine = next(d for c, d in details.items() if c.startswith("inside the engine: 1000 sampling requests"))
    assert "kept" in engine and "rejected" in engine
    assert "guesses verified" in next(d for c, d in details.items() if "seeded sampling requests" in c)


NEAR_MISSES = [  # (name, old, new, what the check must say)
    ("ngram-refuses-overlap", "for start in range(length - n - 1, -1, -1):",
     "for start in range(length - 2 * n, -1, -1):", "may overlap the suffix"),
    ("ngram-window-of-48", "for start in range(length - n - 1, -1, -1):",
     "for start in range(length - n - 1, max(-1, length - 48), -1):", "search the whole text"),
    ("top-p-drops-the-crossing-token", "before = torch.cumsum(probs, dim=-1) - probs",
     "before = torch.cumsum(probs, dim=-1)", "must be kept"),
    ("keep-p-over-q-without-min", "return min(1.0, p_token / q_token)", "return p_token / q_token",
     "not a probability"),
    ("residual-not-normalized", "return residual / total if total > 0 else p", "return residual",
     "normalize it to sum 1"),
    ("no-bonus-token", "return drafts + [draw(p[-1], generator)], len(drafts)", "return list(drafts), len(drafts)",
     "add a bonus token"),
    ("global-rng", "return int(torch.multinomial(probs, 1, generator=generator))",
     "return int(torch.multinomial(probs, 1))", "never the global RNG"),
    ("temperature-ignored", "filter_logits(row / params.temperature, params.top_k, params.top_p)",
     "filter_logits(row, params.top_k, params.top_p)", "the temperature is ignored"),
    ("rejection-draws-from-p", "draw(residual_distribution(p[i], q), generator)", "draw(p[i], generator)",
     "draw from the residual"),
    ("bonus-from-the-last-guess-row", "return drafts + [draw(p[-1], generator)], len(drafts)",
     "return drafts + [draw(p[-2], generator)], len(drafts)", "the bonus token comes from the row after"),
]


@pytest.mark.parametrize("name, old, new, phrase", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_a_near_miss_is_caught(tmp_path, name, old, new, phrase):
    assert_near_miss_caught(KEY, old, new, phrase, tmp_path)


VARIANTS = {  # correct answers written differently
    "inverse-cdf-with-the-generator": {
        "    return int(torch.multinomial(probs, 1, generator=generator))":
        "    cdf = torch.cumsum(probs.double(), dim=0)\n"
        "    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * float(cdf[-1])\n"
        "    return min(int(torch.searchsorted(cdf, torch.tensor([u], dtype=torch.float64), right=True)), "
        "len(probs) - 1)",
    },
    "top-k-breaks-ties-by-index": {
        "        kth = torch.topk(out, top_k).values[-1]\n        out[out < kth] = float(\"-inf\")":
        "        dropped = torch.ones_like(out, dtype=torch.bool)\n"
        "        dropped[torch.topk(out, top_k).indices] = False\n"
        "        out[dropped] = float(\"-inf\")",
    },
    "ngram-index-of-last-starts": {
        "        suffix = tokens[length - n:]\n        for start in range(length - n - 1, -1, -1):\n"
        "            if tokens[start:start + n] == suffix:\n                return tokens[start + n:start + n + k]":
        "        last = {}\n        for start in range(length - n):  # starts before the suffix's own\n"
        "            last[tuple(tokens[start:start + n])] = start\n"
        "        start = last.get(tuple(tokens[length - n:]))\n"
        "        if start is not None:\n            return tokens[start + n:start + n + k]",
    },
}

NUMPY_AND_TUPLES = '''"""Stage 6 written another way: numpy in float64, tuples, an inverse CDF, an index of n-grams."""

import numpy as np
import torch


def filter_logits(logits, top_k, top_p):
    x = logits.double().numpy().copy()
    if 0 < top_k < len(x):
        x[x < np.sort(x)[-top_k]] = -np.inf
    if top_p < 1.0:
        e = np.exp(x - x.max())
        probs = e / e.sum()
        order = np.argsort(-probs, kind="stable")
        mass = 0.0
        for i, t in enumerate(order):
            if mass >= top_p:
                x[order[i:]] = -np.inf
                break
            mass += probs[t]
    return x


def verify_greedy(drafts, target_argmax):
    n = next((i for i, (d, t) in enumerate(zip(drafts, target_argmax)) if d != t), len(drafts))
    return tuple(drafts[:n]) + (target_argmax[n],), n


def acceptance_probability(p_token, q_token):
    return 1.0 if p_token >= q_token else p_token / q_token


def residual_distribution(p, q):
    r = np.maximum(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64), 0.0)
    return r / r.sum() if r.sum() > 0 else np.asarray(p, dtype=np.float64)


def ngram_lookup(tokens, k, max_n, min_n):
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        where = {}
        for s in range(len(tokens) - n):
            where[tuple(tokens[s:s + n])] = s
        s = where.get(tuple(tokens[-n:]))
        if s is not None:
            return tuple(tokens[s + n:s + n + k])
    return ()


def _probs(row, params):
    x = np.asarray(filter_logits(row.float().cpu() / params.temperature, params.top_k, params.top_p))
    e = np.exp(x - x.max())
    return e / e.sum()


def _draw(probs, generator):
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(probs) - 1))


class Sampler:
    def sample(self, logits, params, generators):
        return tuple(int(np.argmax(row.float().cpu().numpy())) if p.greedy else _draw(_probs(row, p), g)
                     for row, p, g in zip(logits, params, generators))

    def verify(self, drafts, draft_probs, logits, params, generator):
        if params.greedy:
            return verify_greedy(list(drafts), logits.argmax(dim=-1).tolist())
        p = [_probs(row, params) for row in logits]
        for i, d in enumerate(drafts):
            q = np.zeros_like(p[i])
            if draft_probs is None:
                q[d] = 1.0
            else:
                q = draft_probs[i].double().cpu().numpy()
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u >= acceptance_probability(p[i][d], q[d]):
                return tuple(drafts[:i]) + (_draw(residual_distribution(p[i], q), generator),), i
        return tuple(drafts) + (_draw(p[-1], generator),), len(drafts)


class NgramProposer:
    def __init__(self, max_n):
        self.max_n = max_n

    def propose(self, seqs, ks):
        return [list(ngram_lookup(s.all_ids, k, self.max_n, 1)) if k else [] for s, k in zip(seqs, ks)]

    def rollback(self, seq, num_valid):
        return None

    def release(self, seq):
        return None
'''


@pytest.mark.parametrize("name", [*VARIANTS, "numpy-float64-and-tuples"])
def test_a_correct_variant_passes(tmp_path, name):
    text = NUMPY_AND_TUPLES if name == "numpy-float64-and-tuples" else mutated(KEY, VARIANTS[name])
    assert_variant_passes(KEY, text, tmp_path)
