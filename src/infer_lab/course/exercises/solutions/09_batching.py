"""Chapter 09 · Batching: reference solutions."""

import heapq
import math


def admit_count(waiting_prompt_lens: list[int], num_running: int, free_blocks: int, block_size: int,
                max_num_seqs: int, policy: str) -> int:
    """Head of the queue first, while a slot is free and its prompt's blocks fit; stop at the first miss."""
    if policy == "static" and num_running:
        return 0
    admitted = 0
    for prompt in waiting_prompt_lens:
        blocks = math.ceil(prompt / block_size)
        if num_running + admitted >= max_num_seqs or blocks > free_blocks:
            break
        free_blocks -= blocks
        admitted += 1
    return admitted


def batching_steps(output_lens: list[int], max_num_seqs: int, policy: str) -> int:
    """Static: each batch lasts as long as its longest request. Continuous: a slot frees, the next joins."""
    if policy == "static":
        batches = [output_lens[i:i + max_num_seqs] for i in range(0, len(output_lens), max_num_seqs)]
        return sum(max(batch) for batch in batches)
    slots_free_at = [0] * min(max_num_seqs, len(output_lens))  # the step after which each slot is free
    for length in output_lens:
        start = heapq.heappop(slots_free_at)
        heapq.heappush(slots_free_at, start + length)
    return max(slots_free_at)
