"""A tensor-parallel rank's KV cache: one fixed region per sequence, for the rank's KV heads only.

Each rank keeps the K and V of *its own* KV heads (the split of :mod:`.shard`), so the cache is
split across ranks exactly like attention is: on 2 ranks of SmolLM2-135M, rank 0 stores 2 KV
heads per token and rank 1 stores 1. Sequence ``s`` owns slots ``s * max_len`` to
``(s + 1) * max_len - 1`` of a flat ``(slots, kv_heads, head_dim)`` store per layer, the layout
:func:`infer_lab.engine.layers.decode_attention` reads (the paged cache of chapter 08 would work
the same way; a region per sequence keeps this chapter about the split, not the paging).
"""

from __future__ import annotations

import torch


class SequenceKVCache:
    """K/V stores of every layer for ``n_seqs`` sequences of at most ``max_len`` tokens each."""

    def __init__(self, layers: int, n_seqs: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        if n_seqs < 1 or max_len < 1:
            raise ValueError(f"need at least one sequence and one slot, got {n_seqs} x {max_len}")
        self.n_seqs, self.max_len = n_seqs, max_len
        shape = (n_seqs * max_len, kv_heads, head_dim)
        # zeros, not empty: masked slots are read (and multiplied by 0) by the attention kernel
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.device = torch.device(device)

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]

    def slots(self, seq: int, start: int, n: int) -> torch.Tensor:
        """The slots of positions ``start .. start + n - 1`` of sequence ``seq``."""
        if start + n > self.max_len:
            raise ValueError(f"sequence {seq} would reach {start + n} tokens; the cache holds {self.max_len}")
        base = seq * self.max_len + start
        return torch.arange(base, base + n, device=self.device)

    def context_slots(self, seqs: list[int], length: int) -> torch.Tensor:
        """``(len(seqs), length)``: the slots of the first ``length`` positions of each sequence."""
        base = torch.tensor(seqs, device=self.device)[:, None] * self.max_len
        return base + torch.arange(length, device=self.device)[None, :]

    @property
    def bytes(self) -> int:
        """Bytes of every K and V store of this rank."""
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))
