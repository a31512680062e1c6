"""Figures for module 05 (matplotlib; each title says what model and hardware produced it)."""

from __future__ import annotations

from typing import Any

from ..units import MB


def memory_quality(result: dict[str, Any], source: str):
    """Bars of exact weight MB per method, with perplexity (or top-1 agreement) on a second axis."""
    import matplotlib.pyplot as plt

    rows = [result["baseline"], *result["methods"]]
    names = [r["method"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar(names, [r["weight_bytes"] / MB for r in rows], color="#4c72b0")
    ax.set_ylabel("weight memory (MB = 1e6 B, exact)")
    key = "perplexity" if "perplexity" in rows[0] else "top1_agreement"
    twin = ax.twinx()
    twin.plot(names, [r[key] for r in rows], "o-", color="#dd8452")
    twin.set_ylabel(key.replace("_", " "), color="#dd8452")
    ax.set_title(f"Weight memory vs quality\n{source}", fontsize=9)
    fig.tight_layout()
    return fig


def layer_errors(layers: list[dict[str, Any]], method: str, source: str):
    """Relative reconstruction error of every quantized layer, in model order."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot([r["rel_fro"] for r in layers], ".", ms=4)
    ax.set_xlabel("linear layer (model order)")
    ax.set_ylabel("‖W − Ŵ‖ / ‖W‖")
    ax.set_title(f"Per-layer error, {method}\n{source}", fontsize=9)
    fig.tight_layout()
    return fig
