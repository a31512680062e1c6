"""LEGACY, being moved into the chapter modules ch07-ch10; delete when empty.

Figures for the serving-engine notebooks (07-10): each takes the tidy rows of a demo and a title.

Every title names where the numbers came from (hardware and model, from ``lm.describe()``), so a
figure copied out of a notebook still says what produced it. Nothing here measures anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd


def _titled(ax: Any, what: str, source: str) -> None:
    ax.set_title(f"{what}\n{source}", fontsize=10)
    ax.grid(alpha=0.3)


def step_time_vs_position(rows: Sequence[dict[str, Any]], source: str):
    """Decode step time (ms) vs tokens in context, one line per KV mode (``no_cache_vs_kv_cache``)."""
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for mode, part in df[df.phase == "decode"].groupby("mode"):
        ax.plot(part.position, part.step_ms, marker=".", label=mode)
    ax.set(xlabel="position (tokens in context)", ylabel="ms per generated token")
    ax.legend()
    _titled(ax, "Time per token: no cache vs KV cache", source)
    fig.tight_layout()
    return fig


def flops_vs_position(rows: Sequence[dict[str, Any]], source: str):
    """Cumulative FLOPs of generation vs position, one line per KV mode (the O(N^2) vs O(N) picture)."""
    df = pd.DataFrame(rows).sort_values("position")
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for mode, part in df.groupby("mode"):
        ax.plot(part.position, part.flops.cumsum() / 1e12, marker=".", label=mode)
    ax.set(xlabel="position (tokens in context)", ylabel="cumulative TFLOP (2 x params x tokens)")
    ax.legend()
    _titled(ax, "Work done so far", source)
    fig.tight_layout()
    return fig


# (column, legend, colour) of each bar segment, in stacking order; a row set has some of them
_KV_SEGMENTS = (
    ("used_bytes", "holds a token's K/V", "tab:blue"),
    ("reserved_future_bytes", "reserved for future tokens", "tab:cyan"),
    ("internal_frag_bytes", "internal fragmentation", "tab:orange"),
    ("external_frag_bytes", "external fragmentation", "tab:red"),
    ("wasted_bytes", "reserved, empty", "tab:orange"),  # kv_memory_waste's end-of-life rows
)


def kv_waste_bars(rows: Sequence[dict[str, Any]], source: str):
    """One stacked horizontal bar per layout: what the KV bytes (GB = 1e9 B) are used for.

    Takes the rows of ``kv_waste_breakdown`` (used / reserved for future tokens / internal /
    external fragmentation, time-averaged over the run) or of ``kv_memory_waste`` (used /
    reserved-but-empty at the end of each request's life). Each segment is labelled with its share
    of the bar, and each bar with its wasted fraction.
    """
    df = pd.DataFrame(rows).reset_index(drop=True)
    segments = [seg for seg in _KV_SEGMENTS if seg[0] in df]
    totals = sum(df[col] for col, _, _ in segments) / 1e9
    timeline = "reserved_future_bytes" in df
    labels = []
    for r in df.itertuples():
        label = r.layout + (f" (block {int(r.block_size)})" if r.layout == "paged" else "")
        labels.append(
            label + (f"\n{r.steps} steps, {r.peak_running} at once (peak)" if timeline else "")
        )
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.8 * len(df)))
    left = pd.Series(0.0, index=df.index)
    for col, legend, colour in segments:
        width = df[col] / 1e9
        ax.barh(labels, width, left=left, label=legend, color=colour)
        for i in df.index:
            share = width[i] / totals[i] if totals[i] else 0.0
            if width[i] > 0.05 * totals.max():  # label only segments wide enough to hold it
                ax.text(
                    left[i] + width[i] / 2, i, f"{share:.0%}", ha="center", va="center", fontsize=8
                )
        left = left + width
    for i, r in enumerate(df.itertuples()):
        ax.text(totals[i], i, f" {r.wasted_fraction:.1%} wasted", va="center", fontsize=9)
    ax.invert_yaxis()  # first layout on top
    what = "mean over the run" if timeline else "at the end of each request's life"
    ax.set(xlabel=f"KV bytes reserved or blocked, {what} (GB)")
    ax.set_xlim(0, totals.max() * 1.35)
    ax.legend(loc="lower right", fontsize=8)
    _titled(ax, "KV memory: what the reserved bytes hold, per layout", source)
    fig.tight_layout()
    return fig


def batching_bars(rows: Sequence[dict[str, Any]], source: str):
    """Static vs continuous: throughput, idle slots, and TTFT/ITL p50/p90/p99 (``static_vs_continuous``)."""
    df = pd.DataFrame(rows).set_index("mode")
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.4))
    df.output_tokens_per_s.plot.bar(ax=axes[0], color=["tab:gray", "tab:blue"])
    axes[0].set(ylabel="output tokens/s", xlabel="")
    df.mean_idle_slots.plot.bar(ax=axes[1], color=["tab:gray", "tab:blue"])
    axes[1].set(ylabel="idle batch slots per step (mean)", xlabel="")
    for ax, key in ((axes[2], "ttft_ms"), (axes[3], "itl_ms")):
        df[[f"{key}_p50", f"{key}_p90", f"{key}_p99"]].plot.bar(ax=ax)
        ax.set(ylabel=key.replace("_ms", " (ms)"), xlabel="")
        ax.legend(["p50", "p90", "p99"], fontsize=8)
    for ax in axes:
        ax.tick_params(axis="x", rotation=0)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Static vs continuous batching\n{source}", fontsize=10)
    fig.tight_layout()
    return fig


def pareto_frontier(rows: Sequence[dict[str, Any]], source: str):
    """Total output tokens/s vs tokens/s per user, one point per concurrency (``concurrency_sweep``)."""
    df = pd.DataFrame(rows).sort_values("concurrency")
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(df.tokens_per_s_per_user, df.output_tokens_per_s, marker="o")
    for r in df.itertuples():
        ax.annotate(f" {r.concurrency}", (r.tokens_per_s_per_user, r.output_tokens_per_s))
    ax.set(xlabel="tokens/s per user (1 / mean ITL)", ylabel="total output tokens/s")
    _titled(ax, "Concurrency sweep (labels: concurrent requests)", source)
    fig.tight_layout()
    return fig


def predicted_vs_measured_steps(rows: Sequence[dict[str, Any]], source: str):
    """Predicted (roofline) and measured engine decode step time vs batch size, log-log."""
    df = pd.DataFrame(rows).sort_values("batch")
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(df.batch, df.predicted_ms, marker="*", label="predicted (roofline, measured ceilings)")
    ax.plot(df.batch, df.measured_ms, marker="x", label="measured (engine, p50 of decode steps)")
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences per decode step)")
    ax.set(ylabel="decode step time (ms)")
    ax.legend(fontsize=8)
    _titled(ax, "Decode step: predicted vs measured", source)
    fig.tight_layout()
    return fig


def decode_paths_bars(rows: Sequence[dict[str, Any]], source: str):
    """Tokens/s per user (1 / ITL p50) of each decode path, with the ITL in ms on each bar."""
    df = pd.DataFrame(list(rows))
    labels = [
        r.path + (" +fused" if r.fused else "") + (" +compile" if r.compiled else "")
        for r in df.itertuples()
    ]
    fig, ax = plt.subplots(figsize=(6, 0.5 * len(df) + 1.5))
    ax.barh(labels, df.tokens_per_s_per_user)
    for i, r in enumerate(df.itertuples()):
        ax.text(r.tokens_per_s_per_user, i, f" {r.itl_ms_p50:.1f} ms", va="center")
    ax.invert_yaxis()
    ax.set_xlabel("tokens/s per user (1 / ITL p50)")
    _titled(ax, f"Decode paths, batch {df.batch.iloc[0]}", source)
    fig.tight_layout()
    return fig
