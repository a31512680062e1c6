"""Stage 6 · Sampling and speculation: a reference solution."""

import torch

from infer_lab.engine.proposers import Proposal


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """-inf outside the top-k, then outside the top-p nucleus of what is left."""
    out = logits.clone()
    if 0 < top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out[out < kth] = float("-inf")
    if top_p < 1.0:
        probs, order = torch.sort(torch.softmax(out, dim=-1), descending=True)
        before = torch.cumsum(probs, dim=-1) - probs  # the mass of the tokens ahead of each one
        out[order[before >= top_p]] = float("-inf")
    return out


def verify_greedy(drafts: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """The longest agreeing prefix, then the target's token where they part (or after the last draft)."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == target_argmax[kept]:
        kept += 1
    return drafts[:kept] + [target_argmax[kept]], kept


def acceptance_probability(p_token: float, q_token: float) -> float:
    """Keep a guess with probability min(1, p / q)."""
    return min(1.0, p_token / q_token)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where the target wants more than the draft gave: max(p - q, 0), normalized."""
    residual = (p - q).clamp_min(0)
    total = residual.sum()
    return residual / total if total > 0 else p


def ngram_lookup(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Longest suffix first; its most recent earlier occurrence; what followed it there."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def target_probs(logits: torch.Tensor, params) -> torch.Tensor:
    """The distribution a request samples from, one row per row of ``logits``: softmax(filter(logits / T))."""
    rows = logits.float().cpu().reshape(-1, logits.shape[-1])
    return torch.stack([torch.softmax(filter_logits(row / params.temperature, params.top_k, params.top_p), dim=-1)
                        for row in rows])


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id from ``probs`` with the request's own generator."""
    return int(torch.multinomial(probs, 1, generator=generator))


class Sampler:
    """One token per row, and the verification of speculative guesses."""

    def sample(self, logits, params, generators) -> list[int]:
        tokens = []
        for row, p, generator in zip(logits, params, generators, strict=True):
            tokens.append(int(row.argmax()) if p.greedy else draw(target_probs(row, p)[0], generator))
        return tokens

    def verify(self, drafts, draft_probs, logits, params, generator) -> tuple[list[int], int]:
        if params.greedy:
            return verify_greedy(drafts, logits.argmax(dim=-1).tolist())
        p = target_probs(logits, params)  # (k + 1, vocab): p_0 .. p_k
        for i, d in enumerate(drafts):
            if draft_probs is None:  # a deterministic guess: q is a point mass on d
                q = torch.zeros_like(p[i])
                q[d] = 1.0
            else:
                q = draft_probs[i].float().cpu()
            if float(torch.rand((), generator=generator)) < acceptance_probability(float(p[i, d]), float(q[d])):
                continue
            return drafts[:i] + [draw(residual_distribution(p[i], q), generator)], i
        return drafts + [draw(p[-1], generator)], len(drafts)  # every guess kept: a bonus token from p_k


class NgramProposer:
    """Prompt lookup: guesses are what followed the text's ending earlier in the text."""

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n

    def propose(self, seqs, ks) -> list[Proposal]:
        return [Proposal(ngram_lookup(seq.all_ids, k, self.max_n, 1) if k > 0 else [])
                for seq, k in zip(seqs, ks, strict=True)]

    def rollback(self, seq, num_valid: int) -> None:
        pass  # nothing is kept per request: every lookup reads the request's tokens afresh

    def release(self, seq) -> None:
        pass
