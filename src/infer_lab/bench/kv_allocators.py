"""The engine's own KV allocators holding a workload: no model runs, only their bookkeeping.

:func:`caches_in_budget` builds a :class:`~infer_lab.engine.ContiguousKVCache` (one
``max_model_len`` region per request) and a :class:`~infer_lab.engine.PagedKVCache` (blocks from
the :class:`~infer_lab.engine.block_manager.BlockManager`) of a model shape's real width in one KV budget.
Their stores are on torch's ``meta`` device: the tensors have shapes and dtypes but no memory, so
a 70B shape's budget of gigabytes costs nothing here, and every byte count comes from the
allocators' own :class:`~infer_lab.engine.KVMemoryReport`.

:func:`kv_memory_waste` holds every request of a workload at the end of its life in each
allocator (sized to hold them all) and reports what was reserved and what holds K/V.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import torch

from ..analysis.memory import kv_bytes_per_token
from ..engine import ContiguousKVCache, PagedKVCache, SamplingParams, Sequence
from ..shape import ModelShape

STORAGE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def caches_in_budget(shape: ModelShape, kv_budget_bytes: int, max_model_len: int, block_size: int = 16,
                     kv_dtype: str = "bf16") -> dict[str, ContiguousKVCache | PagedKVCache]:
    """The engine's contiguous and paged KV caches of ``shape`` that fit in ``kv_budget_bytes`` (bytes).

    Contiguous: ``budget_tokens // max_model_len`` regions; paged: ``budget_tokens // block_size``
    blocks, where ``budget_tokens = kv_budget_bytes // kv_bytes_per_token(shape)``. On the
    ``meta`` device (no memory); only their allocation bookkeeping is meant to be used.
    """
    budget_tokens = kv_budget_bytes // kv_bytes_per_token(shape, kv_dtype)
    dtype = STORAGE_DTYPES[kv_dtype]
    return {
        "contiguous": ContiguousKVCache(shape, budget_tokens // max_model_len, max_model_len, dtype, device="meta"),
        "paged": PagedKVCache(shape, max(1, budget_tokens // block_size), block_size, dtype, device="meta"),
    }


@dataclass(frozen=True)
class AllocatorWaste:
    """The engine's allocator holding every request at the end of its life (:func:`kv_memory_waste`)."""

    layout: str  # "contiguous" or "paged"
    requests: int
    used_bytes: int
    reserved_bytes: int
    wasted_bytes: int
    wasted_fraction: float
    block_size: int | None
    max_model_len: int

    @property
    def label(self) -> str:
        return self.layout + (f" (block {self.block_size})" if self.block_size else f" ({self.max_model_len:,} slots)")


def kv_memory_waste(shape: ModelShape, prompt_lens: Seq[int], output_lens: Seq[int], max_model_len: int,
                    block_size: int = 16, bytes_per_value: int = 2) -> list[AllocatorWaste]:
    """Wasted KV memory of a contiguous max-length reservation vs paged blocks, for one workload.

    Each request holds ``prompt + output`` tokens at the end of its life. Contiguous mode reserves
    ``max_model_len`` slots per request (over-reservation + internal waste); paged mode reserves
    whole blocks (waste only in each request's last block). Slot counts come from the engine's
    allocators and their :class:`~infer_lab.engine.KVMemoryReport`; the stores are one element
    wide (no model, next to no memory) and bytes are scaled to the shape's K/V bytes per token.
    """
    kv_dtype = {v: k for k, v in {"bf16": 2, "fp32": 4}.items()}[bytes_per_value]
    dtype = STORAGE_DTYPES[kv_dtype]
    narrow = replace(shape.with_layers(1), kv_heads=1, head_dim=1)
    per_token = kv_bytes_per_token(shape, kv_dtype)
    n = len(prompt_lens)
    seqs = [Sequence(f"r{i}", [0] * p, SamplingParams(max_tokens=o), 0.0)
            for i, (p, o) in enumerate(zip(prompt_lens, output_lens, strict=True))]
    blocks = sum(math.ceil((p + o) / block_size) for p, o in zip(prompt_lens, output_lens, strict=True))
    rows = []
    for name, cache in (("contiguous", ContiguousKVCache(narrow, n, max_model_len, dtype)),
                        ("paged", PagedKVCache(narrow, blocks, block_size, dtype))):
        scale = per_token // cache.bytes_per_token
        for seq, o in zip(seqs, output_lens, strict=True):
            seq.num_computed, seq.block_table, seq.region = 0, [], None
            cache.allocate(seq, seq.num_tokens + o)
            seq.num_computed = seq.num_tokens + o
        report = cache.memory_report(seqs)
        rows.append(AllocatorWaste(name, n, report.used_bytes * scale, report.reserved_bytes * scale,
                                   report.wasted_bytes * scale, report.wasted_fraction,
                                   block_size if name == "paged" else None, max_model_len))
        for seq in seqs:
            cache.free(seq)
    return rows
