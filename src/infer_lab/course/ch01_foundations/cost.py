"""Section 0 of chapter 01: why inference cost matters (the experiment is infer_lab.course.opener, shown in the cell)."""

from __future__ import annotations

from ...units import human
from ..opener import TokenVolume, tokens_in_words

GUESS_WITHIN = 2.0  # a guess within this factor of the answer reads "close"


def rate_guess_text(guess_tokens_per_s: float | None, volume: TokenVolume) -> str:
    """The learner's guess of ``volume``'s average tokens per second against the real average.

    ``guess_tokens_per_s`` in tokens/s (``None`` or 0: no guess); the average is the monthly
    volume over a 30.44-day month (:attr:`TokenVolume.tokens_per_s`).
    """
    rate = volume.tokens_per_s
    answer = (f"{volume.qualifier.capitalize()} {tokens_in_words(volume.value)} tokens a month is "
              f"**{volume.qualifier} {tokens_in_words(rate)} tokens per second** on average, day and night.")
    if not guess_tokens_per_s:
        return answer
    ratio = rate / guess_tokens_per_s
    if 1 / GUESS_WITHIN <= ratio <= GUESS_WITHIN:
        verdict = f"your guess is within {human(GUESS_WITHIN)}× of it: close."
    elif ratio > 1:
        verdict = f"the real rate is **{human(ratio, 2)}× higher** than your guess."
    else:
        verdict = f"the real rate is **{human(1 / ratio, 2)}× lower** than your guess."
    return f"You guessed **{tokens_in_words(guess_tokens_per_s)} tokens per second**. {answer} So {verdict}"
