"""How an exercise's checks talk to the learner: one line per case, saying what failed and by how much.

A check function receives the learner's functions and a :class:`Report`. It calls the
learner through :meth:`Report.call` (which turns ``NotImplementedError`` into "not done yet"
and any other exception into a failed case that names the input) and records each case with
:meth:`Report.close`, :meth:`Report.equal` or :meth:`Report.record`. A numeric miss reports
expected, got, their ratio and the relative error, and names the mistake when the ratio is
a known one (a factor of 2, GiB for GB, the layer count...).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ...units import GB, GiB

GIB_FOR_GB = GB / GiB  # a GB answer given in GiB comes out this many times too small (0.931)
# float32 (torch's default dtype) keeps 24 bits: 1 ulp is 6e-8 relative. A few operations in float32
# land within a few ulp, so a non-integer answer within this of the reference is the right formula.
F32_REL_TOL = 2e-6


@dataclass(frozen=True)
class Outcome:
    """One case of one exercise: its input, whether it passed, and what the learner should read."""

    case: str
    passed: bool
    detail: str


class NotDoneYet(Exception):
    """The learner's function still raises ``NotImplementedError`` (the untouched starter)."""


class CaseAborted(Exception):
    """A case raised or returned something unusable; it is recorded, later cases are skipped."""


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer: ``got / expected == factor`` means ``text``."""

    factor: float
    text: str


def factor_of_2(what_too_small: str = "", what_too_large: str = "") -> list[Mistake]:
    """The two factor-of-2 misses, each with the likely reason."""
    small = "off by a factor of 2 (half the right answer)" + (f": {what_too_small}" if what_too_small else "")
    large = "off by a factor of 2 (twice the right answer)" + (f": {what_too_large}" if what_too_large else "")
    return [Mistake(0.5, small), Mistake(2.0, large)]


def forgot_layers(layers: int) -> Mistake:
    return Mistake(1 / layers, f"off by the layer count ({layers}): multiply by the number of layers")


def gib_not_gb() -> Mistake:
    return Mistake(GIB_FOR_GB, "GiB instead of GB: you divided by 2^30; the answer is in GB (1e9 B), "
                               "which is 1.074x larger")


def fmt_number(value: Any, unit: str = "") -> str:
    """``131,072 B``, ``42.95 GB``, ``3.1e-05 s``: integers with separators, floats to 6 figures."""
    if isinstance(value, bool) or value is None:
        text = repr(value)
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float) and math.isfinite(value) and 1e6 <= abs(value) < 1e18 and value.is_integer():
        text = f"{value:,.0f}"
    elif isinstance(value, float):
        text = f"{value:,.6g}" if math.isfinite(value) and 1e-3 <= abs(value) < 1e15 else f"{value:.6g}"
    else:
        text = repr(value)
    return f"{text} {unit}".rstrip()


def short_repr(value: Any, limit: int = 90) -> str:
    """``repr`` cut to ``limit`` characters (long lists end in ``...``)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _as_float(value: Any) -> float | None:
    """A plain float from an int, float, Fraction, numpy scalar or 0-d array/tensor; None otherwise."""
    if isinstance(value, bool):
        return None
    try:
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 and not isinstance(value, numbers.Number):
            value = value.item()  # a 0-d numpy array or torch tensor
        if isinstance(value, bool):
            return None
        return float(value) if isinstance(value, numbers.Real) else None
    except (TypeError, ValueError, OverflowError):
        return None


def plain(value: Any) -> Any:
    """numpy/torch scalars as Python ints/floats, sequences (tuples, arrays, generators) as lists of those.

    So an answer is compared by its value, whatever container or number type it comes in.
    Strings, dicts and None are returned unchanged.
    """
    if isinstance(value, (str, bytes, dict)) or value is None or isinstance(value, bool):
        return value
    if hasattr(value, "tolist") and not isinstance(value, numbers.Number):
        return value.tolist()  # numpy arrays and torch tensors (any shape; 0-d gives a scalar)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, float):
        f = float(value)
        return int(f) if hasattr(value, "dtype") and f.is_integer() and "int" in str(value.dtype) else f
    if isinstance(value, (list, tuple, range)) or (isinstance(value, Iterable) and not isinstance(value, numbers.Number)):
        try:
            return [plain(v) for v in value]
        except TypeError:
            return value
    return value


def _closest_wrong(value: float, wrong: dict[str, float], rel_tol: float) -> str | None:
    """The known wrong formula whose value is nearest ``value`` (within ``rel_tol``), if any.

    Two wrong formulas that give the same value here cannot be told apart: both are named.
    """
    near = sorted((abs(value - v) / abs(v) if v else abs(value), v, text) for text, v in wrong.items()
                  if math.isclose(value, v, rel_tol=rel_tol) or value == v)
    if not near:
        return None
    best = near[0][1]
    texts = [text for _, v, text in near if v == best or math.isclose(v, best, rel_tol=1e-12)]
    return texts[0] if len(texts) == 1 else "either " + ", or ".join(texts) + " (both give this value here)"


def _simple_factor(ratio: float) -> str | None:
    """``"4x too large"`` / ``"8x too small"`` when the ratio is (nearly) a whole number or its inverse."""
    if ratio == 0 or not math.isfinite(ratio):
        return None
    for r, word in ((ratio, "too large"), (1 / ratio, "too small")):
        n = round(r)
        if n >= 2 and abs(r - n) / n < 1e-9:
            return f"exactly {n}x {word}"
        if n >= 2 and abs(r - n) / n < 1e-3:
            return f"about {n}x {word} ({r:.4g}x)"
    return None


