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


def prefix_match_granularity(rows: Sequence[dict[str, Any]], block_size: int, source: str):
    """Prompt tokens found in the cache vs tokens actually shared, per cache (a staircase for hash)."""
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for cache, part in df.groupby("cache"):
        ax.plot(
            part.shared_tokens, part.reused_tokens, marker="o", drawstyle="default", label=cache
        )
    top = df.shared_tokens.max()
    ax.plot([0, top], [0, top], ls=":", color="gray", label="everything shared is reused")
    for edge in range(block_size, top + 1, block_size):
        ax.axvline(edge, color="gray", lw=0.5, alpha=0.5)
    ax.set(
        xlabel="tokens the second prompt shares with the first",
        ylabel="prompt tokens reused from cache",
    )
    ax.legend(fontsize=8)
    _titled(ax, f"What each cache matches (block size {block_size}, grey lines)", source)
    fig.tight_layout()
    return fig


def prefix_cache_bars(rows: Sequence[dict[str, Any]], source: str):
    """Hit rate, prefill tokens computed and TTFT p50 per workload and cache (``prefix_cache_comparison``)."""
    df = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (col, label) in zip(
        axes,
        (
            ("hit_rate", "hit rate (tokens found / asked)"),
            ("prefill_tokens_computed", "prefill tokens computed"),
            ("ttft_ms_p50", "TTFT p50 (ms)"),
        ),
        strict=True,
    ):
        df.pivot(index="workload", columns="cache", values=col)[["none", "hash", "radix"]].plot.bar(
            ax=ax
        )
        ax.set(ylabel=label, xlabel="")
        ax.tick_params(axis="x", rotation=12)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Prefix caching on three workloads\n{source}", fontsize=10)
    fig.tight_layout()
    return fig


def chunked_prefill_steps(rows: Sequence[dict[str, Any]], source: str, arrive_at_step: int):
    """Step time (= ITL of the decoding requests) per engine step, with and without chunking."""
    df = pd.DataFrame(rows)
    steps = df[df.kind == "step"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for chunking, part in steps.groupby("chunking"):
        label = "chunked prefill" if chunking else "whole prompt in one step"
        ax.plot(part.step, part.step_ms, marker=".", label=label)
    ax.axvline(arrive_at_step, color="gray", ls=":", label="long prompt arrives")
    ax.set(xlabel="engine step", ylabel="step time = ITL of running requests (ms)")
    ax.legend(fontsize=8)
    _titled(ax, "A long prompt arrives while others decode", source)
    fig.tight_layout()
    return fig
