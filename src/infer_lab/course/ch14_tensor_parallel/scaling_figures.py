"""Part 2's figures (``scaling``): ITL per TP size, the layouts that do not fit drawn faint, and the speed vs throughput frontier."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...figures import finish
from ..parallel_figures import plot_frontier, plot_tp_scaling
from .scaling import ScalingResult

NOT_FITTING_ALPHA = 0.25  # how faint a bar of a layout that does not fit is drawn


def tp_scaling_title(s: ScalingResult) -> str:
    """The scaling figure's title: what it shows, and which TP sizes do not fit (their bars are faint and
    labelled: a reference for the speed-up, not a configuration that runs)."""
    title = f"analytic: {s.model}, {s.batch} users x {s.context:,} tokens: N GPUs are not N x faster"
    missing = sorted({r.tp for r in s.rows if not r.fits})
    if not missing:
        return title
    verb = "does" if len(missing) == 1 else "do"
    return title + (f"\nfaint: TP{', TP'.join(map(str, missing))} {verb} not fit (weights + KV), "
                    "the speed-up's reference")


def tp_scaling_figure(s: ScalingResult):
    """ITL per TP size and GPU (:func:`~infer_lab.course.parallel_figures.plot_tp_scaling`), with the bars
    of layouts that do not fit their memory drawn faint and labelled "does not fit"."""
    fig = plot_tp_scaling([vars(r) for r in s.rows], title=tp_scaling_title(s))
    ax = fig.axes[0]
    ax.title.set_fontsize(9)
    finish(fig)  # lay out again with the title's final size, so both of its lines stay inside the figure
    gpus = list(dict.fromkeys(r.gpu for r in s.rows))
    bars = [c for c in ax.containers if hasattr(c, "patches")]  # per GPU: compute bars, then all-reduce bars
    ideal = [line for line in ax.lines if line.get_linestyle() == "--"]  # the ideal 1/N lines
    for i, gpu in enumerate(gpus):
        rows = [r for r in s.rows if r.gpu == gpu]
        compute, allreduce = bars[2 * i], bars[2 * i + 1]
        for row, low, high in zip(rows, compute.patches, allreduce.patches, strict=True):
            if row.fits:
                continue
            for patch in (low, high):
                patch.set_alpha(NOT_FITTING_ALPHA)
            label = ax.text(low.get_x() + low.get_width() / 2, 0, "does not fit", rotation=90, ha="center",
                            va="center", fontsize=7, color="0.25")
            _place_clear_of_lines(ax, label, high.get_y() + high.get_height(), ideal)
    return fig


def _line_span(line: Any, x0: float, x1: float) -> tuple[float, float] | None:
    """The lowest and highest y of a polyline over x0..x1 (data units); ``None`` where it does not reach there."""
    xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    lo, hi = max(x0, xs.min()), min(x1, xs.max())
    if lo > hi:
        return None
    inside = ys[(xs >= lo) & (xs <= hi)]
    values = np.concatenate([np.interp([lo, hi], xs, ys), inside])
    return float(values.min()), float(values.max())


def _place_clear_of_lines(ax: Any, label: Any, top: float, lines: list[Any]) -> None:
    """Move the vertical ``label`` (centred on its bar) to a height where no line of ``lines`` crosses it:
    inside its bar (0 to ``top``, data units), nearest the bar's middle, if it fits there; else the lowest
    clear place above the bar."""
    renderer = ax.figure.canvas.get_renderer()
    box = label.get_window_extent(renderer).transformed(ax.transData.inverted())
    half, pad = box.height / 2, box.height * 0.05
    x0, x1 = box.x0, box.x1
    spans = [span for line in lines if (span := _line_span(line, x0, x1)) is not None]

    def clear(y: float) -> bool:
        return all(hi < y - half - pad or lo > y + half + pad for lo, hi in spans)

    inside = sorted(np.linspace(half + pad, top - half - pad, 60), key=lambda y: abs(y - top / 2)) \
        if top > 2 * (half + pad) else []
    above = np.linspace(top + half + pad, ax.get_ylim()[1] - half, 60)
    y = next((float(y) for y in (*inside, *above) if clear(y)), top + half + pad)
    label.set_y(y)


def frontier_figure(s: ScalingResult):
    return plot_frontier(s.frontier, s.fast, title=f"analytic: {s.model} on H100 SXM, {s.context:,}-token "
                                                   "context: speed vs throughput per GPU")


def scaling_figures(s: ScalingResult) -> dict[str, Any]:
    return {"tp_scaling": tp_scaling_figure(s), "frontier": frontier_figure(s)}
