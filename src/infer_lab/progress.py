"""Progress on long work, rendered by whatever is showing it: marimo, Jupyter or a terminal.

In a marimo notebook tqdm writes to stderr, which marimo shows as red boxes; marimo's own
``mo.status.progress_bar`` is the native bar there. Jupyter and terminals get tqdm.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def in_notebook() -> bool:
    """True inside a running marimo notebook (editor or app), not in script mode."""
    if "marimo" not in sys.modules:
        return False
    try:
        import marimo as mo  # optional: marimo

        return bool(mo.running_in_notebook())
    except Exception:
        return False


def progress(
    iterable: Iterable, desc: str = "", total: int | None = None, disable: bool | None = None
) -> Iterable[Any]:
    """Wrap ``iterable`` in a progress bar: marimo's in marimo, tqdm's elsewhere."""
    if disable:
        return iterable
    if in_notebook():
        import marimo as mo  # optional: marimo

        if total is None and not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        return mo.status.progress_bar(iterable, title=desc or None, total=total, remove_on_exit=True)
    from tqdm.auto import tqdm  # defers tqdm.auto (~50 ms; probes for Jupyter)

    return tqdm(iterable, desc=desc, total=total, disable=disable, leave=False)
