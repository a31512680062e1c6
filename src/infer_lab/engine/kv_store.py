"""Where K and V are stored: flat *slots*, one token's K/V each, and attention through a block table.

Every layer's K (and V) is one tensor ``(num_slots, kv_heads, head_dim)``. With paged KV the slots
are cut into blocks of ``block_size``: block ``b`` owns slots ``b * block_size .. b * block_size +
block_size - 1``, and position ``p`` of a request lives in slot
``block_table[p // block_size] * block_size + p % block_size`` (:func:`paged_slots`), the
paged version of a virtual-to-physical address translation.

:class:`PagedKVStore` is the interface the engine uses, and the one the course's build track asks
a learner to write (stage 3):

* ``slots(block_table, start, count)``: where positions ``start .. start + count - 1`` go;
* ``write(layer, slots, k, v)``: store this step's new K/V;
* ``attend(layer, q, block_table, context_len, scale)``: one request's queries over its context,
  read through its block table;
* ``copy(src, dst)``: copy K/V between slots (a prefix cache's copy-on-write of a shared block).

The library's ``attend`` gathers the context and calls SDPA: short and exact. A real paged
attention kernel instead walks the block table one block (a *tile*) at a time, folding each tile
into a running max, sum and output (online softmax), and never materializes the context; the
learner's version does that. The engine's fast paths (one batched gather for all decoding
requests, an in-place read of consecutive blocks) use :class:`SlotStore`'s ``gather`` and
``span`` directly and only exist for this store.
"""

from __future__ import annotations

import torch

from ..quant.kv_formats import quantize_kv
from .layers import causal_attention

KV_DTYPES = ("int8", "fp8")


def paged_slots(block_table: list[int], block_size: int, start: int, count: int) -> list[int]:
    """Slot ids of positions ``start .. start+count-1``: ``block_table[p // B] * B + p % B``."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]


def block_table_slots(block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block ids ``(B, blocks)`` -> the slot of every position ``(B, blocks * block_size)``.

    :func:`paged_slots` for whole tables at once, on the device.
    """
    offsets = torch.arange(block_size, device=block_tables.device)
    return (block_tables[:, :, None] * block_size + offsets).flatten(1)


class SlotStore:
    """K and V of every layer in flat slots: ``(layers, num_slots, kv_heads, head_dim)`` each.

    Plain, in the model's dtype; or quantized (``kv_dtype="int8"`` or ``"fp8"``, e4m3) with one
    fp32 scale per token per head, written once when the token arrives and never re-scaled
    (:func:`infer_lab.quant.kv_formats.quantize_kv`). Attention reads it back through :meth:`gather`,
    dequantized to the model's dtype.
    """

    def __init__(self, layers: int, num_slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", kv_dtype: str | None = None):
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be None, {' or '.join(KV_DTYPES)}; got {kv_dtype!r}")
        self.dtype, self.kv_dtype = dtype, kv_dtype
        size = (layers, num_slots, kv_heads, head_dim)
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
        """Store the K/V ``(T, kv_heads, d)`` of ``T`` new tokens at their ``slots`` ``(T,)`` int64."""
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

    def copy(self, src: list[int] | torch.Tensor, dst: list[int] | torch.Tensor) -> None:
        """Copy every layer's K/V (and scales) of slots ``src`` into slots ``dst``."""
        device = self.k.device
        src, dst = torch.as_tensor(src, dtype=torch.long, device=device), torch.as_tensor(dst, dtype=torch.long,
                                                                                        device=device)
        tensors = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.kv_dtype else [])
        for t in tensors:
            t[:, dst] = t[:, src]


class PagedKVStore(SlotStore):
    """K/V in blocks of ``block_size`` slots, written and read through block tables.

    Args:
        num_blocks, block_size: the pool's blocks and slots per block.
        layers, kv_heads, head_dim: the model's KV shape.
        dtype, device: of the stored K/V (the model's).
        kv_dtype: ``None``, ``"int8"`` or ``"fp8"`` (see :class:`SlotStore`).
        extra_blocks: blocks stored beyond the pool (ids ``num_blocks ..``): a scratch block
            where padding rows of a fixed-shape decode batch write harmlessly.
    """

    def __init__(self, num_blocks: int, block_size: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", kv_dtype: str | None = None,
                 extra_blocks: int = 0):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        super().__init__(layers, (num_blocks + extra_blocks) * block_size, kv_heads, head_dim, dtype,
                         device, kv_dtype)
        self.block_size = block_size

    def slots(self, block_table: list[int], start: int, count: int) -> list[int]:
        """The slot of each position ``start .. start + count - 1`` (:func:`paged_slots`)."""
        return paged_slots(block_table, self.block_size, start, count)

    def attend(self, layer: int, q: torch.Tensor, block_table: list[int], context_len: int,
               scale: float) -> torch.Tensor:
        """One request's queries over its cached context: ``(n, heads, d)`` in, ``(n, heads, d)`` out.

        ``q`` holds the last ``n`` positions of a context of ``context_len`` tokens (their K/V
        already written): query ``i`` sees positions ``0 .. context_len - n + i`` (causal).
        """
        slots = torch.tensor(self.slots(block_table, 0, context_len), dtype=torch.long, device=q.device)
        k, v = self.gather(layer, slots)
        out = causal_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale)
        return out[0].transpose(0, 1)
