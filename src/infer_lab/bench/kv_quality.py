"""What quantizing the engine's KV cache costs in quality and buys in memory.

Quality is measured teacher-forced: the evaluation text goes through the engine's own model in
chunks, every chunk attending to the K/V already in a paged cache of the chosen ``kv_dtype``
(its own K/V included, read back as attention reads it). Each position's next-token
distribution is compared with the full-precision cache's: perplexity of the text, and how often
the top-1 token agrees. Free-running greedy outputs are not compared: one flipped token sends
the two continuations apart and says nothing about the next ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..engine import AttentionMetadata, EngineModel, PagedKVCache
from ..engine.sequence import SamplingParams, Sequence


@dataclass(frozen=True)
class KVQuality:
    """One KV format against full precision on the same tokens."""

    kv_dtype: str
    bytes_per_token: int
    tokens_scored: int
    perplexity: float
    reference_perplexity: float
    top1_agreement: float  # share of positions whose argmax equals full precision's

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.reference_perplexity - 1


@torch.inference_mode()
def _chunked_logits(model: EngineModel, ids: list[int], kv_dtype: str | None, chunk: int,
                    block_size: int = 16) -> tuple[torch.Tensor, int]:
    """Logits ``(len(ids), vocab)`` of one sequence run in chunks through a paged cache."""
    kv = PagedKVCache(model.shape, math.ceil(len(ids) / block_size) + 1, block_size, model.dtype,
                      model.device, kv_dtype=kv_dtype)
    seq = Sequence("eval", ids, SamplingParams(), 0.0)
    out = []
    for start in range(0, len(ids), chunk):
        piece = ids[start : start + chunk]
        kv.allocate(seq, len(piece))
        meta = AttentionMetadata(
            query_lens=[len(piece)],
            context_lens=[start + len(piece)],
            slot_mapping=torch.tensor(kv.slots(seq, start, len(piece)), device=model.device),
            sample_indices=list(range(len(piece))),
        )
        kv.fill_metadata(meta, [seq])
        positions = torch.arange(start, start + len(piece), device=model.device)
        out.append(model.forward(torch.tensor(piece, device=model.device), positions, meta, kv))
        seq.num_computed = start + len(piece)
    kv.free(seq)
    return torch.cat(out), kv.bytes_per_token


def kv_quant_quality(lm: Any, token_ids: list[int], kv_dtypes: tuple[str, ...] = ("int8", "fp8"),
                     chunk: int = 32) -> list[KVQuality]:
    """Perplexity and top-1 agreement of each ``kv_dtype`` against the full-precision cache."""
    model = EngineModel.from_hf(lm.model)
    targets = torch.tensor(token_ids[1:], device=model.device)

    def nll(logits: torch.Tensor) -> float:
        return float(torch.nn.functional.cross_entropy(logits[:-1], targets))

    reference, _ = _chunked_logits(model, token_ids, None, chunk)
    ref_ppl, ref_top1 = math.exp(nll(reference)), reference[:-1].argmax(-1)
    rows = []
    for kv_dtype in kv_dtypes:
        logits, per_token = _chunked_logits(model, token_ids, kv_dtype, chunk)
        agree = float((logits[:-1].argmax(-1) == ref_top1).float().mean())
        rows.append(KVQuality(kv_dtype, per_token, len(token_ids) - 1, math.exp(nll(logits)), ref_ppl, agree))
    return rows


def requests_that_fit(kv_budget_bytes: int, bytes_per_token: int, tokens_per_request: int) -> int:
    """How many requests of ``tokens_per_request`` tokens a KV budget holds at ``bytes_per_token``."""
    return kv_budget_bytes // (bytes_per_token * tokens_per_request)
