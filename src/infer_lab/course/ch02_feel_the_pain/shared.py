"""What several parts of chapter 02 share: the model's shape, a decode step's bytes, and the verdicts
of the timed parts."""

from __future__ import annotations

from typing import Any

from ...analysis import roofline
from ...analysis.compare import dtype_name, shape_of
from ...timing import CONTRADICTED, INCONCLUSIVE, SUPPORTED, MachineLoad
from ...units import human
from ..chapter import SINGLE_RUN_NOISE, finding


def _shape_dtype(lm: Any) -> tuple[Any, str]:
    return shape_of(lm), dtype_name(lm)


def decode_bytes(lm: Any, batch: int, context: int) -> float:
    """Bytes one decode step reads and writes (weights, KV, activations), from the config."""
    shape, dtype = _shape_dtype(lm)
    return sum(o.bytes for o in roofline.decode_ops(shape, batch, context, weight_dtype=dtype, kv_dtype=dtype,
                                                    act_dtype=dtype))


def verdict(outcome: str, claim: str, opposite: str, machine: MachineLoad, spread: str) -> str:
    """The verdict of a timed part: :func:`~infer_lab.course.chapter.finding`, except that a run
    pointing the other way on a machine not found busy is reported as what it measured.

    ``claim`` is the lesson as a sentence without its full stop, ``opposite`` what the run showed
    when it points the other way, ``spread`` the evidence. A busy machine explains a contradiction
    (``finding`` says *inconclusive*); a quiet one does not, so the page says what was measured.
    """
    if outcome != CONTRADICTED or machine.busy:
        return finding(outcome, claim, machine, spread)
    return (f"**This run measured the opposite:** {opposite} ({spread}). {machine.text()} One run can be an "
            "accident: press the button again. If it holds, it is this machine's result at these sizes, and the "
            "numbers below say by how much.")


def guess_line(what: str, guess: float | None, predicted: float, measured: float) -> str:
    """Your guess, the prediction and the measurement of one ratio, side by side."""
    mine = f"your guess **{human(guess, 3)}×**, " if guess else ""  # 0 or None: no guess entered
    return (f"{what}: {mine}predicted **{human(predicted, 3)}×**, measured **{human(measured, 3)}×** "
            f"(measured ÷ predicted = {human(measured / predicted, 3)}).")


def noise_band() -> tuple[float, float]:
    """The ratios, as the page prints them (two decimals), at and beyond which a ratio of two throughputs
    is more than one run's noise: (0.91, 1.10) for ``SINGLE_RUN_NOISE`` = 10%, the same distance either way."""
    return round(1 / (1 + SINGLE_RUN_NOISE), 2), round(1 + SINGLE_RUN_NOISE, 2)


def noise_band_text() -> str:
    """'above 0.91× and below 1.10×': the ratios that are one run's noise (the ends are past it), in the words
    the verdicts use."""
    low, high = noise_band()
    return f"above {low:.2f}× and below {high:.2f}×"


def noise_outcome(ratio: float) -> str:
    """SUPPORTED when a ratio of throughputs (the lesson's side over the other), rounded to the two decimals
    the page prints, is at or above the noise band's top (:func:`noise_band`), CONTRADICTED at or below its
    bottom, else INCONCLUSIVE: one run's noise."""
    low, high = noise_band()
    shown = round(ratio, 2)
    if low < shown < high:
        return INCONCLUSIVE
    return SUPPORTED if shown >= high else CONTRADICTED
