"""Tables for people: every number rounded to a few significant figures, units in the headers.

A chapter describes its table once as a list of :class:`Column`; :func:`people_table` turns
its result rows (dataclasses or dicts) into a DataFrame of display strings that marimo,
Jupyter, the tour's markdown and the slides all show the same way. Missing values read "—",
never ``None`` or ``NaN``.
"""

from __future__ import annotations

import dataclasses
import re
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


MAX_COLUMNS = 9  # wider than this, a table scrolls sideways in a notebook: it is split


def split_wide(frame: pd.DataFrame, max_columns: int = MAX_COLUMNS,
               is_key: Any = None) -> list[pd.DataFrame]:
    """A wide people table as several narrower ones, stacked, each repeating the key columns.

    The keys are the leading columns that ``is_key(column_values)`` accepts (default: columns
    that are not all numbers), at most two; the other columns are dealt out in order, at most
    ``max_columns`` per part including the keys. A table that fits comes back alone.
    """
    if max_columns < 2:
        raise ValueError(f"max_columns must be >= 2, got {max_columns}")
    columns = list(frame.columns)
    if len(columns) <= max_columns:
        return [frame]
    keys = []
    for c in columns[:2]:
        if is_key(frame[c]) if is_key is not None else not _numbers_only(frame[c]):
            keys.append(c)
        else:
            break
    keys = keys or columns[:1]
    rest = [c for c in columns if c not in keys]
    per_part = max_columns - len(keys)
    return [frame[keys + rest[i:i + per_part]] for i in range(0, len(rest), per_part)]


def _numbers_only(column: Any) -> bool:
    values = [str(v) for v in column]
    return bool(values) and all(re.match(r"^\s*[-+−]?[\d,.]+\s*(%|×|x|\w+)?\s*$|^\s*[—–-]\s*$", v) for v in values)

