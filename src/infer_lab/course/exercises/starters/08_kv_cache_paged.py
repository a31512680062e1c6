"""Chapter 08 · KV cache and PagedAttention: exercises.

Fill in each function, then run `infer-lab check 08`. A slot holds the K/V of one token;
block b of size B owns slots b*B .. b*B + B-1.
"""


def slots(block_table: list[int], block_size: int, start: int, count: int) -> list[int]:
    """The KV slot of each position ``start .. start + count - 1`` of one request.

    ``block_table[i]`` is the physical block that holds the request's logical block ``i``
    (its positions i*B .. i*B + B-1).
    """
    raise NotImplementedError


def blocks_needed(num_computed: int, num_new_tokens: int, blocks_held: int, block_size: int) -> int:
    """New blocks a request must get to hold ``num_new_tokens`` more tokens.

    It already has ``num_computed`` tokens cached in ``blocks_held`` blocks (the last one
    may be partly full).
    """
    raise NotImplementedError


def wasted_slots(lengths: list[int], block_size: int, max_model_len: int) -> tuple[int, int]:
    """Predict the reserved-but-empty slots for requests of ``lengths`` tokens, two ways.

    Paged: each request holds just enough blocks of ``block_size`` for its tokens.
    Contiguous: each request reserves one region of ``max_model_len`` slots for its whole life.

    Returns:
        ``(paged, contiguous)``: slots reserved minus slots holding a token, all requests.
    """
    raise NotImplementedError
