"""Where K and V live between steps: none, one max-length region per request, or fixed-size blocks.

All three present the model with the same thing: per layer a flat store of *slots*
``(num_slots, kv_heads, head_dim)``; a token's K/V sits in one slot. They differ in how
slots are handed to requests:

* :class:`NoKVCache` keeps nothing; every step recomputes every token (O(N^2) work).
* :class:`ContiguousKVCache` reserves ``max_model_len`` slots per request up front, the way
  early servers did: simple, but a 50-token answer still holds memory for thousands.
* :class:`PagedKVCache` hands out blocks of ``block_size`` slots on demand, as in vLLM's
  PagedAttention. It joins two components: a :class:`~.block_manager.BlockManager` (the free
  list, reference counts and block tables) and a :class:`~.kv_store.PagedKVStore` (the K/V
  tensors, written and read through block tables). Either may be a learner's own
  (the course's build track), given to the constructor.

The scheduler talks to all three the same way: ``can_allocate`` / ``allocate`` / ``free`` a
request's KV, and ``attach_prefix`` / ``detach_prefix`` / ``cache_prefix`` for the prefix cache
(no-ops without one). Every cache reports :class:`KVMemoryReport` (bytes used, reserved and wasted).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..shape import ModelShape
from .block_manager import BlockManager, OutOfKVMemory, paged_blocks_needed
from .kv_store import KV_DTYPES, PagedKVStore, SlotStore, block_table_slots, paged_slots
from .layers import context_mask
from .sequence import Sequence

__all__ = [
    "KV_DTYPES", "AttentionMetadata", "BlockManager", "ContiguousKVCache", "KVMemoryReport", "NoKVCache",
    "OutOfKVMemory", "PagedKVCache", "PagedKVStore", "SlotStore", "block_table_slots", "paged_blocks_needed",
    "paged_slots",
]


@dataclass
class AttentionMetadata:
    """Where each sequence's tokens sit in the flattened batch and in the KV cache, for one step.

    Attributes:
        query_lens: new tokens per sequence this step (prefill chunk length, or 1 when decoding).
        context_lens: tokens of K/V each sequence attends to after this step's writes
            (cached tokens + new tokens).
        slot_mapping: ``(T,)`` int64 cache slot for every new token (where its K/V is written);
            ``None`` when there is no cache (the no-cache mode recomputes everything).
        block_tables: per sequence, the physical block ids holding its tokens in order (paged mode);
            in contiguous mode each sequence's first slot is in ``region_starts`` instead.
        region_starts: first slot of each sequence's contiguous reservation (contiguous mode).
        context_slots: paged mode: per sequence, the slot of each of its context tokens, in order
            (derived from the block table once per step, so each layer does one gather).
        sample_indices: rows of the flattened batch whose logits are wanted (a sequence's last
            new token, when that token completes its context).
        decode_seqs: indices of the sequences attended by the batched decode path (one new
            token each); empty when the path is off or no sequence qualifies.
        decode_rows: ``(B,)`` their rows in the flattened batch.
        decode_slots: ``(B, L)`` slot of each of their context positions, padded to the longest
            context ``L`` with each sequence's first slot (safe to gather; masked out).
        decode_context_lens: ``(B,)`` their context lengths (tokens).
        decode_visible: ``(B, L)`` True at real context positions (computed once per step).
    """

    query_lens: list[int]
    context_lens: list[int]
    slot_mapping: torch.Tensor | None = None
    block_tables: list[list[int]] | None = None
    region_starts: list[int] | None = None
    context_slots: list[torch.Tensor | None] | None = None
    sample_indices: list[int] = field(default_factory=list)
    decode_seqs: list[int] = field(default_factory=list)
    decode_rows: torch.Tensor | None = None
    decode_slots: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    decode_visible: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


@dataclass(frozen=True)
class KVMemoryReport:
    """KV memory at one moment, in bytes. ``wasted = reserved - used``.

    ``used`` counts slots that hold a token's K/V; ``reserved`` counts slots handed to requests
    (or held by the prefix cache); ``capacity`` is the whole store.
    """

    capacity_bytes: int
    reserved_bytes: int
    used_bytes: int

    @property
    def wasted_bytes(self) -> int:
        return self.reserved_bytes - self.used_bytes

    @property
    def wasted_fraction(self) -> float:
        """Share of the reserved bytes that hold no token (0 when nothing is reserved)."""
        return self.wasted_bytes / self.reserved_bytes if self.reserved_bytes else 0.0


class _NothingShared:
    """A cache whose requests share nothing: the scheduler's prefix-cache calls do nothing."""

    prefix_cache = None

    def attach_prefix(self, seq: Sequence) -> int:
        return seq.num_computed

    def detach_prefix(self, seq: Sequence) -> None:
        pass

    def cache_prefix(self, seq: Sequence) -> None:
        pass


