"""Chapter 12 · Speculative decoding: reference solutions."""

import torch


def verify_greedy(drafts: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """The longest agreeing prefix, then the target's token where they part (or after the last draft)."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target_argmax[accepted]:
        accepted += 1
    return drafts[:accepted] + [target_argmax[accepted]], accepted


def acceptance_probability(p_token: float, q_token: float) -> float:
    """Keep with probability min(1, p / q)."""
    return min(1.0, p_token / q_token)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where the target wants more than the draft gave: max(p - q, 0), normalized."""
    residual = (p - q).clamp_min(0)
    return residual / residual.sum()


def tokens_per_pass(alpha: float, k: int) -> float:
    """1 + alpha + ... + alpha^k: the target's token plus each draft kept with its whole prefix."""
    return sum(alpha ** i for i in range(k + 1))


def ngram_lookup(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Longest suffix first; the latest earlier occurrence; what followed it."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []
