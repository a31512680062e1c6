"""What several parts of chapter 09 share: wrapped figure titles and plain-number log axes."""

from __future__ import annotations

import textwrap
from typing import Any

from matplotlib.ticker import FuncFormatter, NullFormatter


def _wrap(text: str, width: int = 90) -> str:
    return textwrap.fill(text, width, break_on_hyphens=False)


def _plain_log_ticks(ax: Any, batches: list[int]) -> None:
    """Log axes labelled with plain numbers: the batch sizes on x, ``0.5``/``20``/``400`` on y."""
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