def ratio_text(got: float, expected: float, mistakes: Iterable[Mistake] = (), slack: float = 2e-3) -> str:
    """What the ratio ``got / expected`` says: a named mistake, a whole factor, or the percentage.

    A mistake is named when the ratio is within ``slack`` of its factor (the check's own
    tolerance for a prediction, so an approximate answer with the mistake is still named).
    """
    if expected == 0:
        return ""
    ratio = got / expected
    if ratio == 0:
        return "got 0"
    if ratio < 0:
        return f"got/expected = {ratio:.4g}: the sign is wrong"
    parts = [f"got/expected = {ratio:.4g}"]
    named = next((m.text for m in mistakes if abs(ratio / m.factor - 1) <= max(slack, 2e-3)), None)
    if named:
        parts.append(named)
    else:
        simple = _simple_factor(ratio)
        off = abs(ratio - 1)
        pct = f"{off:.1%}" if off >= 1e-3 else f"{off * 100:.3g}%"
        parts.append(simple or f"{pct} too {'large' if ratio > 1 else 'small'}")
    return ": ".join(parts)


@dataclass
class Report:
    """The outcomes of one exercise, in order."""

    outcomes: list[Outcome] = field(default_factory=list)
    engine_runs: list[bool] = field(default_factory=list)  # build tier: per engine run, tokens identical?

    # -- calling the learner ---------------------------------------------------------------

    def call(self, fn: Callable[..., Any], *args: Any, case: str, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; NotImplementedError -> not done yet; other errors -> a failed case."""
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as exc:
            raise NotDoneYet(f"{fn.__name__}() still raises NotImplementedError ({exc})" if str(exc)
                             else f"{fn.__name__}() still raises NotImplementedError") from None
        except Exception as exc:  # the learner's bug is a result here, not a crash of the checker
            self.record(case, False, f"{fn.__name__}() raised {type(exc).__name__}: {exc}")
            raise CaseAborted from exc

    # -- recording cases -------------------------------------------------------------------

    def record(self, case: str, passed: bool, detail: str = "") -> bool:
        self.outcomes.append(Outcome(case, passed, detail))
        return passed

    def close(
        self,
        case: str,
        got: Any,
        expected: float,
        rel_tol: float = 1e-9,
        abs_tol: float = 0.0,
        unit: str = "",
        mistakes: Iterable[Mistake] = (),
        wrong: dict[str, float] | None = None,
        hint: str = "",
    ) -> bool:
        """A number within ``rel_tol`` (or ``abs_tol``) of ``expected``; a miss says by how much.

        ``wrong`` maps a description of a known wrong formula to the value it gives, for
        mistakes that are no fixed factor (the inverse, a forgotten offset...).
        """
        value = _as_float(got)
        if value is None:
            return self.record(case, False, f"expected a number ({fmt_number(expected, unit)}), "
                                            f"got {type(got).__name__} {got!r:.80}")
        if math.isnan(value):
            return self.record(case, False, f"expected {fmt_number(expected, unit)}, got NaN")
        whole = isinstance(got, numbers.Integral) and not isinstance(got, bool)
        # A count (an integer reference) is exact; a non-integer reference is met by float32 arithmetic too.
        tol = rel_tol if float(expected).is_integer() else max(rel_tol, F32_REL_TOL)
        err = abs(value - expected)
        if err <= max(abs_tol, tol * abs(expected)):
            shown = fmt_number(int(got) if whole else value, unit)
            if rel_tol >= 1e-3 and err and expected:  # a prediction: show what it was checked against
                shown += f" (reference {fmt_number(expected, unit)}, yours/reference = {value / expected:.3f})"
            return self.record(case, True, shown)
        why = _closest_wrong(value, wrong or {}, max(rel_tol, 2e-3))
        shown_exp, shown_got = fmt_number(expected, unit), fmt_number(int(got) if whole else value, unit)
        if shown_exp == shown_got:  # too close for 6 figures: show every digit that differs
            shown_exp, shown_got = f"{float(expected)!r} {unit}".rstrip(), f"{value!r} {unit}".rstrip()
        detail = f"expected {shown_exp}, got {shown_got}"
        explanation = f"that is {why}" if why else ratio_text(value, expected, mistakes, slack=rel_tol)
        if explanation:
            detail += f" ({explanation})"
        tol_text = f"within {rel_tol:.0%}" if rel_tol >= 0.01 else ""
        if tol_text:
            detail += f"; the check accepts answers {tol_text}"
        if hint:
            detail += f". Hint: {hint}"
        return self.record(case, False, detail)

    def equal(self, case: str, got: Any, expected: Any, hint: str = "", show: Callable[[Any], str] | None = None) -> bool:
        """Exact equality (lists, ints, strings); a miss shows both and, for lists, the first difference."""
        show = show or short_repr
        got, expected = plain(got), plain(expected)
        if got == expected:
            return self.record(case, True, show(got))
        detail = f"expected {show(expected)}, got {show(got)}"
        if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
            first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
            if first is not None:
                detail += f"; first difference at index {first}: expected {expected[first]!r}, got {got[first]!r}"
            elif len(got) != len(expected):
                detail += f"; length {len(got)} instead of {len(expected)}"
        if hint:
            detail += f". Hint: {hint}"
        return self.record(case, False, detail)

    # -- summary ---------------------------------------------------------------------------

    @property
    def passed(self) -> bool:
        return bool(self.outcomes) and all(o.passed for o in self.outcomes)