class NoKVCache(_NothingShared):
    """No cache at all: the engine feeds every sequence's full token list every step."""

    kind = "nocache"
    stores_kv = False

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return True

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        pass

    def free(self, seq: Sequence, cache_prefix: bool = False) -> None:
        pass

    def slots(self, seq: Sequence, start: int, count: int) -> list[int]:
        return []

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        pass

    def fill_metadata(
        self, meta: AttentionMetadata, seqs: list[Sequence], batched_decode: bool = True
    ) -> None:
        pass

    def memory_report(self, seqs: Iterable[Sequence] = ()) -> KVMemoryReport:
        return KVMemoryReport(0, 0, 0)

    def context_span(self, meta: AttentionMetadata, seq_index: int) -> tuple[int, int] | None:
        return None


class ContiguousKVCache(_NothingShared):
    """One ``max_model_len``-slot region reserved per request for its whole life.

    Args:
        shape: the model's shape (layers, kv heads, head dim).
        max_seqs: how many regions (concurrent requests) the store holds.
        max_model_len: slots per region: the longest prompt + output a request may reach.
    """

    kind = "contiguous"
    stores_kv = True

    def __init__(
        self,
        shape: ModelShape,
        max_seqs: int,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.shape, self.max_seqs, self.max_model_len = shape, max_seqs, max_model_len
        self.store = SlotStore(shape.layers, max_seqs * max_model_len, shape.kv_heads, shape.head_dim, dtype,
                               torch.device(device))
        self.k, self.v = self.store.k, self.store.v
        self.bytes_per_token = self.store.bytes_per_token
        self.free_regions: deque[int] = deque(range(max_seqs))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return seq.region is not None or bool(self.free_regions)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        if seq.num_computed + num_new_tokens > self.max_model_len:
            raise OutOfKVMemory(
                f"{seq.request_id} would exceed its {self.max_model_len}-token region"
            )
        if seq.region is None:
            if not self.free_regions:
                raise OutOfKVMemory("all contiguous regions are reserved")
            seq.region = self.free_regions.popleft()

    def free(self, seq: Sequence, cache_prefix: bool = False) -> None:
        if seq.region is not None:
            self.free_regions.append(seq.region)
            seq.region = None

    def slots(self, seq: Sequence, start: int, count: int) -> list[int]:
        base = seq.region * self.max_model_len
        return list(range(base + start, base + start + count))

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Nothing to give back: the region stays reserved; slots past ``num_tokens`` are rewritten later."""

    def fill_metadata(
        self, meta: AttentionMetadata, seqs: list[Sequence], batched_decode: bool = True
    ) -> None:
        """Region starts; with ``batched_decode``, the ``(B, L)`` slot matrix of the decoding sequences."""
        meta.region_starts = [s.region * self.max_model_len for s in seqs]
        decode = _decode_indices(meta) if batched_decode else []
        if decode:
            device = self.k.device
            width = max(meta.context_lens[i] for i in decode)
            starts = torch.tensor([meta.region_starts[i] for i in decode], device=device)
            _set_decode(meta, decode, starts[:, None] + torch.arange(width, device=device))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.store.write(layer, slots, k, v)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.store.gather(layer, slots)

    def context_kv(
        self, layer: int, seq_index: int, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A view (no copy) of the sequence's first ``context_len`` slots: contiguous memory pays off here."""
        start, n = meta.region_starts[seq_index], meta.context_lens[seq_index]
        return self.k[layer, start : start + n], self.v[layer, start : start + n]

    def context_span(self, meta: AttentionMetadata, seq_index: int) -> tuple[int, int] | None:
        """``(first slot, tokens)`` of the sequence's context: always one run of slots here."""
        return meta.region_starts[seq_index], meta.context_lens[seq_index]

    def read_span(self, layer: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.store.span(layer, start, count)

    def memory_report(self, seqs: Iterable[Sequence] = ()) -> KVMemoryReport:
        live = [s for s in seqs if s.region is not None]
        return KVMemoryReport(
            capacity_bytes=self.max_seqs * self.max_model_len * self.bytes_per_token,
            reserved_bytes=len(live) * self.max_model_len * self.bytes_per_token,
            used_bytes=sum(s.num_computed for s in live) * self.bytes_per_token,
        )


class PagedKVCache:
    """Paged KV: blocks from a :class:`BlockManager`, K/V in a :class:`PagedKVStore`, a block table per request.

    Args:
        shape: the model's shape.
        num_blocks: blocks in the pool (the KV budget is ``num_blocks * block_size`` tokens).
        block_size: tokens per block (1 = token-granular, as in SGLang; 16 is vLLM's default).
        scratch_block: store one extra block outside the pool (id ``num_blocks``), where the
            padding rows of a fixed-shape decode batch write harmlessly.
        kv_dtype: ``None`` (the model's dtype), ``"int8"`` or ``"fp8"`` (see :class:`SlotStore`).
        block_manager: a block manager of ``num_blocks`` blocks of ``block_size`` (default: the
            library's :class:`BlockManager`); anything with its interface, a learner's included.
        store: a K/V store with :class:`PagedKVStore`'s interface (default: the library's). The
            engine's fast attention paths read the library's store directly; over any other store
            attention goes through ``store.attend`` only.
    """

    kind = "paged"
    stores_kv = True

    def __init__(
        self,
        shape: ModelShape,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        scratch_block: bool = False,
        kv_dtype: str | None = None,
        block_manager: Any = None,
        store: Any = None,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.shape, self.block_size, self.num_blocks = shape, block_size, num_blocks
        self.device = torch.device(device)
        self.blocks = block_manager if block_manager is not None else BlockManager(num_blocks, block_size)
        self.scratch_block = num_blocks if scratch_block else None
        if store is None:
            store = PagedKVStore(num_blocks, block_size, shape.layers, shape.kv_heads, shape.head_dim, dtype,
                                 self.device, kv_dtype, extra_blocks=1 if scratch_block else 0)
        self.store = store
        # The fast paths (batched gathers, in-place spans, static shapes) read the library's store.
        self.library_store = isinstance(store, PagedKVStore)
        if self.library_store:
            self.k, self.v = store.k, store.v
            self.bytes_per_token = store.bytes_per_token
        else:
            itemsize = torch.empty((), dtype=dtype).element_size()
            self.bytes_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * itemsize
        self.block_fill = [0] * num_blocks  # slots of each block holding a token (for used bytes)
        self.peak_blocks_used = 0
        self.prefix_cache: Any = None  # a prefix cache attaches itself here (it frees blocks when they run out)

    @property
    def pool(self) -> Any:
        """The block manager (the name older code and tests use)."""
        return self.blocks

    # -- blocks -----------------------------------------------------------------------------

    def num_used_blocks(self) -> int:
        return self.num_blocks - self.blocks.num_free_blocks()

    def all_blocks_free(self) -> bool:
        """Every block back on the free list with no holder: nothing leaked (asked through the interface)."""
        return (self.blocks.num_free_blocks() == self.num_blocks
                and all(self.blocks.ref_count(b) == 0 for b in range(self.num_blocks)))

    def available_blocks(self) -> int:
        """Blocks that could be handed out now: free ones plus those a prefix cache would give back."""
        evictable = self.prefix_cache.num_evictable() if self.prefix_cache is not None else 0
        return self.blocks.num_free_blocks() + evictable

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``num_new_tokens`` more tokens."""
        return self.blocks.blocks_needed(seq.num_computed, num_new_tokens, len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.available_blocks()

    def _make_room(self, blocks: int) -> None:
        """Evict cached prefixes until ``blocks`` blocks are free (raises :class:`OutOfKVMemory`)."""
        while self.blocks.num_free_blocks() < blocks:
            if self.prefix_cache is None or not self.prefix_cache.evict_one():
                raise OutOfKVMemory(f"{blocks} KV blocks needed, {self.blocks.num_free_blocks()} of "
                                    f"{self.num_blocks} free and nothing left to evict")

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq.block_table`` to cover ``num_new_tokens`` more tokens (raises OutOfKVMemory)."""
        self._make_room(self.blocks_needed(seq, num_new_tokens))
        end = seq.num_computed + num_new_tokens
        self.blocks.grow(seq.block_table, end)
        for i in range(seq.num_computed // self.block_size, len(seq.block_table)):
            block = seq.block_table[i]
            self.block_fill[block] = max(self.block_fill[block], min(self.block_size, end - i * self.block_size))
        self.peak_blocks_used = max(self.peak_blocks_used, self.num_used_blocks())
        if seq.prefix_hit is not None:  # admitted after a prefix lookup: count it once
            if seq.num_preemptions == 0:
                seq.num_cached_prompt_tokens = seq.prefix_hit
                self.prefix_cache.record(seq, seq.prefix_hit)
            seq.prefix_hit = None

    def take_block(self) -> int:
        """One fresh block (evicting a cached prefix if none is free), for a prefix cache's copy-on-write."""
        self._make_room(1)
        table: list[int] = []
        self.blocks.grow(table, 1)
        return table[0]

    def _let_go(self, seq: Sequence, num_tokens: int) -> None:
        dropped = seq.block_table[-(-num_tokens // self.block_size):]
        self.blocks.shrink(seq.block_table, num_tokens)
        for block in dropped:
            if self.blocks.ref_count(block) == 0:
                self.block_fill[block] = 0

    def free(self, seq: Sequence, cache_prefix: bool = False) -> None:
        """Drop ``seq``'s hold on each of its blocks (shared blocks stay with their other holders).

        ``cache_prefix``: first hand its computed tokens to the prefix cache (a request that
        finished, or is preempted and will be recomputed), so a later request can reuse them.
        In table order, so the free list gets them back in order and the next request is
        handed consecutive blocks again (whose K/V attention can then read in place).
        """
        if cache_prefix:
            seq.num_computed = min(seq.num_computed, seq.num_tokens)
            self.cache_prefix(seq)
        self._let_go(seq, 0)
        seq.block_table = []
        seq.prefix_hit = None

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep the blocks of ``seq``'s first ``num_tokens`` tokens and give the rest back.

        Rejected speculative tokens roll back this way: a block that held only rejected tokens
        returns to the pool, and the last kept block's fill counts only the kept tokens.
        """
        self._let_go(seq, num_tokens)
        keep = len(seq.block_table)
        if keep and num_tokens % self.block_size:
            last = seq.block_table[-1]
            if self.blocks.ref_count(last) == 1:  # not shared: its fill is this sequence's alone
                self.block_fill[last] = num_tokens - (keep - 1) * self.block_size

    # -- the prefix cache, as the scheduler sees it -----------------------------------------

    def attach_prefix(self, seq: Sequence) -> int:
        """Before sizing a waiting request: find its prompt's longest cached prefix.

        A fresh request's table starts with the cached blocks and ``seq.num_computed`` with the
        tokens they hold; returns ``seq.num_computed`` (unchanged without a prefix cache, or for a
        request that already holds blocks). Undo with :meth:`detach_prefix` if it is not admitted.
        """
        if self.prefix_cache is None or seq.num_computed or seq.block_table:
            return seq.num_computed
        seq.prefix_hit = self.prefix_cache.attach(seq)
        return seq.num_computed

    def detach_prefix(self, seq: Sequence) -> None:
        """Undo :meth:`attach_prefix` for a request that stays in the queue (its blocks go back)."""
        if seq.prefix_hit is not None:
            self.prefix_cache.detach(seq)
            seq.prefix_hit = None

    def cache_prefix(self, seq: Sequence) -> None:
        """Offer ``seq``'s computed tokens to the prefix cache (nothing without one)."""
        if self.prefix_cache is not None:
            self.prefix_cache.insert(seq)

    # -- slots and the store ----------------------------------------------------------------

    def slots(self, seq: Sequence, start: int, count: int) -> list[int]:
        """Slot ids of positions ``start .. start+count-1``: block_table[pos // B] * B + pos % B."""
        return list(self.store.slots(list(seq.block_table), start, count))

    def fill_metadata(
        self, meta: AttentionMetadata, seqs: list[Sequence], batched_decode: bool = True
    ) -> None:
        """Block tables, and the slot of every context token (computed once per step, used by every layer).

        Sequences decoding one token are gathered into one ``(B, L)`` slot matrix when
        ``batched_decode`` is on; the others (prefill chunks) get one slot vector each.
        """
        bs, device = self.block_size, self.device
        meta.block_tables = [list(s.block_table) for s in seqs]
        decode = _decode_indices(meta) if batched_decode else []
        meta.context_slots = [None] * len(seqs)
        batched = set(decode)
        for i, (s, n) in enumerate(zip(seqs, meta.context_lens, strict=False)):
            if i in batched:
                continue
            table = torch.tensor(s.block_table[: -(-n // bs)], dtype=torch.long, device=device)
            meta.context_slots[i] = block_table_slots(table[None], bs)[0, :n]
        if decode:
            width = -(-max(meta.context_lens[i] for i in decode) // bs)
            # Short tables are padded with block 0: any valid block, the length mask hides it.
            rows = [seqs[i].block_table[:width] for i in decode]
            table = torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
            _set_decode(meta, decode, block_table_slots(table, bs))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.store.write(layer, slots, k, v)

    def attend(self, layer: int, q: torch.Tensor, block_table: list[int], context_len: int,
               scale: float) -> torch.Tensor:
        """One request's queries over its context, through the store (see :meth:`PagedKVStore.attend`)."""
        return self.store.attend(layer, q, list(block_table), context_len, scale)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.store.gather(layer, slots)

    def context_kv(
        self, layer: int, seq_index: int, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather the sequence's K/V through its block table (slot = block_table[pos // B] * B + pos % B)."""
        return self.store.gather(layer, meta.context_slots[seq_index])

    def context_span(self, meta: AttentionMetadata, seq_index: int) -> tuple[int, int] | None:
        """``(first slot, tokens)`` when the sequence's context sits in consecutive blocks, else None.

        A lone request on a fresh pool is handed blocks in order, so its whole context is one run
        of slots and attention can read K/V in place instead of gathering a copy.
        """
        table, n = meta.block_tables[seq_index], meta.context_lens[seq_index]
        used = -(-n // self.block_size)
        first = table[0]
        if table[used - 1] - first != used - 1 or table[:used] != list(range(first, first + used)):
            return None
        return first * self.block_size, n

    def read_span(self, layer: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """K and V of slots ``start .. start + count - 1`` as views, or None (quantized store)."""
        return self.store.span(layer, start, count)

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Copy K/V of slots ``src`` into slots ``dst`` in every layer (copy-on-write for partial blocks)."""
        self.store.copy(list(src), list(dst))

    def memory_report(self, seqs: Iterable[Sequence] = ()) -> KVMemoryReport:
        used_blocks = [b for b in range(self.num_blocks) if self.blocks.ref_count(b) > 0]
        return KVMemoryReport(
            capacity_bytes=self.num_blocks * self.block_size * self.bytes_per_token,
            reserved_bytes=len(used_blocks) * self.block_size * self.bytes_per_token,
            used_bytes=sum(self.block_fill[b] for b in used_blocks) * self.bytes_per_token,
        )


def _decode_indices(meta: AttentionMetadata) -> list[int]:
    """Sequences with exactly one new token this step: the batched decode path takes them."""
    return [i for i, n in enumerate(meta.query_lens) if n == 1]


def _set_decode(meta: AttentionMetadata, decode: list[int], slots: torch.Tensor) -> None:
    device = slots.device
    starts = [0]
    for n in meta.query_lens[:-1]:
        starts.append(starts[-1] + n)
    meta.decode_seqs = decode
    meta.decode_rows = torch.tensor([starts[i] for i in decode], dtype=torch.long, device=device)
    meta.decode_context_lens = torch.tensor(
        [meta.context_lens[i] for i in decode], dtype=torch.long, device=device
    )
    meta.decode_slots, meta.decode_visible = context_mask(slots, meta.decode_context_lens)
