"""Stage 2 · The block manager: KV blocks, who holds each one, and each request's block table.

Paged KV memory (vLLM's PagedAttention) is a pool of ``num_blocks`` blocks of ``block_size``
token slots. A request keeps a *block table*: ``block_table[i]`` is the physical block holding
its logical block ``i`` (its positions ``i * block_size .. i * block_size + block_size - 1``).
Blocks are handed out as a request grows and given back when it finishes, so memory follows the
tokens.

A block may have several holders: two requests that share a prompt prefix, or the prefix cache
that keeps a finished request's blocks for the next one. So every block has a reference count,
and it is free exactly when its count is 0. Keep these invariants:

* a block is free  <=>  its count is 0  <=>  it is in your free list, once;
* ``grow`` takes all the blocks it needs or none (raise ``OutOfKVMemory`` before taking any);
* releasing a free block is a bug in the caller: raise (a double free must not go unnoticed);
* when every holder has let go, every block is free again (no leak).

Block ids are ``0 .. num_blocks - 1``; which free block you hand out is your choice.

Write ``blocks_needed`` first (it is chapter 08's count of new blocks), then the rest.
Check it: ``infer-lab check engine blocks``. Your class then runs inside the real engine, on
hidden traces (preemption, shared prefixes, speculative rollback), with every token compared
with transformers. The library's version: ``src/infer_lab/engine/block_manager.py``.
"""

from infer_lab.engine.block_manager import OutOfKVMemory  # noqa: F401  (raise it when blocks run out)


class BlockManager:
    """Fixed-size KV blocks with a free list and reference counts."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        """A pool of ``num_blocks`` free blocks of ``block_size`` token slots each (both >= 1)."""
        raise NotImplementedError

    def blocks_needed(self, num_computed: int, num_new_tokens: int, blocks_held: int) -> int:
        """New blocks a request must get to hold ``num_new_tokens`` more tokens.

        It already has ``num_computed`` tokens in ``blocks_held`` blocks (the last one may be partly
        full). Returns a count of blocks, never negative.
        """
        raise NotImplementedError

    def num_free_blocks(self) -> int:
        """Blocks no one holds."""
        raise NotImplementedError

    def ref_count(self, block: int) -> int:
        """How many holders ``block`` has (0 when it is free)."""
        raise NotImplementedError

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append free blocks to ``block_table`` (in place) until it holds ``num_tokens`` tokens.

        Each new block gets one holder. All or nothing: when too few blocks are free, raise
        ``OutOfKVMemory`` and leave the table and the pool as they were.
        """
        raise NotImplementedError

    def shrink(self, block_table: list[int], num_tokens: int) -> None:
        """Keep only the blocks that hold the first ``num_tokens`` tokens; let go of the rest.

        In place. Every dropped block loses one holder (this table's); ``num_tokens=0`` lets go of
        the whole table (a request that finished). A speculative step's rejected tokens roll back
        this way too.
        """
        raise NotImplementedError

    def share(self, block: int) -> None:
        """One more holder for ``block``, which must be held already (raise if it is free)."""
        raise NotImplementedError

    def release(self, block: int) -> None:
        """One holder fewer for ``block``; it is free again when none is left (raise if it is free)."""
        raise NotImplementedError
