"""Tables for people: every number rounded to a few significant figures, units in the headers.

A chapter describes its table once as a list of :class:`Column`; :func:`people_table` turns
its result rows (dataclasses or dicts) into a DataFrame of display strings that marimo,
Jupyter, the tour's markdown and the slides all show the same way. Missing values read "—",
never ``None`` or ``NaN``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..units import fmt_bytes, human

FORMATS = ("sig", "int", "bytes", "pct", "ratio", "text", "bool")


@dataclass(frozen=True)
class Column:
    """One column: where its value comes from, its header (with the unit) and how to show it.

    ``fmt``: ``"sig"`` (``digits`` significant figures), ``"int"`` (thousands separators),
    ``"bytes"`` (GB and GiB side by side), ``"pct"`` (a fraction shown as a percentage),
    ``"ratio"`` (``1.23×``), ``"text"`` or ``"bool"`` (yes/no). ``scale`` multiplies the value
    first (seconds -> ms with ``1e3``). ``missing`` is shown for ``None``/NaN.
    """

    key: str
    label: str
    fmt: str = "sig"
    digits: int = 3
    scale: float = 1.0
    missing: str = "—"

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {self.fmt!r}")

    def show(self, value: Any) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return self.missing
        if self.fmt == "text":
            return str(value)
        if self.fmt == "bool":
            return "yes" if value else "no"
        x = float(value) * self.scale
        if self.fmt == "int":
            return f"{round(x):,}"
        if self.fmt == "bytes":
            return fmt_bytes(x, self.digits)
        if self.fmt == "pct":
            return f"{human(100 * x, self.digits)}%"
        if self.fmt == "ratio":
            return f"{human(x, self.digits)}×"
        return human(x, self.digits, keep_zeros=True)


def _get(row: Any, key: str) -> Any:
    if isinstance(row, dict):
        return row.get(key)
    return getattr(row, key, None)


def people_table(rows: Iterable[Any], columns: Sequence[Column]) -> pd.DataFrame:
    """A DataFrame of display strings, one row per input row, one column per :class:`Column`."""
    return pd.DataFrame(
        [{c.label: c.show(_get(r, c.key)) for c in columns} for r in rows],
        columns=[c.label for c in columns],
    )


def as_records(rows: Iterable[Any]) -> list[dict[str, Any]]:
    """Dataclass rows as plain dicts (for JSON and for DataFrames of raw numbers)."""
    return [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in rows]


def markdown(frame: pd.DataFrame) -> str:
    """A people table as a GitHub-flavoured markdown table (the tour's report, the slides)."""
    return frame.to_markdown(index=False, disable_numparse=True)
