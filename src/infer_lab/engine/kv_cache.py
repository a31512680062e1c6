"""Where K and V live between steps: none, one max-length region per request, or fixed-size blocks.

All three present the model with the same thing: per layer a flat store of *slots*
``(num_slots, kv_heads, head_dim)``; a token's K/V sits in one slot. They differ in how
slots are handed to requests:

* :class:`NoKVCache` keeps nothing; every step recomputes every token (O(N^2) work).
* :class:`ContiguousKVCache` reserves ``max_model_len`` slots per request up front, the way
  early servers did: simple, but a 50-token answer still holds memory for thousands.
* :class:`PagedKVCache` hands out blocks of ``block_size`` slots on demand from a
  :class:`BlockPool` (free list + reference counts), and each request keeps a *block table*
  (logical block i -> physical block), as in vLLM's PagedAttention. Blocks can be shared
  between requests (prefix caching) because they are reference counted.

Every cache reports :class:`KVMemoryReport` (bytes used, reserved and wasted).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ..quant.kv_formats import quantize_kv
from ..shape import ModelShape
from .layers import context_mask
from .sequence import Sequence


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


def block_table_slots(block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block ids ``(B, blocks)`` -> the slot of every position ``(B, blocks * block_size)``.

    Position ``p`` of a sequence lives in slot ``block_tables[p // block_size] * block_size +
    p % block_size``: the paged equivalent of a virtual-to-physical address translation.
    """
    offsets = torch.arange(block_size, device=block_tables.device)
    return (block_tables[:, :, None] * block_size + offsets).flatten(1)


def paged_slots(block_table: list[int], block_size: int, start: int, count: int) -> list[int]:
    """Slot ids of positions ``start .. start+count-1``: ``block_table[p // B] * B + p % B``.

    The engine's own block-table lookup, and the default of the plug point
    :attr:`PagedKVCache.slot_lookup`.
    """
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]


def paged_blocks_needed(num_computed: int, num_new_tokens: int, blocks_held: int, block_size: int) -> int:
    """New blocks a request holding ``blocks_held`` needs for ``num_new_tokens`` more tokens.

    The engine's own rule, and the default of the plug point :attr:`PagedKVCache.block_count`.
    """
    return max(0, math.ceil((num_computed + num_new_tokens) / block_size) - blocks_held)


class OutOfKVMemory(RuntimeError):
    """No free slots or blocks are left for this request right now (the scheduler queues or preempts)."""


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


KV_DTYPES = ("int8", "fp8")


class SlotStore:
    """K and V of every layer in flat slots: ``(layers, num_slots, kv_heads, head_dim)`` each.

    Plain, in the model's dtype; or quantized (``kv_dtype="int8"`` or ``"fp8"``, e4m3) with one
    fp32 scale per token per head, written once when the token arrives and never re-scaled
    (:func:`infer_lab.quant.kv_formats.quantize_kv`). Attention reads it back through :meth:`gather`,
    dequantized to the model's dtype.
    """

    def __init__(self, shape: ModelShape, num_slots: int, dtype: torch.dtype, device: torch.device,
                 kv_dtype: str | None = None):
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be None, {' or '.join(KV_DTYPES)}; got {kv_dtype!r}")
        self.dtype, self.kv_dtype = dtype, kv_dtype
        size = (shape.layers, num_slots, shape.kv_heads, shape.head_dim)
        # fp8 codes are kept as their raw bytes: CPU kernels cannot index_copy float8 tensors.
        code_dtype = {None: dtype, "int8": torch.int8, "fp8": torch.uint8}[kv_dtype]
        # empty, not zeros: a slot is always written before it is read, and untouched pages cost no RAM.
        self.k = torch.empty(size, dtype=code_dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.k_scale = self.v_scale = None
        if kv_dtype is not None:
            self.k_scale = torch.ones(*size[:3], 1, dtype=torch.float32, device=device)
            self.v_scale = torch.ones_like(self.k_scale)

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one token in every layer, scales included, from the tensors themselves."""
        tensors = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.kv_dtype else [])
        return sum(t[:, 0].numel() * t.element_size() for t in tensors)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V ``(T, kv_heads, d)`` of ``T`` new tokens at their ``slots``."""
        if self.kv_dtype is None:
            self.k[layer].index_copy_(0, slots, k)
            self.v[layer].index_copy_(0, slots, v)
            return
        for store, scale, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q = quantize_kv(x, self.kv_dtype)
            store[layer].index_copy_(0, slots, q.codes.view(store.dtype))
            scale[layer].index_copy_(0, slots, q.scale)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots`` (any shape ``S``) as ``(*S, kv_heads, d)`` in the model's dtype.

        One ``index_select`` over the flattened slots: on a CPU it is several times faster
        than indexing with the 2-D slot matrix directly, for the same bytes.
        """
        flat = slots.reshape(-1)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t[layer].index_select(0, flat).view(*slots.shape, *t.shape[2:])

        if self.kv_dtype is None:
            return take(self.k), take(self.v)
        codes = torch.float8_e4m3fn if self.kv_dtype == "fp8" else torch.int8
        return (
            (take(self.k).view(codes).float() * take(self.k_scale)).to(self.dtype),
            (take(self.v).view(codes).float() * take(self.v_scale)).to(self.dtype),
        )

    def span(self, layer: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Views (no copy) of K and V in slots ``start .. start + count - 1``, ``(count, kv_heads, d)``;
        None for a quantized store (its codes must be dequantized, which copies anyway)."""
        if self.kv_dtype is not None:
            return None
        return self.k[layer, start : start + count], self.v[layer, start : start + count]

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's K/V (and scales) of slots ``src`` into slots ``dst``."""
        tensors = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.kv_dtype else [])
        for t in tensors:
            t[:, dst] = t[:, src]


