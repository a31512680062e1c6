"""What several parts of chapter 07 share: the torch threads in words."""

from __future__ import annotations


def threads_text(n: int) -> str:
    return f"{n} torch thread" + ("s" if n != 1 else "")
