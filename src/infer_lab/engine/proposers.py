"""Speculative decoding's proposers: cheap guesses of the next ``k`` tokens, verified by the target.

Three ways to guess, behind one interface (:class:`Proposer`):

* :class:`NgramProposer` (prompt lookup): no model at all. Find the last ``n`` tokens earlier in
  the prompt + output and propose what followed them there. Free to run, and right surprisingly
  often when the output copies or edits its input (code, quotes, lists).
* :class:`DraftModelProposer` over the target's own first ``L`` layers, its final norm and LM
  head (**self-speculative**): same tokenizer and the same weights by construction.
* :class:`DraftModelProposer` over a separate small model whose tokenizer equals the target's
  (**draft model**), checked by :func:`check_same_tokenizer`.

A draft model keeps its own paged KV cache: for every request, the K/V of the tokens it has
already seen, so each proposal only computes what is new (the tokens accepted last step and the
target's bonus token) and then one token per guess. After verification the engine tells the
proposer how far the request's real tokens reach (:meth:`Proposer.rollback`), and the draft
forgets its rejected guesses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from .config import EngineConfig
from .kv_cache import AttentionMetadata, PagedKVCache
from .layers import LayerFunctions
from .model import EngineModel
from .sampling import filter_logits
from .sequence import Sequence


@dataclass
class Proposal:
    """Up to ``k`` guessed tokens for one sequence, and the distribution each was drawn from.

    ``probs`` is ``(len(tokens), vocab)`` when the guesses were sampled from a draft model's
    distribution (needed to verify a sampling request exactly); ``None`` for deterministic
    guesses (n-gram lookup, or greedy drafts for a greedy request).
    """

    tokens: list[int]
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """What the engine needs from a proposer."""

    name: str

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        """Guesses for each sequence, at most ``ks[i]`` tokens (possibly none)."""

    def rollback(self, seq: Sequence, num_valid: int) -> None:
        """``seq``'s first ``num_valid`` tokens are final; forget anything guessed beyond."""

    def release(self, seq: Sequence) -> None:
        """``seq`` finished or left: drop everything kept for it."""


class ProposerError(ValueError):
    """A proposer that cannot be built as asked (unknown kind, mismatched tokenizer, bad L)."""


# ---------------------------------------------------------------------------------------------
# Prompt lookup