class NoKVCache:
    """No cache at all: the engine feeds every sequence's full token list every step."""

    kind = "nocache"
    stores_kv = False

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return True

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        pass

    def free(self, seq: Sequence) -> None:
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


class ContiguousKVCache:
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
        self.store = SlotStore(shape, max_seqs * max_model_len, dtype, torch.device(device))
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

    def free(self, seq: Sequence) -> None:
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


class BlockPool:
    """Fixed-size blocks with a free list and reference counts.

    A block is free exactly when its reference count is 0. ``evict`` is called when the free
    list is empty: a prefix cache plugs in there to give back blocks nobody is using.
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_list: deque[int] = deque(range(num_blocks))
        self.evict: Callable[[], bool] | None = None  # frees at least one block, or returns False
        self.num_evictable: Callable[[], int] = lambda: 0

    @property
    def num_free(self) -> int:
        return len(self.free_list)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_list)

    def available(self) -> int:
        """Blocks that could be handed out now: free ones plus those a prefix cache would give back."""
        return len(self.free_list) + self.num_evictable()

    def allocate(self) -> int:
        """A free block with reference count 1 (evicting from the prefix cache if needed)."""
        while not self.free_list:
            if self.evict is None or not self.evict():
                raise OutOfKVMemory(f"all {self.num_blocks} KV blocks are in use")
        block = self.free_list.popleft()
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self.ref_counts[block] <= 0:
            raise RuntimeError(f"block {block} is free and cannot gain a reference")
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        """Drop one reference; the block returns to the free list when none is left."""
        if self.ref_counts[block] <= 0:
            raise RuntimeError(f"block {block} is already free (double free)")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_list.append(block)

    def all_free(self) -> bool:
        """True when every block is on the free list and every count is 0 (no leak)."""
        return len(self.free_list) == self.num_blocks and not any(self.ref_counts)


class PagedKVCache:
    """Blocks of ``block_size`` slots from a :class:`BlockPool`; each request keeps a block table.

    Args:
        shape: the model's shape.
        num_blocks: blocks in the pool (the KV budget is ``num_blocks * block_size`` tokens).
        block_size: tokens per block (1 = token-granular, as in SGLang; 16 is vLLM's default).
        scratch_block: store one extra block outside the pool (id ``num_blocks``), where the
            padding rows of a fixed-shape decode batch write harmlessly.
        kv_dtype: ``None`` (the model's dtype), ``"int8"`` or ``"fp8"`` (see :class:`SlotStore`).
    """

    kind = "paged"
    stores_kv = True
    # Plug points (the course's build exercises swap in a learner's functions on one instance;
    # the defaults are the engine's own): the position -> slot lookup through a block table,
    # used for every K/V write and, when swapped, for every read too; and the count of new
    # blocks a request needs, used by every allocation.
    slot_lookup: Callable[[list[int], int, int, int], list[int]] = staticmethod(paged_slots)
    block_count: Callable[[int, int, int, int], int] = staticmethod(paged_blocks_needed)

    def __init__(
        self,
        shape: ModelShape,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        scratch_block: bool = False,
        kv_dtype: str | None = None,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.shape, self.block_size = shape, block_size
        self.pool = BlockPool(num_blocks)
        self.scratch_block = num_blocks if scratch_block else None
        stored = num_blocks + (1 if scratch_block else 0)
        self.store = SlotStore(shape, stored * block_size, dtype, torch.device(device), kv_dtype)
        self.k, self.v = self.store.k, self.store.v
        self.bytes_per_token = self.store.bytes_per_token
        self.block_fill = [0] * num_blocks  # slots of each block holding a token (for used bytes)
        self.peak_blocks_used = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``num_new_tokens`` more tokens."""
        return self.block_count(seq.num_computed, num_new_tokens, len(seq.block_table), self.block_size)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.pool.available()

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq.block_table`` to cover ``num_new_tokens`` more tokens (raises OutOfKVMemory)."""
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            seq.block_table.append(self.pool.allocate())
        end = seq.num_computed + num_new_tokens
        for i in range(seq.num_computed // self.block_size, len(seq.block_table)):
            block = seq.block_table[i]
            self.block_fill[block] = max(
                self.block_fill[block], min(self.block_size, end - i * self.block_size)
            )
        self.peak_blocks_used = max(self.peak_blocks_used, self.pool.num_used)

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s reference on each of its blocks (shared blocks stay with their other owners).

        In table order, so the free list gets them back in order and the next request is
        handed consecutive blocks again (whose K/V attention can then read in place).
        """
        for block in seq.block_table:
            self.pool.decref(block)
            if self.pool.ref_counts[block] == 0:
                self.block_fill[block] = 0
        seq.block_table = []

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep the blocks of ``seq``'s first ``num_tokens`` tokens and give the rest back.

        Rejected speculative tokens roll back this way: a block that held only rejected tokens
        returns to the pool, and the last kept block's fill counts only the kept tokens.
        """
        keep = math.ceil(num_tokens / self.block_size)
        for block in reversed(seq.block_table[keep:]):
            self.pool.decref(block)
            if self.pool.ref_counts[block] == 0:
                self.block_fill[block] = 0
        del seq.block_table[keep:]
        if keep and num_tokens % self.block_size:
            last = seq.block_table[-1]
            if self.pool.ref_counts[last] == 1:  # not shared: its fill is this sequence's alone
                self.block_fill[last] = num_tokens - (keep - 1) * self.block_size

    def slots(self, seq: Sequence, start: int, count: int) -> list[int]:
        """Slot ids of positions ``start .. start+count-1``: block_table[pos // B] * B + pos % B."""
        return self.slot_lookup(seq.block_table, self.block_size, start, count)

    def fill_metadata(
        self, meta: AttentionMetadata, seqs: list[Sequence], batched_decode: bool = True
    ) -> None:
        """Block tables, and the slot of every context token (computed once per step, used by every layer).

        Sequences decoding one token are gathered into one ``(B, L)`` slot matrix when
        ``batched_decode`` is on; the others (prefill chunks) get one slot vector each.
        """
        bs, device = self.block_size, self.k.device
        meta.block_tables = [list(s.block_table) for s in seqs]
        decode = _decode_indices(meta) if batched_decode else []
        if self.slot_lookup is not paged_slots:  # a swapped-in lookup serves the reads as well
            self._fill_with_lookup(meta, seqs, decode)
            return
        meta.context_slots = [None] * len(seqs)
        batched = set(decode)
        for i, (s, n) in enumerate(zip(seqs, meta.context_lens, strict=False)):
            if i in batched:
                continue
            table = torch.tensor(
                s.block_table[: math.ceil(n / bs)], dtype=torch.long, device=device
            )
            meta.context_slots[i] = block_table_slots(table[None], bs)[0, :n]
        if decode:
            width = math.ceil(max(meta.context_lens[i] for i in decode) / bs)
            # Short tables are padded with block 0: any valid block, the length mask hides it.
            rows = [seqs[i].block_table[:width] for i in decode]
            table = torch.tensor(
                [r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device
            )
            _set_decode(meta, decode, block_table_slots(table, bs))

    def _fill_with_lookup(self, meta: AttentionMetadata, seqs: list[Sequence], decode: list[int]) -> None:
        """:meth:`fill_metadata` through :attr:`slot_lookup` (one call per sequence and step)."""
        device = self.k.device
        rows = [
            torch.as_tensor(list(self.slot_lookup(list(s.block_table), self.block_size, 0, n)),
                            dtype=torch.long, device=device)
            for s, n in zip(seqs, meta.context_lens, strict=False)
        ]
        batched = set(decode)
        meta.context_slots = [None if i in batched else row for i, row in enumerate(rows)]
        if decode:
            width = max(meta.context_lens[i] for i in decode)
            # Padded with the row's first slot (a valid slot: the length mask hides it).
            table = torch.stack([torch.cat([rows[i], rows[i][:1].expand(width - len(rows[i]))]) for i in decode])
            _set_decode(meta, decode, table)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.store.write(layer, slots, k, v)

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
        s = torch.tensor(src, dtype=torch.long, device=self.k.device)
        d = torch.tensor(dst, dtype=torch.long, device=self.k.device)
        self.store.copy(s, d)

    def memory_report(self, seqs: Iterable[Sequence] = ()) -> KVMemoryReport:
        used_blocks = [b for b in range(self.num_blocks) if self.pool.ref_counts[b] > 0]
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
