"""Choosing the next tokens from logits: greedy or sampled, and verifying speculative guesses.

:class:`Sampler` is the interface the step loop uses (and the course's build track asks a learner
to write, stage 6):

* ``sample(logits, params, generators)``: one token per row, for every request that is not
  speculating this step (greedy: the argmax; otherwise temperature, top-k and top-p, drawn
  with the request's own seeded generator);
* ``verify(drafts, draft_probs, logits, params, generator)``: the tokens a speculating request
  keeps (:mod:`.acceptance`: greedy verification, or rejection sampling), and how many guesses.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from .acceptance import verify_greedy, verify_sampling
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


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampling request draws from: softmax of filtered ``logits / T`` (fp32).

    ``logits`` is ``(vocab,)`` or ``(rows, vocab)``; so is the result.
    """
    rows = logits.float().cpu().reshape(-1, logits.shape[-1])
    out = torch.stack([torch.softmax(filter_logits(r / params.temperature, params.top_k, params.top_p), dim=-1)
                       for r in rows])
    return out.reshape(logits.shape)


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """The next token id for one sequence from its fp32 logits ``(vocab,)``."""
    if params.greedy:
        return int(torch.argmax(logits))
    return int(torch.multinomial(target_probs(logits, params), 1, generator=generator))


class Sampler:
    """The engine's sampler: one token per row, and speculative verification."""

    def sample(self, logits: torch.Tensor, params: Seq[SamplingParams],
               generators: Seq[torch.Generator | None]) -> list[int]:
        """One token per row of ``logits`` ``(rows, vocab)`` fp32, row ``i`` under ``params[i]``.

        Greedy rows take one argmax over all of them (one device-to-host copy, not one per row).
        """
        tokens = [0] * len(params)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if greedy:
            picked = logits[greedy].argmax(dim=-1).tolist() if len(greedy) < len(params) else \
                logits.argmax(dim=-1).tolist()
            for i, t in zip(greedy, picked, strict=True):
                tokens[i] = t
        for i, p in enumerate(params):
            if not p.greedy:
                tokens[i] = sample_token(logits[i].float().cpu(), p, generators[i])
        return tokens

    def verify(self, drafts: list[int], draft_probs: torch.Tensor | None, logits: torch.Tensor,
               params: SamplingParams, generator: torch.Generator | None) -> tuple[list[int], int]:
        """Verify ``k`` guesses against the target's ``logits`` ``(k + 1, vocab)``.

        Returns the tokens to append (the kept guesses, then one of the target's own) and how many
        guesses were kept. Greedy requests keep guesses while they equal the argmax; sampling
        requests follow the rejection rule, so every token is distributed as the target's own.
        """
        if params.greedy:
            verdict = verify_greedy(drafts, logits.argmax(dim=-1).tolist())
        else:
            verdict = verify_sampling(drafts, draft_probs, target_probs(logits, params), generator)
        return verdict.tokens, verdict.accepted
