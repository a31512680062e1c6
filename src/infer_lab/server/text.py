"""Token ids to streamed text, with stop strings.

Decoding token by token is wrong for byte-level tokenizers: one character can span several
tokens, and a space may belong to the next token. So we decode the whole answer so far and
send only what is new, holding back an incomplete character (U+FFFD at the end) and any tail
that could still turn into a stop string.
"""

from __future__ import annotations

from typing import Any


class TextStream:
    """Accumulates generated token ids and yields the text that is safe to send."""

    def __init__(self, tokenizer: Any, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.token_ids: list[int] = []
        self.sent = 0  # characters of the answer already sent
        self.stopped = False  # a stop string was found: the answer ends before it

    def _decode(self) -> str:
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Add one token; return the new text that can be sent now (possibly empty)."""
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        text = self._decode()
        for s in self.stop:
            idx = text.find(s)
            if idx != -1:
                self.stopped = True
                return self._emit(text[:idx])
        safe = len(text)
        if text.endswith("\ufffd"):
            safe -= 1
        safe -= self._stop_prefix_overlap(text[:safe])
        return self._emit(text[:safe])

    def flush(self) -> str:
        """At the end of generation: everything not sent yet (no stop string can complete now)."""
        if self.stopped:
            return ""
        return self._emit(self._decode())

    def _emit(self, text: str) -> str:
        if len(text) <= self.sent:
            return ""
        new = text[self.sent :]
        self.sent = len(text)
        return new

    def _stop_prefix_overlap(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    best = max(best, k)
                    break
        return best
