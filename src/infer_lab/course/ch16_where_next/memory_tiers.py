"""The tiers part: fetch a cached prefix's KV, or recompute it?"""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis import memory, roofline
from ...figures import finish, subplots
from ...units import human
from ..tables import Column, people_table
from .scenario import TIER_LINKS
from .shared import link_time_s, serving_gpus


@dataclass(frozen=True)
class TierRow:
    """Getting one prefix's KV back: recompute it (prefill) or fetch it over a link. Seconds."""

    context: int
    kv_bytes: int
    recompute_s: float
    fetch_s: dict[str, float]

    @property
    def best_fetch(self) -> tuple[str, float]:
        return min(self.fetch_s.items(), key=lambda kv: kv[1])


@dataclass(frozen=True)
class TiersResult:
    model: str
    roof: str  # the GPU group that would recompute
    n_gpus: int
    kv_dtype: str
    rows: list[TierRow]


def tiers(model: str, gpu: str, contexts: tuple[int, ...], kv_dtype: str = "bf16") -> TiersResult:
    """For each context: the prefill that recomputes a prefix's KV on the serving GPUs vs fetching it."""
    n = serving_gpus(model, gpu, max(contexts), kv_dtype)
    roof = roofline.gpu_roof(gpu, n_gpus=n)
    rows = []
    for c in contexts:
        kv = memory.kv_bytes(model, c, 1, kv_dtype)
        recompute = roofline.predict_prefill(model, roof, 1, c, kv_dtype=kv_dtype).time_s
        rows.append(TierRow(c, kv, recompute, {name: link_time_s(kv, link, n) for name, link in TIER_LINKS.items()}))
    return TiersResult(memory.as_shape(model).name, roof.name, n, kv_dtype, rows)


def tiers_text(result: TiersResult) -> str:
    short, long = result.rows[0], result.rows[-1]
    pcie = next(iter(TIER_LINKS))
    return (
        f"{result.model} served on {result.roof}: a {short.context:,}-token prefix holds {human(short.kv_bytes / 1e9, 3)} GB "
        f"of KV; recomputing it takes {human(short.recompute_s * 1e3, 3)} ms of prefill, fetching it from {pcie} "
        f"{human(short.fetch_s[pcie] * 1e3, 3)} ms. At {long.context:,} tokens: {long.recompute_s * 1e3:,.0f} ms against "
        f"{long.fetch_s[pcie] * 1e3:,.0f} ms, **{human(long.recompute_s / long.fetch_s[pcie], 2)}× faster to fetch**. Prefill "
        "grows faster than linearly with the prefix (attention is quadratic) while a copy grows linearly, so a "
        "cheaper, bigger tier pays more the longer the shared prefix: roofline bounds on both sides."
    )


def tiers_table(result: TiersResult):
    names = list(TIER_LINKS)
    flat = [{"context": r.context, "kv_bytes": r.kv_bytes, "recompute_ms": r.recompute_s * 1e3,
             **{n: r.fetch_s[n] * 1e3 for n in names}} for r in result.rows]
    cols = [Column("context", "prefix (tokens)", "int"), Column("kv_bytes", "KV", "bytes"),
            Column("recompute_ms", f"recompute on {result.roof} (ms)")]
    cols += [Column(n, f"fetch from {n} (ms)") for n in names]
    return people_table(flat, cols)


def tiers_figure(result: TiersResult):
    """Recompute (prefill) vs fetch over each link, against the prefix length, log-log."""
    fig, ax = subplots(figsize=(7, 4))
    xs = [r.context for r in result.rows]
    ax.loglog(xs, [r.recompute_s * 1e3 for r in result.rows], "o-", color="k", label=f"recompute: prefill on {result.roof}")
    for name in TIER_LINKS:
        ax.loglog(xs, [r.fetch_s[name] * 1e3 for r in result.rows], "s--", ms=4, label=f"fetch from {name}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="cached prefix (tokens), log scale", ylabel="ms to get its KV back, log scale")
    ax.set_title(f"Memory tiers: recompute a prefix or fetch its KV ({result.model}, KV in {result.kv_dtype})\n"
                 "analytic: roofline prefill vs catalog link bandwidths, no hardware", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig
