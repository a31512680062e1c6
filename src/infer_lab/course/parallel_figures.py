"""Figures for the scaling model and the cluster simulator (matplotlib, no styling framework).

Each function takes the rows the model already computed and returns a Figure; none computes a
number itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..figures import finish, subplots


def plot_tp_scaling(rows: list[dict[str, Any]], title: str = ""):
    """ITL vs TP size per GPU type (rows of :func:`~infer_lab.analysis.parallel.scaling_table`),
    with the all-reduce share stacked on top and the ideal 1/N line dashed."""
    fig, ax = subplots(figsize=(7, 4))
    gpus = list(dict.fromkeys(r["gpu"] for r in rows))
    width = 0.8 / len(gpus)
    for i, gpu in enumerate(gpus):
        mine = [r for r in rows if r["gpu"] == gpu]
        xs = [j + i * width for j in range(len(mine))]
        ax.bar(xs, [r["compute_ms"] for r in mine], width, label=f"{gpu}: compute + memory")
        ax.bar(
            xs,
            [r["allreduce_ms"] for r in mine],
            width,
            bottom=[r["compute_ms"] for r in mine],
            hatch="//",
            alpha=0.6,
            label=f"{gpu}: all-reduces",
        )
        ideal = [mine[0]["itl_ms"] / r["tp"] for r in mine]
        ax.plot(xs, ideal, "k--", lw=1, label="ideal 1/N" if i == 0 else None)
    first = [r for r in rows if r["gpu"] == gpus[0]]
    ax.set_xticks([j + width * (len(gpus) - 1) / 2 for j in range(len(first))])
    ax.set_xticklabels([f"TP{r['tp']}" for r in first])
    ax.set_ylabel("predicted ITL (ms)")
    tallest = max(r["compute_ms"] + r["allreduce_ms"] for r in rows)
    ax.set_ylim(0, tallest * 1.4)  # headroom: the legend sits above the bars, no bar runs into the frame
    ax.set_title(title or f"batch {first[0]['batch']} x {first[0]['context']} tokens: N GPUs are not N x faster")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    finish(fig)
    return fig


def plot_frontier(points: list[Any], fast: Any = None, title: str = ""):
    """Per-user tokens/s (x) vs tokens/s per GPU (y) for every (TP, batch) point, the Pareto
    frontier as a line, and a fast-mode pair (:func:`~infer_lab.analysis.parallel.fast_mode`)."""
    fig, ax = subplots(figsize=(8.2, 4.5))
    for tp in sorted({p.tp for p in points}):
        mine = [p for p in points if p.tp == tp]
        ax.plot(
            [p.tokens_per_s_per_user for p in mine],
            [p.tokens_per_s_per_gpu for p in mine],
            "o-",
            ms=4,
            lw=0.8,
            label=f"TP{tp}",
        )
    front = sorted((p for p in points if p.on_frontier), key=lambda p: p.tokens_per_s_per_user)
    ax.plot(
        [p.tokens_per_s_per_user for p in front],
        [p.tokens_per_s_per_gpu for p in front],
        "k-",
        lw=2,
        alpha=0.4,
        label="Pareto frontier",
    )
    if fast is not None:
        for p, name in ((fast.baseline, "default"), (fast.fast, "fast mode")):
            ax.annotate(
                f"{name}: {p.layout}, batch {p.batch}",
                (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu),
                textcoords="offset points",
                xytext=(8, 8),
                fontsize=8,
                arrowprops={"arrowstyle": "->"},
            )
    ax.set_xlabel("tokens/s per user (speed)")
    ax.set_ylabel("tokens/s per GPU (throughput)")
    ax.set_yscale("log")
    ys = [p.tokens_per_s_per_gpu for p in points if p.tokens_per_s_per_gpu and p.tokens_per_s_per_gpu > 0]
    if ys:  # headroom on the log axis: the labels above the top points stay clear of the title
        ax.set_ylim(min(ys) / 1.5, max(ys) * 2.5)
    ax.set_title(title or "speed vs throughput: more GPUs per user buy speed at a higher cost per token", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: no label runs into it
    finish(fig)
    return fig


def plot_itl_cdf(results: dict[str, Any], title: str = ""):
    """The distribution of every inter-token gap of simulated runs (``{label: SimResult}``),
    as a CDF on a log time axis: prefill interference shows up as the tail."""
    fig, ax = subplots(figsize=(7, 4))
    for label, res in results.items():
        gaps = np.sort([g * 1e3 for r in res.requests for g in r.itl_s])
        if gaps.size == 0:
            continue
        ax.plot(gaps, np.arange(1, gaps.size + 1) / gaps.size, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("share of gaps at or below")
    ax.axhline(0.99, color="gray", lw=0.6, ls=":")
    ax.set_title(title or "ITL distribution: colocated vs disaggregated")
    ax.legend(fontsize=8)
    finish(fig)
    return fig
