"""Stage 2 · The block manager: a reference solution."""

import math
from collections import deque

from infer_lab.engine.block_manager import OutOfKVMemory


class BlockManager:
    """Fixed-size KV blocks with a free list and reference counts."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs = [0] * num_blocks
        self.free = deque(range(num_blocks))  # first in, first out

    def blocks_needed(self, num_computed: int, num_new_tokens: int, blocks_held: int) -> int:
        return max(0, math.ceil((num_computed + num_new_tokens) / self.block_size) - blocks_held)

    def num_free_blocks(self) -> int:
        return len(self.free)

    def ref_count(self, block: int) -> int:
        return self.refs[block]

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        missing = self.blocks_needed(num_tokens, 0, len(block_table))
        if missing > len(self.free):
            raise OutOfKVMemory(f"{missing} blocks needed, {len(self.free)} free")
        for _ in range(missing):
            block = self.free.popleft()
            self.refs[block] = 1
            block_table.append(block)

    def shrink(self, block_table: list[int], num_tokens: int) -> None:
        keep = math.ceil(num_tokens / self.block_size)
        for block in block_table[keep:]:
            self.release(block)
        del block_table[keep:]

    def share(self, block: int) -> None:
        if self.refs[block] == 0:
            raise RuntimeError(f"block {block} is free and cannot be shared")
        self.refs[block] += 1

    def release(self, block: int) -> None:
        if self.refs[block] == 0:
            raise RuntimeError(f"block {block} is already free (double free)")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)
