"""Chapter 11 · Chunked prefill: reference solutions."""


def chunk_sizes(prompt_len: int, budget: int, num_decoding: int) -> list[int]:
    """What the decodes leave of the budget, step after step; the last chunk is the remainder."""
    room = budget - num_decoding
    chunks, left = [], prompt_len
    while left > 0:
        chunks.append(min(room, left))
        left -= chunks[-1]
    return chunks


def worst_step_tokens(prompt_len: int, num_decoding: int, budget: int, chunked: bool) -> int:
    """Unchunked: the whole prompt plus the decodes in one step; chunked: never more than the budget."""
    if not chunked:
        return prompt_len + num_decoding
    return num_decoding + max(chunk_sizes(prompt_len, budget, num_decoding))
