"""Chapter 08 · KV cache and PagedAttention: reference solutions."""

import math


def slots(block_table: list[int], block_size: int, start: int, count: int) -> list[int]:
    """Physical block of the logical block, times the block size, plus the offset inside it."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]


def blocks_needed(num_computed: int, num_new_tokens: int, blocks_held: int, block_size: int) -> int:
    """Blocks for all tokens (rounded up) minus those held, never negative."""
    return max(0, math.ceil((num_computed + num_new_tokens) / block_size) - blocks_held)


def wasted_slots(lengths: list[int], block_size: int, max_model_len: int) -> tuple[int, int]:
    """Paged wastes only the tail of each last block; contiguous the rest of each region."""
    paged = sum(-n % block_size for n in lengths)
    contiguous = sum(max_model_len - n for n in lengths)
    return paged, contiguous
