"""Fits and ratios that cannot be true: flagged in words, never printed as findings.

A least-squares line through noisy timings can come out with a negative fixed cost; a speedup
measured on a busy machine can exceed what the mechanism allows. These functions say so, with
the reason, so that a chapter prints a caution instead of a finding. Each returns a list of
sentences (empty when nothing is wrong).
"""

from __future__ import annotations

from collections.abc import Sequence

R2_FLOOR = 0.5  # a line explaining under half the variance is not a finding


def r_squared(points: Sequence[tuple[float, float]], intercept: float, slope: float) -> float | None:
    """Coefficient of determination of ``y = intercept + slope x`` over ``points`` (None when
    the points have no spread in y, or are fewer than 3)."""
    if len(points) < 3:
        return None
    ys = [y for _, y in points]
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    if total <= 0:
        return None
    residual = sum((y - intercept - slope * x) ** 2 for x, y in points)
    return 1.0 - residual / total


def line_fit_flags(what: str, intercept: float, slope: float, r2: float | None = None,
                   r2_floor: float = R2_FLOOR, unit: str = "ms", scale: float = 1e3) -> list[str]:
    """Cautions for a cost fitted as ``intercept + slope x`` (seconds; shown × ``scale`` in ``unit``).

    A cost cannot have a negative fixed part or a negative slope, and a fit with ``r2`` under
    ``r2_floor`` explains too little of the spread to be read at all.
    """
    flags = []
    if intercept < 0:
        flags.append(f"the fit of {what} has a negative fixed cost ({intercept * scale:.1f} {unit}), which no "
                     "real pass can have: the timings are too few or too noisy for a line, so the fitted "
                     "costs below are not findings")
    if slope < 0:
        flags.append(f"the fit of {what} has a negative cost per token ({slope * scale:.2f} {unit}), which is "
                     "impossible: the timings are noise-dominated")
    if r2 is not None and r2 < r2_floor:
        flags.append(f"the fit of {what} explains only R² = {r2:.2f} of the spread (floor {r2_floor}): "
                     "read it as noise, not as a cost model")
    return flags


def speedup_flags(what: str, speedup: float, tokens_per_pass: float, tolerance: float = 0.05) -> list[str]:
    """Caution when a speculative speedup exceeds its tokens per target pass.

    If a verification pass costs at least one plain decode step, the wall-clock speedup is at
    most the tokens each pass yields. Above that (beyond ``tolerance``) the gain is not
    speculation's: the plain and the speculative runs were timed under different conditions (a
    busy machine, a cold cache), or the engine's verification path is cheaper than its own plain
    decode step, which makes the plain baseline the thing to fix.
    """
    if tokens_per_pass > 0 and speedup > tokens_per_pass * (1 + tolerance):
        return [f"{what} measured {speedup:.2f}× at {tokens_per_pass:.2f} tokens per target pass. Speculation "
                "alone cannot give more than its tokens per pass (each pass costs at least one plain step), so "
                "the rest is the two runs timed under different load, or a verification pass cheaper than this "
                "engine's plain decode step; re-run it before reading anything into it"]
    return []


def caution(flags: Sequence[str]) -> str:
    """The flags as one markdown paragraph ('' when there are none)."""
    if not flags:
        return ""
    return "**Implausible, so not a finding:** " + "; ".join(flags) + "."
