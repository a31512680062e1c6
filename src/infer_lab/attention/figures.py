"""Figures for module 06 (matplotlib; each title says where its numbers come from)."""

from __future__ import annotations

from typing import Any


def kv_per_token(rows: list[dict[str, Any]], title: str):
    """Horizontal bars of KV bytes per token (all layers, log scale) per model and variant."""
    import matplotlib.pyplot as plt

    labels = [f"{r['model']} · {r['variant']}" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(rows) + 1))
    ax.barh(labels, [r["kv_bytes_per_token"] for r in rows], color="#55a868")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("KV bytes per token, all layers (log)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def hbm_bytes(seq_lens: list[int], naive: list[int], tiled: list[int], title: str):
    """Naive vs tiled attention HBM traffic against sequence length (log-log)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.loglog(seq_lens, naive, "o-", label="naive (writes S and P)")
    ax.loglog(seq_lens, tiled, "s-", label="tiled / flash")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("HBM bytes per head")
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def scorecard_chart(rows: list[dict[str, Any]], title: str):
    """Two panels per variant: KV bytes per token (memory) and predicted decode tokens/s at max users."""
    import matplotlib.pyplot as plt

    names = [r["variant"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 0.35 * len(rows) + 1.5), sharey=True)
    left.barh(names, [r["kv_bytes_per_token"] for r in rows], color="#55a868")
    left.set_xscale("log")
    left.set_xlabel("KV bytes per token, all layers (log)")
    right.barh(names, [r["decode_tok_s_at_max_users"] for r in rows], color="#c44e52")
    right.set_xlabel("decode tok/s at max users (roofline)")
    left.invert_yaxis()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
