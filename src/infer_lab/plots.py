"""Figures for modules 00 and 01. Every title says which hardware and model produced it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt

from .units import GB


def _title(ax, what: str, source: str) -> None:
    ax.set_title(f"{what}\n{source}", fontsize=10)


def ceilings_bar(rows: Sequence[dict[str, Any]], source: str):
    """Measured vs datasheet ceilings (bandwidth, matmul) as ratio bars; rows from hardware.ceilings_vs_spec."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for ax, row in zip(axes, rows[:2], strict=False):
        labels = ["measured"] + (["datasheet"] if row["datasheet"] else [])
        values = [row["measured"]] + ([row["datasheet"]] if row["datasheet"] else [])
        bars = ax.bar(labels, values, color=["tab:blue", "tab:gray"][: len(values)])
        ax.bar_label(bars, fmt="%.3g")
        ax.set_ylabel(row["unit"])
        ax.set_title(row["what"], fontsize=10)
    fig.suptitle(f"Measured ceilings: {source}", fontsize=10)
    fig.tight_layout()
    return fig


def memory_growth(rows: Sequence[dict[str, Any]], source: str, budget_bytes: int | None = None,
                  budget_label: str = "device memory", max_context: int = 32768, users_context: int = 4096):
    """Weights + KV vs context (1 user) and vs users, in GB (1e9 B).

    Dots are measured (KV bytes from the cache tensors after a real prefill). The line extends
    the measured bytes per token linearly, and is labelled as such, to show where the budget runs out.
    """
    import numpy as np

    per_token = rows[0]["kv_bytes_per_token"]
    weights = rows[0]["weight_bytes"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    panels = ((axes[0], "context", max(max_context, max(r["context"] for r in rows)), 1,
               "context length (tokens), 1 user"),
              (axes[1], "users", 1024, users_context, f"concurrent users at {users_context} tokens each"))
    for ax, axis, x_max, tokens_per_x, xlabel in panels:
        x = np.geomspace(1, x_max, 200)
        ax.plot(x, (weights + per_token * tokens_per_x * x) / GB, color="tab:red",
                label=f"weights + KV (extrapolated from measured {per_token:,.0f} B/token)")
        ax.axhline(weights / GB, color="tab:gray", lw=1, label=f"weights ({weights / GB:.2f} GB)")
        sel = [r for r in rows if r["axis"] == axis]
        if axis == "context":
            ax.plot([r["context"] for r in sel], [(r["weight_bytes"] + r["kv_bytes"]) / GB for r in sel], "ko",
                    label="measured after a prefill")
        if budget_bytes:
            ax.axhline(budget_bytes / GB, color="k", ls="--", lw=1, label=f"{budget_label} ({budget_bytes / GB:.1f} GB)")
            limit = (budget_bytes - weights) / (per_token * tokens_per_x)
            if 1 <= limit <= x_max:
                ax.axvline(limit, color="k", ls=":", lw=1)
                ax.annotate(f"full at {limit:,.0f}", (limit, budget_bytes / GB), textcoords="offset points",
                            xytext=(-5, -14), ha="right", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel("GB (1e9 bytes), log scale")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Memory grows with tokens and users: {source}", fontsize=10)
    fig.tight_layout()
    return fig


def ttft_curve(rows: Sequence[dict[str, Any]], source: str, saved: Sequence[dict[str, Any]] | None = None,
               saved_label: str = ""):
    """TTFT (p50, with p90 as the bar top) vs prompt length; optional saved GPU curve."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    x = [r["prompt_len"] for r in rows]
    ax.plot(x, [r["ttft_ms_p50"] for r in rows], "o-", label="this machine (p50)")
    ax.fill_between(x, [r["ttft_ms_p50"] for r in rows], [r["ttft_ms_p90"] for r in rows], alpha=0.2,
                    label="p50-p90")
    if saved:
        ax.plot([r["ctx"] for r in saved], [r["ttft_ms"] for r in saved], "s--", label=saved_label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.legend(fontsize=8)
    _title(ax, "TTFT grows with context", source)
    fig.tight_layout()
    return fig


def serving_gantt(result: dict[str, Any], source: str):
    """Each request's wait, prefill and decode: sequential serving vs one batch."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharex=True)
    for ax, mode in zip(axes, ("sequential", "batched"), strict=True):
        reqs = [r for r in result["requests"] if r["mode"] == mode]
        for r in reqs:
            y = r["request"]
            ax.barh(y, r["start_s"], color="lightgray", label="waiting" if y == 0 else None)
            ax.barh(y, r["first_token_s"] - r["start_s"], left=r["start_s"], color="tab:orange",
                    label="prefill (TTFT)" if y == 0 else None)
            ax.barh(y, r["finish_s"] - r["first_token_s"], left=r["first_token_s"], color="tab:blue",
                    label="decode" if y == 0 else None)
        summary = next(s for s in result["summary"] if s["mode"] == mode)
        ax.set_title(f"{mode}: {summary['output_tokens_per_s']:.1f} tok/s", fontsize=10)
        ax.set_xlabel("seconds since all requests arrived")
        ax.set_ylabel("request")
        ax.set_yticks([r["request"] for r in reqs])
        ax.invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Naive serving is sequential ({result['n_requests']} requests, {result['prompt_len']} in / "
                 f"{result['new_tokens']} out): {source}", fontsize=10)
    fig.tight_layout()
    return fig


def itl_grid(rows: Sequence[dict[str, Any]], source: str):
    """Decode step time (p50) vs batch size, one line per context length."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ctx in sorted({r["context"] for r in rows}):
        sel = sorted((r for r in rows if r["context"] == ctx), key=lambda r: r["batch"])
        axes[0].plot([r["batch"] for r in sel], [r["itl_ms_p50"] for r in sel], "o-", label=f"context {ctx}")
        axes[1].plot([r["tokens_per_s_per_user"] for r in sel], [r["tokens_per_s_total"] for r in sel], "o-",
                     label=f"context {ctx}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("batch size (concurrent sequences)")
    axes[0].set_ylabel("decode step, p50 (ms)")
    axes[0].legend(fontsize=8)
    axes[1].set_xlabel("tokens/s per user")
    axes[1].set_ylabel("tokens/s total")
    axes[1].set_title("throughput vs per-user speed", fontsize=9)
    fig.suptitle(f"Inter-token latency vs context and batch: {source}", fontsize=10)
    fig.tight_layout()
    return fig
