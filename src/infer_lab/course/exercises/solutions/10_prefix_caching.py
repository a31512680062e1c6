"""Chapter 10 · Prefix caching: reference solutions."""


def block_hashes(tokens: list[int], block_size: int) -> list[int]:
    """Chain: each hash covers the previous hash and this block's tokens."""
    hashes, parent = [], 0
    for i in range(len(tokens) // block_size):
        parent = hash((parent, tuple(tokens[i * block_size:(i + 1) * block_size])))
        hashes.append(parent)
    return hashes


def reused_tokens(shared: int, new_prompt_len: int, block_size: int, cache: str) -> int:
    """At most all but the last token; the hash cache rounds down to whole blocks."""
    usable = min(shared, new_prompt_len - 1)
    return usable if cache == "radix" else usable // block_size * block_size


def shared_prompt_hit_rate(n_requests: int, system_tokens: int, user_tokens: int, block_size: int,
                           cache: str) -> float:
    """Every request after the first reuses the system prompt (whole blocks of it for the hash cache)."""
    per_request = reused_tokens(system_tokens, system_tokens + user_tokens, block_size, cache)
    return (n_requests - 1) * per_request / (n_requests * (system_tokens + user_tokens))
