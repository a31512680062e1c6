"""Part "variants" of the page: the same workload served by HF and by each variant of our engine, over HTTP."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...bench.served import server_counters
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import HF_VARIANT, NUMBER, OUR_VARIANTS, WORKLOAD, Sizes, sizes
from .shared import _LATENCY, ServedLoad, servable_model


@dataclass(frozen=True)
class VariantRun:
    """One variant of our engine (or the HF baseline) served over HTTP under the chapter's load."""

    variant: str
    engine: str  # "hf" or "ours"
    options: str  # the EngineConfig switches it sets, e.g. "prefix_cache=radix"
    served: ServedLoad
    prefix_hit_rate: float | None  # from the server's /metrics; None without a prefix cache
    kv_blocks_used_max: float | None  # peak KV blocks in use (server's high-water mark); None without paged KV
    server_version: str

    def row(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.served), "variant": self.variant, "options": self.options or "—",
                "prefix_hit_rate": self.prefix_hit_rate, "kv_blocks_used_max": self.kv_blocks_used_max}


@dataclass(frozen=True)
class VariantsResult:
    workload: str
    concurrency: int
    requests: int
    output_tokens: int
    repeats: int
    runs: list[VariantRun]
    note: str = ""  # why another model was served than the one loaded (see servable_model)

    def run(self, variant: str) -> VariantRun | None:
        return next((r for r in self.runs if r.variant == variant), None)


def variants_not_run_text(s: Sizes, full: Sizes | None = None) -> str:
    """Which rungs of :data:`OUR_VARIANTS` size ``s`` leaves out and ``full`` (default: the full
    size) runs (markdown; "" when ``s`` leaves none out)."""
    full = full or sizes("cpu", "full")
    added = [name for name in full.variants if name not in s.variants]
    if not added or s.size == full.size:
        return ""
    return (f"At {s.size} size {len(s.variants)} of the {len(OUR_VARIANTS)} rungs run; the {full.size} size "
            "adds " + ", ".join(f"**{name}**" for name in added) + ".")


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items())


def variants_result(runs: dict[str, dict[str, Any]], variants: dict[str, tuple[str, dict[str, Any]]],
                    concurrency: int, sizes: Sizes, note: str = "") -> VariantsResult:
    """What ``serve_variants`` of the notebook returned (loadgen's results per variant of ``variants``,
    name -> (engine, EngineConfig switches)), as typed rows; a variant's prefix hit rate and KV blocks
    only where it has a prefix cache and paged KV."""
    out = []
    for name, res in runs.items():
        engine, options = variants[name]
        ours = engine == "ours"
        paged = ours and options.get("kv_mode", "paged") == "paged"
        has_prefix = ours and options.get("prefix_cache", "none") != "none"
        counters = server_counters(res)
        out.append(VariantRun(name, engine, _options_text(options), ServedLoad.from_row(res["pooled"][0]),
                              counters["prefix_hit_rate"] if has_prefix else None,
                              counters["kv_blocks_used_max"] if paged else None,
                              str(res["server"].get("version", "unknown"))))
    return VariantsResult(WORKLOAD, concurrency, sizes.requests, sizes.output_tokens, sizes.repeats, out, note)


def run_variants(lm: Any, sizes: Sizes) -> VariantsResult:
    """Run the notebook's ``serve_variants`` on the chapter's variants (the embedded model instead
    when ``lm`` has no tokenizer: :func:`servable_model`)."""
    served, note = servable_model(lm)
    serve_variants = notebook_function(NUMBER, "serve_variants")
    variants = {name: OUR_VARIANTS[name] for name in sizes.variants}
    runs = serve_variants(served, variants, sizes.concurrency, sizes.requests, sizes.output_tokens,
                          sizes.workload_options(), sizes.repeats)
    return variants_result(runs, variants, sizes.concurrency, sizes, note)


def variants_text(v: VariantsResult) -> str:
    """The best variant against HF, and what the prefix cache changed; every number from ``v``."""
    rated = [r for r in v.runs if r.served.output_tokens_per_s]
    best = max(rated, key=lambda r: r.served.output_tokens_per_s)
    hf = v.run(HF_VARIANT)
    text = (f"Same workload ({v.workload}, {v.requests} requests of {v.output_tokens} output tokens) at "
            f"concurrency {v.concurrency} for every variant. Best here: **{best.variant}** at "
            f"{best.served.output_tokens_per_s:,.1f} output tokens/s")
    if hf and hf.served.output_tokens_per_s and best is not hf:
        text += f", {best.served.output_tokens_per_s / hf.served.output_tokens_per_s:.1f}× the HF baseline"
    text += "."
    if v.note:
        text = v.note + "\n\n" + text
    # the prefix cache's effect, against the rung just below it (only the cache differs)
    plain = v.run("+ prepacked weights") or v.run("ours: paged + continuous")
    cached = [r for r in v.runs if r.prefix_hit_rate]
    if plain and cached and plain.served.ttft_ms_p50:
        c = max(cached, key=lambda r: r.prefix_hit_rate or 0)
        text += (f" With **{c.variant}** the server found {c.prefix_hit_rate:.0%} of prompt tokens in its "
                 f"cache, and TTFT p50 went from {plain.served.ttft_ms_p50:,.0f} ms to "
                 f"{c.served.ttft_ms_p50:,.0f} ms.")
    return text


VARIANT_COLUMNS = [
    Column("variant", "variant", "text"), Column("options", "engine switches", "text"),
    Column("completed", "completed", "int"), Column("failed", "failed", "int"),
    Column("output_tokens_per_s", "output tokens/s"), Column("request_throughput_per_s", "requests/s"),
    *_LATENCY,
    Column("prefix_hit_rate", "prefix hit rate", "pct", missing="— (no prefix cache)"),
    Column("kv_blocks_used_max", "KV blocks used, peak", "int", missing="— (no paged KV)"),
]


def variants_table(v: VariantsResult):
    return people_table([r.row() for r in v.runs], VARIANT_COLUMNS)


def variants_figure(v: VariantsResult, source: str):
    """Output tokens/s and TTFT p50/p99 per variant, under the same load."""
    from ...figures import subplots  # defers matplotlib

    names = [r.variant for r in v.runs]
    y = np.arange(len(names))
    fig, (left, right) = subplots(1, 2, figsize=(12, 0.55 * len(names) + 1.8), sharey=True)
    left.barh(y, [r.served.output_tokens_per_s or 0 for r in v.runs], color="tab:blue")
    left.set(yticks=y, yticklabels=names, xlabel="output tokens/s", xlim=(0, None))
    for q, offset, colour in (("p50", -0.2, "tab:orange"), ("p99", 0.2, "tab:red")):
        right.barh(y + offset, [getattr(r.served, f"ttft_ms_{q}") or 0 for r in v.runs], 0.4, color=colour,
                   label=f"TTFT {q}")
    right.set(xlabel="time to first token (ms)", xlim=(0, None))
    right.legend(fontsize=8)
    left.invert_yaxis()
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"{v.workload}, {v.requests} requests at concurrency {v.concurrency}, through HTTP\n{source}",
                 fontsize=10)
    fig.tight_layout()
    return fig
