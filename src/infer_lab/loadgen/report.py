"""Results of a load-generator run as a table, a JSON file and three plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TABLE_COLUMNS = (
    "point",
    "repeat",
    "completed",
    "failed",
    "request_throughput_per_s",
    "output_tokens_per_s",
    "goodput_per_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "server_ttft_ms_p50",
    "itl_ms_p50",
    "itl_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "e2e_ms_p50",
    "e2e_ms_p99",
)


def results_table(results: dict[str, Any], pooled: bool = False):
    """A pandas DataFrame of the per-repeat rows (or the pooled rows), main columns first."""
    import pandas as pd  # defers pandas

    df = pd.DataFrame(results["pooled" if pooled else "rows"])
    first = [c for c in TABLE_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def format_table(results: dict[str, Any]) -> str:
    """The pooled rows as a fixed-width text table (ms, per second)."""
    df = results_table(results, pooled=True)
    cols = [c for c in TABLE_COLUMNS if c in df.columns and c != "repeat"]
    return df[cols].to_string(index=False, float_format=lambda v: f"{v:.1f}")


def write_results(results: dict[str, Any], out_dir: str | Path, name: str = "loadgen") -> Path:
    """Write ``OUT/name.json`` (config, server, rows, pooled rows and every request) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return path


def _title(results: dict[str, Any]) -> str:
    """Workload, engine and model, plus the server's own description of its hardware when it gives one."""
    server = results.get("server", {})
    engine = server.get("engine") or server.get("version") or "server"
    cfg = results.get("config", {})
    where = f"\n{server['device']}" if server.get("device") else ""
    return f"{cfg.get('workload')} on {engine} ({cfg.get('client', {}).get('model')}){where}"


def plot_latency_vs_load(results: dict[str, Any]):
    """TTFT, TPOT, ITL and E2E p50/p90/p99 (ms) against load, one panel per metric."""

    rows = sorted(results["pooled"], key=lambda r: r["load"])
    from ..figures import subplots  # defers matplotlib (figures)

    fig, axes = subplots(1, 4, figsize=(15, 3.6))
    x = [r["load"] for r in rows]
    for ax, metric in zip(axes, ("ttft", "tpot", "itl", "e2e"), strict=True):
        for q, style in (("p50", "-o"), ("p90", "--s"), ("p99", ":^")):
            y = [r.get(f"{metric}_ms_{q}") for r in rows]
            ax.plot(x, [v if v is not None else float("nan") for v in y], style, label=q)
        ax.set_title(f"{metric.upper()} (ms)")
        ax.set_xlabel(_xlabel(rows))
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Latency percentiles vs load: " + _title(results))
    fig.tight_layout()
    return fig


def plot_throughput_vs_load(results: dict[str, Any]):
    """Output tokens/s and requests/s (and goodput when SLOs are set) against load."""

    rows = sorted(results["pooled"], key=lambda r: r["load"])
    x = [r["load"] for r in rows]
    from ..figures import subplots  # defers matplotlib (figures)

    fig, (a1, a2) = subplots(1, 2, figsize=(10, 3.6))
    a1.plot(x, [r["output_tokens_per_s"] or 0 for r in rows], "-o")
    a1.set_ylabel("output tokens/s")
    a2.plot(
        x, [r["request_throughput_per_s"] or 0 for r in rows], "-o", label="completed requests/s"
    )
    if any("goodput_per_s" in r for r in rows):
        a2.plot(x, [r.get("goodput_per_s") or 0 for r in rows], "--s", label="goodput (met SLOs)/s")
    a2.set_ylabel("requests/s")
    a2.legend()
    for ax in (a1, a2):
        ax.set_xlabel(_xlabel(rows))
        ax.grid(alpha=0.3)
    fig.suptitle("Throughput vs load: " + _title(results))
    fig.tight_layout()
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points not beaten on both axes (higher is better on both), sorted by the first axis."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(front)


def plot_pareto(results: dict[str, Any]):
    """Tokens/s per user (1000 / TPOT p50) against total output tokens/s, with the Pareto frontier."""

    rows = [
        r
        for r in results["pooled"]
        if r.get("tokens_per_s_per_user") and r.get("output_tokens_per_s")
    ]
    from ..figures import subplots  # defers matplotlib (figures)

    fig, ax = subplots(figsize=(5.5, 4))
    pts = [(r["output_tokens_per_s"], r["tokens_per_s_per_user"]) for r in rows]
    ax.scatter([p[0] for p in pts], [p[1] for p in pts])
    for r, p in zip(rows, pts, strict=True):
        ax.annotate(r["point"], p, fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = pareto_front(pts)
    if front:
        ax.plot(
            [p[0] for p in front],
            [p[1] for p in front],
            "--",
            color="gray",
            label="Pareto frontier",
        )
        ax.legend()
    ax.set_xlabel("total output tokens/s")
    ax.set_ylabel("tokens/s per user (1000 / TPOT p50)")
    ax.set_title("Speed per user vs total throughput\n" + _title(results), fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _xlabel(rows: list[dict[str, Any]]) -> str:
    return (
        "concurrency"
        if rows and rows[0].get("concurrency") is not None
        else "arrival rate (requests/s)"
    )


def save_plots(results: dict[str, Any], out_dir: str | Path, name: str = "loadgen") -> list[Path]:
    """Save the three plots as PNGs in ``out_dir`` and return their paths."""
    import matplotlib  # defers matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # defers matplotlib

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, fn in (
        ("latency", plot_latency_vs_load),
        ("throughput", plot_throughput_vs_load),
        ("pareto", plot_pareto),
    ):
        fig = fn(results)
        path = out / f"{name}_{suffix}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
