"""Finishing touches every course figure shares: log axes labelled in plain numbers, a tight layout.

Matplotlib labels a log axis with mathtext (``$\\mathdefault{2^{15}}$``). Plain labels read better
("32k" tokens, "0.01" ms), and they keep mathtext's parser out of our figures: in JupyterLab
(ipykernel 7) that parser's first uses in a kernel can fail with a ``ParseException``, so a
learner's first button press drew nothing.
"""

from __future__ import annotations

import math
from typing import Any

from matplotlib.ticker import LogFormatter
from matplotlib.transforms import offset_copy

from .units import human


def log_tick_label(x: float) -> str:
    """A log-axis tick as people write it: 512, 1k, 32k (powers of two ≥ 1024 in units of 1024,
    as contexts are spoken), 100k, 1M, 0.01."""
    if x <= 0:
        return f"{x:g}"
    if x >= 1024 and math.log2(x).is_integer():
        for unit, size in (("G", 2**30), ("M", 2**20), ("k", 2**10)):
            if x >= size:
                return f"{x / size:g}{unit}"
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size * (1 - 5e-4):  # 999.6e9 reads '1T', not '1e+03G'
            return f"{human(x / size)}{unit}"
    return f"{x:,.0f}" if x >= 1 and float(x).is_integer() else human(x)


class PlainLogFormatter(LogFormatter):
    """Matplotlib's log formatter (which ticks get labels), with :func:`log_tick_label` text."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return log_tick_label(x)


def plain_log_axes(fig: Any) -> Any:
    """Relabel every log axis of ``fig`` with plain numbers (majors, and minors where matplotlib
    would label them: an axis that spans few decades)."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                base = axis.get_transform().base
                # Only matplotlib's own log formatters: a figure that set its ticks' text (a
                # FuncFormatter, or NullFormatter to hide crowded minor ticks) keeps it.
                if isinstance(axis.get_major_formatter(), LogFormatter):
                    axis.set_major_formatter(PlainLogFormatter(base))
                if isinstance(axis.get_minor_formatter(), LogFormatter):
                    axis.set_minor_formatter(PlainLogFormatter(base, labelOnlyBase=False))
    return fig


FIGURE_KWARGS = frozenset({"figsize", "dpi", "facecolor", "edgecolor", "layout", "constrained_layout",
                           "tight_layout", "frameon", "linewidth"})


def subplots(nrows: int = 1, ncols: int = 1, **kwargs: Any) -> tuple[Any, Any]:
    """``(fig, axes)`` like ``pyplot.subplots``, built with matplotlib's object API only.

    The figure belongs to no pyplot state: nothing else (a notebook's post-run hook, another
    thread's ``plt.close('all')``) can close or redraw it while it is being saved. Figure
    keywords (``figsize``...) go to :class:`~matplotlib.figure.Figure`, the rest to
    :meth:`~matplotlib.figure.Figure.subplots`. Marimo, Jupyter (:mod:`infer_lab.course.jupyter`
    saves it to PNG) and ``fig.savefig`` all show it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # defers matplotlib.figure
    from matplotlib.figure import Figure  # defers matplotlib.figure (+axes: ~140 ms over .ticker)

    fig = Figure(**{k: kwargs.pop(k) for k in list(kwargs) if k in FIGURE_KWARGS})
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def declutter_labels(fig: Any, max_tries: int = 12) -> int:
    """Move text labels that overlap an earlier label of the same axes up or down, in steps of
    their own height, until they overlap none (labels of points that crowd together stay
    legible). Returns how many labels moved; labels that overlap nothing are left alone."""
    from matplotlib.text import Annotation  # defers matplotlib.text (~45 ms over .ticker)

    renderer = fig.canvas.get_renderer()
    moved = 0
    for ax in fig.axes:
        placed: list[Any] = []
        for text in ax.texts:
            if not text.get_visible() or not text.get_text().strip():
                continue
            box = text.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                placed.append(box)
                continue
            step = box.height * 72 / fig.dpi + 1  # points
            for k in range(1, max_tries + 1):
                dy = step * ((k + 1) // 2) * (-1 if k % 2 else 1)
                trial = box.translated(0, dy * fig.dpi / 72)
                if not any(trial.overlaps(other) for other in placed):
                    if isinstance(text, Annotation) and text.anncoords in ("offset points", "offset pixels"):
                        x, y = text.xyann
                        text.xyann = (x, y + (dy if text.anncoords == "offset points" else dy * fig.dpi / 72))
                    else:
                        text.set_transform(offset_copy(text.get_transform(), fig=fig, y=dy, units="points"))
                    placed.append(trial)
                    moved += 1
                    break
            else:
                placed.append(box)
    return moved


def finish(fig: Any) -> Any:
    """Plain log labels, a tight layout, then overlapping labels moved apart; returns ``fig``."""
    plain_log_axes(fig)
    fig.tight_layout()
    declutter_labels(fig)
    return fig
