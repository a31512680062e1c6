"""Figures for modules 02-04. Each takes numbers from the analysis functions and says in its title
what model and hardware produced them. They return matplotlib figures (marimo and Jupyter render them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..units import GB
from .memory import ModelLike, as_shape, kv_bytes, weight_bytes
from .roofline import OpCost, Roof, StepPrediction


def kv_growth_figure(
    model: ModelLike,
    max_tokens: int = 32768,
    users: Sequence[int] = (1, 8, 32, 80),
    kv_dtype: str = "bf16",
    gpu_memory_bytes: int | None = None,
    weight_dtype: str = "bf16",
):
    """KV bytes (GB = 1e9 B) vs tokens per user, one line per user count; weights and GPU size as lines."""
    import matplotlib.pyplot as plt

    shape = as_shape(model)
    tokens = np.unique(np.linspace(1, max_tokens, 64).astype(int))
    fig, ax = plt.subplots(figsize=(7, 4))
    for u in users:
        ax.plot(
            tokens,
            [kv_bytes(shape, int(t), u, kv_dtype) / GB for t in tokens],
            label=f"KV, {u} users",
        )
    w = weight_bytes(shape, weight_dtype).total / GB
    ax.axhline(w, color="k", ls="--", lw=1, label=f"weights ({weight_dtype}) {w:.1f} GB")
    if gpu_memory_bytes:
        ax.axhline(
            gpu_memory_bytes / GB,
            color="r",
            ls=":",
            lw=1,
            label=f"GPU memory {gpu_memory_bytes / GB:.0f} GB",
        )
    ax.set_xlabel("tokens per user (context)")
    ax.set_ylabel("GB (1e9 B)")
    ax.set_title(
        f"KV cache of {shape.name} ({shape.attention_kind}, KV in {kv_dtype}): analytic, no hardware"
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def tradeoff_figure(rows: list[dict[str, Any]], title: str):
    """Max users vs context (rows from :func:`context_users_tradeoff`)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["context"] for r in rows], [r["max_users"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog")
    ax.set_xlabel("context per user (tokens)")
    ax.set_ylabel("max concurrent users")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    return fig


def roofline_figure(
    roof: Roof,
    steps: Sequence[StepPrediction] = (),
    ops: dict[str, Sequence[OpCost]] | None = None,
    measured: Sequence[dict[str, Any]] = (),
    title: str = "",
):
    """The roof of a device, with whole steps (big markers), per-op points and measured points.

    ``measured`` rows need ``intensity``, ``flops``, ``measured`` (ms) and ``phase``: they sit at
    the predicted intensity and the FLOP/s actually achieved (predicted FLOPs / measured time).
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [s.intensity for s in steps] + [
        o.intensity for group in (ops or {}).values() for o in group if o.flops
    ]
    xs += [r["intensity"] for r in measured]
    lo = max(min(xs + [roof.ridge_point]) / 4, 1e-2)
    hi = max(xs + [roof.ridge_point]) * 4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.loglog(
        grid,
        [roof.attainable_flops(x) for x in grid],
        "k-",
        lw=2,
        label=f"roof: {roof.name}" + ("" if roof.source in roof.name else f" ({roof.source})"),
    )
    ax.axvline(roof.ridge_point, color="grey", ls=":", lw=1)
    ax.annotate(
        f"ridge {roof.ridge_point:.0f} FLOP/B",
        (roof.ridge_point, roof.peak_flops),
        fontsize=8,
        xytext=(5, -15),
        textcoords="offset points",
    )
    colors = {"prefill": "tab:orange", "decode": "tab:blue"}
    for name, group in (ops or {}).items():
        phase = "prefill" if "prefill" in name else "decode"
        for o in group:
            if o.flops:
                t = roof.time_s(o.flops, o.bytes)
                ax.scatter(o.intensity, o.flops / t, s=14, color=colors[phase], alpha=0.5)
                ax.annotate(o.name.split(" ")[0], (o.intensity, o.flops / t), fontsize=6, alpha=0.7)
    for s in steps:
        ax.scatter(
            s.intensity,
            s.flops / s.time_s,
            s=90,
            marker="*",
            color=colors.get(s.phase, "k"),
            label=f"{s.phase} step, batch {s.batch}, {s.tokens} tok (predicted)",
        )
    for r in measured:
        ax.scatter(
            r["intensity"],
            r["flops"] / (r["measured"] / 1e3),
            s=40,
            marker="x",
            color=colors.get(r.get("phase"), "k"),
        )
    if measured:
        ax.scatter([], [], marker="x", color="k", label="measured (harness): achieved FLOP/s")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title or f"Roofline: {roof.name}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    return fig


def predicted_vs_measured_figure(rows: list[dict[str, Any]], title: str):
    """Measured/predicted ratio per timed row (1.0 = the roofline is reached)."""
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r["unit"] == "ms"]
    labels = [f"{r['phase']} b{r['batch']} n{r['context']}" for r in timed]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(
        labels,
        [r["measured_over_predicted"] for r in timed],
        color=["tab:orange" if r["phase"] == "prefill" else "tab:blue" for r in timed],
    )
    ax.axhline(1, color="k", lw=1)
    ax.set_ylabel("measured / predicted time")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", rotation=45, labelsize=7)
    ax.grid(alpha=0.3, axis="y")
    return fig


def cost_figure(plan_rows: list[dict[str, Any]], title: str):
    """$/hour vs $ per million output tokens, one point per GPU configuration that fits."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in plan_rows:
        if r.get("usd_per_m_output_tokens") is None:
            continue
        ax.scatter(
            r["usd_per_hour"],
            r["usd_per_m_output_tokens"],
            color="tab:green" if r["meets_slo"] else "tab:red",
        )
        ax.annotate(
            f"{r['n_gpus']}x {r['gpu']}",
            (r["usd_per_hour"], r["usd_per_m_output_tokens"]),
            fontsize=7,
        )
    ax.set_xlabel("$ per hour (all GPUs of the configuration)")
    ax.set_ylabel("$ per million output tokens")
    ax.set_yscale("log")
    ax.set_title(title + "\ngreen: meets the SLOs, red: misses", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    return fig
