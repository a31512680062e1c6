"""Byte units, spelled out. GB = 1e9 bytes, GiB = 2**30 bytes; we never mix them silently."""

from __future__ import annotations

import math

KB = 1_000
MB = 1_000_000
GB = 1_000_000_000
TB = 1_000_000_000_000
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


def gb(n_bytes: float) -> float:
    """Bytes to decimal gigabytes (1e9 B)."""
    return n_bytes / GB


def gib(n_bytes: float) -> float:
    """Bytes to binary gibibytes (2**30 B)."""
    return n_bytes / GiB


def fmt_bytes(n_bytes: float, digits: int = 3) -> str:
    """Human label with both unit systems, e.g. ``'0.537 GB (0.500 GiB)'``.

    Picks KB/MB/GB/TB (decimal) by magnitude and shows the matching binary unit beside it,
    so "131 KB" and "128 KiB" appear together and nobody confuses them.
    """
    n = float(n_bytes)
    for dec, bin_, dname, bname in ((TB, TiB, "TB", "TiB"), (GB, GiB, "GB", "GiB"), (MB, MiB, "MB", "MiB"), (KB, KiB, "KB", "KiB")):
        if abs(n) >= dec:
            return f"{_num(n / dec, digits)} {dname} ({_num(n / bin_, digits)} {bname})"
    return f"{int(n)} B"


def _num(value: float, digits: int) -> str:
    """``digits`` significant digits, never in exponent notation (999.5 -> '1000', not '1e+03')."""
    text = f"{value:.{digits}g}"
    return f"{value:.0f}" if "e" in text else text


SMALL = 1e-3  # below this, :func:`human` writes a power of ten
# From here up, :func:`human` writes a power of ten too: a float holds 15 significant decimal digits,
# so an integer of 16 digits or more would print digits the value does not have (6.35e24 written out
# in full ends in "...457,179,136").
LARGE = 1e15
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(value: float, digits: int = 3, keep_zeros: bool = False) -> str:
    """``value`` as a mantissa of ``digits`` significant figures times a power of ten, for people.

    ``6.3498e24, 2 -> '6.3 × 10²⁴'``, ``8.94e-08 -> '8.94 × 10⁻⁸'``, ``9.96e24, 2 -> '1 × 10²⁵'``
    (the rounding carries into the exponent). ``keep_zeros`` keeps the mantissa's trailing zeros.
    """
    mantissa, exponent = f"{float(value):.{max(digits - 1, 0)}e}".split("e")
    if not keep_zeros and "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa} × 10{str(int(exponent)).translate(SUPERSCRIPT)}"


def human(value: float | int | None, digits: int = 3, keep_zeros: bool = False) -> str:
    """A number rounded for people: ``digits`` significant figures, thousands separators, no ``e`` exponent.

    ``24.869571912452834 -> '24.9'``, ``1536.0 -> '1,536'``, ``0.012345 -> '0.0123'``,
    ``8.94e-08 -> '8.94 × 10⁻⁸'`` (below :data:`SMALL`), ``6.35e24 -> '6.35 × 10²⁴'`` (from
    :data:`LARGE` up), ``None`` or NaN -> ``'—'``. Between 10^(digits-1) and :data:`LARGE` a value
    is written as a whole number with separators (``1536 -> '1,536'``, more figures than ``digits``
    but none the float lacks). ``keep_zeros`` keeps trailing zeros (``14.96 -> '15.0'``), so a
    table column shows the same precision in every row.
    """
    if value is None:
        return "—"
    x = float(value)
    if math.isnan(x):
        return "—"
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x == 0:
        return "0"
    if abs(x) < SMALL:  # 8.94e-08 -> '8.94 × 10⁻⁸', never a row of zeros or an exponent in code style
        return power_of_ten(x, digits)
    if abs(x) >= LARGE:  # 6.35e24 -> '6.35 × 10²⁴', never 25 digits of which 10 are float noise
        return power_of_ten(x, digits, keep_zeros)
    if abs(x) >= 10 ** (digits - 1):
        return f"{round(x):,}"
    decimals = digits - 1 - math.floor(math.log10(abs(x)))
    text = f"{x:,.{decimals}f}"
    if keep_zeros or "." not in text:
        return text
    return text.rstrip("0").rstrip(".")


def fmt_duration(seconds: float | None) -> str:
    """A wall time for people: 'under 1 s', '4 s', '16 s', '2 min'; an em dash when unknown.

    Never '0 s': a part that takes a few milliseconds reads 'under 1 s'.
    """
    if seconds is None or seconds != seconds:
        return "—"
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {seconds}")
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"{round(seconds):.0f} s"
    return f"{round(seconds / 60):.0f} min"


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``count(1, "torch thread")`` is '1 torch thread'."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def require_positive(name: str, value: float, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` naming the argument when a size is zero or negative."""
    if value is None or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
