"""Choosing the next token from logits: greedy, or temperature / top-k / top-p with a seeded generator."""

from __future__ import annotations

import torch

from .sequence import SamplingParams


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request random generator: seeded when ``seed`` is given, otherwise from fresh entropy."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the top-p nucleus (1-D fp32 logits)."""
    out = logits.clone()
    if 0 < top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out[out < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # A token stays if the probability mass *before* it is still below top_p (the first always stays).
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop = mass_before >= top_p
        out[order[drop]] = float("-inf")
    return out


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """The next token id for one sequence from its fp32 logits ``(vocab,)``."""
    if params.greedy:
        return int(torch.argmax(logits))
    filtered = filter_logits(logits / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(filtered, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
