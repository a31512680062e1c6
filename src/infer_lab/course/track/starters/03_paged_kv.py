"""Stage 3 · Paged KV: the store behind PagedAttention, attention one block (a tile) at a time.

Every layer's K (and V) is one tensor of *slots* ``(num_blocks * block_size, kv_heads, head_dim)``.
Block ``b`` owns slots ``b * block_size .. b * block_size + block_size - 1``, and a request's
position ``p`` lives in the slot ``block_table[p // block_size] * block_size + p % block_size``:
its block table translates its logical blocks to physical ones, like a page table. (Stage 2's
block manager hands out the blocks; this store only keeps what is in them.)

The engine, every step and for every layer:

* ``write(layer, slots, k, v)``: the K/V of every new token of the step, at the slots the
  engine got from your ``slots`` (one flat batch: several requests' tokens at once);
* ``attend(layer, q, block_table, context_len, scale)``, once per request: its ``n`` new queries
  over its whole context, read through its block table.

And when the radix prefix cache reuses part of a block another request filled (copy-on-write):
``copy(src_slots, dst_slots)``.

Write ``attend`` the way a paged attention kernel works: walk the block table one block at a
time (each block's slots are consecutive, so a tile is a slice) and fold each tile's scores
into a running max, sum and output per query row and head, with ``online_softmax_update``
(FlashAttention's online softmax). The context is never gathered into one tensor. Make it exact
where naive arithmetic is not: scores in the hundreds (``exp`` overflows float32 above about
88), rows whose scores lie hundreds apart, and tiles the causal mask hides completely from a
row (a prefill's first row sees only position 0, so every later tile is all ``-inf`` for it).

Dtypes: the store keeps K and V in ``dtype``, the model's (float32 in these checks; bfloat16
when an engine runs in bf16), on ``device``. ``write`` may be given K/V in another float
dtype: convert them to ``dtype``. In ``attend``, compute scores and the running max, sum and
output in float32 (or float64) whatever ``dtype`` is, and return the output in q's dtype.

Write ``paged_slots`` (chapter 08's lookup) and ``online_softmax_update`` (chapter 07's) first,
then the store. Check it: ``infer-lab check engine paged``. Your store then runs inside the real
engine (chunked prefill, a radix prefix cache, odd block sizes, the hidden model), every token
compared with transformers. The library's version: ``PagedKVStore`` in
``src/infer_lab/engine/kv_store.py`` (it gathers the context and calls SDPA instead of tiling).
"""

import torch


def paged_slots(block_table: list[int], block_size: int, start: int, count: int) -> list[int]:
    """The slot of each position ``start .. start + count - 1`` of one request.

    ``block_table[i]`` is the physical block that holds the request's logical block ``i`` (its
    positions ``i * block_size .. i * block_size + block_size - 1``). Returns ``count`` slot ids.
    """
    raise NotImplementedError


def online_softmax_update(running_max: torch.Tensor, running_sum: torch.Tensor, output_acc: torch.Tensor,
                          scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one tile of keys into the running softmax state of every query row.

    For query rows with any leading dimensions ``...`` (heads, queries): ``running_max`` and
    ``running_sum`` are ``(..., 1)`` (they start at -inf and 0), ``output_acc`` is ``(..., d)``
    (starts at 0), ``scores`` is the tile's ``(..., tile)`` scaled q.k (``-inf`` where the mask
    hides a key) and ``values`` its ``(..., tile, d)`` V (or ``(tile, d)``). Keep the sum of
    ``exp(score - max)`` in ``running_sum`` and of ``exp(score - max) * v`` in ``output_acc``, both
    measured against the row's running max; when a tile raises the max, bring what was
    accumulated to the new max. The caller finishes with ``output_acc / running_sum``.

    Returns:
        ``(new_max, new_sum, new_acc)``, each shaped like its input.
    """
    raise NotImplementedError


class PagedKVStore:
    """Every layer's K and V in blocks of ``block_size`` slots, written and read through block tables."""

    def __init__(self, num_blocks: int, block_size: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        """Room for ``num_blocks * block_size`` tokens' K and V in each of ``layers`` layers, in ``dtype``.

        Block ids are ``0 .. num_blocks - 1``; ``block_size >= 1`` is any size (1, 3, 16...).
        """
        raise NotImplementedError

    def slots(self, block_table: list[int], start: int, count: int) -> list[int]:
        """The slot of each position ``start .. start + count - 1`` of the request with ``block_table``."""
        raise NotImplementedError

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``T`` tokens' ``k, v (T, kv_heads, head_dim)`` in ``layer`` at ``slots (T,)`` int64."""
        raise NotImplementedError

    def attend(self, layer: int, q: torch.Tensor, block_table: list[int], context_len: int,
               scale: float) -> torch.Tensor:
        """One request's ``n`` queries over its context of ``context_len`` tokens; ``(n, heads, head_dim)``.

        ``q (n, heads, head_dim)`` holds the LAST ``n`` positions of the context, whose K/V are
        already written: query ``i`` sees positions ``0 .. context_len - n + i`` (causal). Query head
        ``h`` reads KV head ``h // (heads // kv_heads)`` (grouped-query attention: consecutive heads
        share one). ``softmax(q k^T * scale) v``, one block of the table at a time.
        """
        raise NotImplementedError

    def copy(self, src_slots: list[int], dst_slots: list[int]) -> None:
        """Copy K and V of slot ``src_slots[i]`` into slot ``dst_slots[i]``, in every layer."""
        raise NotImplementedError