class NgramProposer:
    """Prompt lookup: match the last ``n`` tokens (``max_n`` down to ``min_n``) earlier in the text.

    The most recent earlier occurrence wins; the proposal is the tokens that followed it there,
    at most ``k`` of them. No match proposes nothing, and the step is plain decoding.
    """

    def __init__(self, max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ProposerError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.name = f"ngram:{max_n}"
        self.max_n, self.min_n = max_n, min_n

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """The continuation of the most recent earlier occurrence of the longest matching suffix."""
        length = len(tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = tokens[length - n :]
            for start in range(length - n - 1, -1, -1):  # occurrences ending before the suffix
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + k]
        return []

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        return [Proposal(self.lookup(seq.all_ids, k) if k > 0 else []) for seq, k in zip(seqs, ks, strict=True)]

    def rollback(self, seq: Sequence, num_valid: int) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Draft models (self-speculative layers, or a small model)


class DraftModelProposer:
    """Guesses from a small decoder with its own paged KV cache (one shadow sequence per request).

    Args:
        model: the draft (:meth:`EngineModel.from_hf` of a small model, or of the target with
            ``num_layers=L``).
        num_blocks, block_size: its KV pool (tokens = ``num_blocks * block_size``).
        name: for reports (``"self:8"``, ``"draft:smollm2-135m"``).
    """

    def __init__(self, model: EngineModel, num_blocks: int, block_size: int, name: str):
        self.name = name
        self.model = model
        self.kv = PagedKVCache(model.shape, num_blocks, block_size, model.dtype, model.device)
        self.shadows: dict[str, Sequence] = {}
        self.fns = LayerFunctions()

    def _shadow(self, seq: Sequence) -> Sequence:
        shadow = self.shadows.get(seq.request_id)
        if shadow is None:
            shadow = self.shadows[seq.request_id] = Sequence(seq.request_id, [], seq.params, 0.0)
        return shadow

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        out = [Proposal([]) for _ in seqs]
        active = []
        for i, (seq, k) in enumerate(zip(seqs, ks, strict=True)):
            if k <= 0:
                continue
            shadow = self._shadow(seq)
            new = seq.num_tokens - shadow.num_computed  # tokens the draft has not seen yet
            if not self.kv.can_allocate(shadow, new + k - 1):
                self.release(seq)  # the draft's pool is full: this request decodes plainly
                continue
            self.kv.allocate(shadow, new + k - 1)
            active.append((i, seq, shadow, k))
        if not active:
            return out
        # Pass 0 catches each draft up on its unseen tokens; passes 1.. feed one guess each.
        chunks = {i: seq.all_ids[shadow.num_computed :] for i, seq, shadow, _ in active}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i, *_ in active}
        for step in range(max(k for *_, k in active)):
            running = [(i, seq, shadow, k) for i, seq, shadow, k in active if step < k]
            logits = self._forward([(shadow, chunks[i]) for i, _, shadow, _ in running])
            for row, (i, seq, shadow, _) in enumerate(running):
                shadow.num_computed += len(chunks[i])
                token, dist = self._choose(logits[row], seq)
                out[i].tokens.append(token)
                if dist is not None:
                    probs[i].append(dist)
                chunks[i] = [token]
        for i, _, _, _ in active:
            if probs[i]:
                out[i].probs = torch.stack(probs[i])
        return out  # the last guess was never fed back, so the draft's cache ends before it

    def _forward(self, work: list[tuple[Sequence, list[int]]]) -> torch.Tensor:
        """One flat forward pass over each shadow's new tokens; logits of each one's last token."""
        ids, positions, slots, sample_rows = [], [], [], []
        for shadow, chunk in work:
            start = shadow.num_computed
            ids += chunk
            positions += range(start, start + len(chunk))
            slots += self.kv.slots(shadow, start, len(chunk))
            sample_rows.append(len(ids) - 1)
        device = self.model.device
        meta = AttentionMetadata(
            query_lens=[len(c) for _, c in work],
            context_lens=[s.num_computed + len(c) for s, c in work],
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            sample_indices=sample_rows,
        )
        self.kv.fill_metadata(meta, [s for s, _ in work])
        return self.model.forward(
            torch.tensor(ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            meta,
            self.kv,
            self.fns,
        )

    @staticmethod
    def _choose(logits: torch.Tensor, seq: Sequence) -> tuple[int, torch.Tensor | None]:
        """Greedy requests get the draft's argmax; sampling requests a sample and its distribution."""
        p = seq.params
        if p.greedy:
            return int(logits.argmax()), None
        dist = torch.softmax(filter_logits(logits.float().cpu() / p.temperature, p.top_k, p.top_p), dim=-1)
        return int(torch.multinomial(dist, 1, generator=seq.generator)), dist

    def rollback(self, seq: Sequence, num_valid: int) -> None:
        shadow = self.shadows.get(seq.request_id)
        if shadow is not None and shadow.num_computed > num_valid:
            shadow.num_computed = num_valid
            self.kv.truncate(shadow, num_valid)

    def release(self, seq: Sequence) -> None:
        shadow = self.shadows.pop(seq.request_id, None)
        if shadow is not None:
            self.kv.free(shadow)

    def blocks_in_use(self) -> int:
        return self.kv.pool.num_used


# ---------------------------------------------------------------------------------------------
# Building one from the engine's configuration


def check_same_tokenizer(target: Any, draft: Any) -> None:
    """Refuse a draft whose tokenizer differs from the target's: its token ids would mean other text."""
    if target is None or draft is None:
        raise ProposerError("a draft model needs both tokenizers to check that they are the same")
    differences = []
    if target.get_vocab() != draft.get_vocab():
        differences.append(f"vocabularies differ ({len(target.get_vocab())} vs {len(draft.get_vocab())} tokens)")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(target, name, None) != getattr(draft, name, None):
            differences.append(f"{name} {getattr(target, name, None)} vs {getattr(draft, name, None)}")
    if differences:
        raise ProposerError(
            "the draft model's tokenizer is not the target's, so its token ids would mean different "
            f"text: {'; '.join(differences)}. Use a draft from the same model family, or --speculative ngram."
        )


def make_proposer(
    config: EngineConfig, target: EngineModel, num_blocks: int, draft: EngineModel | None = None
) -> Proposer | None:
    """The proposer ``config.speculative`` names: ``ngram[:N]``, ``self:L`` or ``draft`` (or None)."""
    spec = config.speculative
    if spec is None:
        return None
    kind, _, arg = spec.partition(":")
    if kind == "ngram":
        return NgramProposer(max_n=int(arg) if arg else 3)
    if kind == "self":
        layers = target.shape.layers
        if not arg.isdigit() or not 1 <= int(arg) < layers:
            raise ProposerError(f"self-speculative needs self:L with 1 <= L < {layers} (the target's layers), got {spec!r}")
        draft_model = target.first_layers(int(arg))
        return DraftModelProposer(draft_model, num_blocks, config.block_size, spec)
    if kind == "draft":
        if draft is None:
            raise ProposerError("speculative='draft' needs a draft model: Engine.from_loaded(lm, config, draft=small_lm)")
        if draft.shape.vocab != target.shape.vocab:
            raise ProposerError(f"the draft's vocabulary has {draft.shape.vocab} ids, the target's {target.shape.vocab}")
        return DraftModelProposer(draft, num_blocks, config.block_size, f"draft:{arg or 'model'}")
    raise ProposerError(f"speculative must be ngram, ngram:N, self:L or draft, got {spec!r}")
