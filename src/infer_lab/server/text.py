"""Token ids to streamed text, with stop strings, at a cost per token that does not grow with the answer.

Decoding token by token is wrong for byte-level tokenizers: one character can span several
tokens, and a space may belong to the next token. Decoding the whole answer at every token is
right but costs O(answer) per token. So we decode a short *window*: the tokens since the last
text we produced plus the one before them (for tokenizers whose decoding of a token depends
on its left neighbour), and take what the window adds to the text we already had. A window
that ends in an incomplete character (U+FFFD at the end) waits for the next token.

Stop strings are matched the same way: only the text not sent yet is searched, which is the
new text plus a held-back tail of at most ``max(len(stop)) - 1`` characters (the longest end
of the text that could still grow into a stop string).
"""

from __future__ import annotations

from typing import Any

_INCOMPLETE = "\ufffd"


class TextStream:
    """Accumulates generated token ids and yields the text that is safe to send."""

    def __init__(self, tokenizer: Any, stop: list[str] | None = None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.token_ids: list[int] = []
        self.stopped = False  # a stop string was found: the answer ends before it
        self._window_start = 0  # first token of the decode window
        self._window_read = 0  # tokens up to here are already turned into text
        self._unsent = ""  # text produced but held back (it may start a stop string)
        self._stop_starts = {s[0] for s in self.stop}

    def add(self, token_id: int) -> str:
        """Add one token; return the new text that can be sent now (possibly empty)."""
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        return self._release(self._decode_new(final=False))

    def flush(self) -> str:
        """At the end of generation: everything not sent yet (no stop string can complete now)."""
        if self.stopped:
            return ""
        out = self._release(self._decode_new(final=True))
        if self.stopped:
            return out
        out, self._unsent = out + self._unsent, ""
        return out

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _decode_new(self, final: bool) -> str:
        """Text the tokens after ``_window_read`` add; "" while a character is incomplete."""
        if self._window_read == len(self.token_ids):
            return ""
        before = self._decode(self.token_ids[self._window_start : self._window_read])
        now = self._decode(self.token_ids[self._window_start :])
        if not final and now.endswith(_INCOMPLETE):
            return ""
        self._window_start, self._window_read = self._window_read, len(self.token_ids)
        return now[len(before) :]

    def _release(self, new: str) -> str:
        """Add ``new`` to the unsent text; return what can be sent, stopping at a stop string."""
        text = self._unsent + new
        cut = min((i for i in (text.find(s) for s in self.stop) if i != -1), default=-1)
        if cut != -1:
            self.stopped, self._unsent = True, ""
            return text[:cut]
        hold = self._stop_prefix_overlap(text)
        self._unsent = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def _stop_prefix_overlap(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        longest = max((len(s) for s in self.stop), default=1) - 1
        for start in range(max(0, len(text) - longest), len(text)):
            if text[start] in self._stop_starts:
                tail = text[start:]
                if any(len(s) > len(tail) and s.startswith(tail) for s in self.stop):
                    return len(tail)
        return 0
