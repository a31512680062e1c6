"""Chapter 13, "Engines": one load generator against every engine, and the decision chart.

1. The same workload (same prompts, same seed, same concurrency, warm-up) served over HTTP by
   the HF baseline and by our engine with one optimization switched on at a time, measured by
   :mod:`infer_lab.loadgen` (TTFT, ITL, TPOT, E2E percentiles, throughput).
2. A concurrency sweep of one variant: latency against load, and the Pareto frontier of total
   tokens/s against tokens/s per user.

Beside the measurements, analytic material that needs no button: the engine decision chart,
the launch lines for vLLM and SGLang, and the capacity planner's answer to "how many GPUs".
The servers and the launchers live in :mod:`infer_lab.server` and :mod:`infer_lab.launchers`, the
load generator in :mod:`infer_lab.loadgen`, and serving one configuration under load in
:func:`infer_lab.bench.served.serve_and_load`. The experiments are ``@app.function``s of
``infer_lab/notebooks/13_engines.py`` (``serve_variants``, ``concurrency_sweep``); ``run_variants`` and
``run_sweep`` here execute those same functions (:func:`~infer_lab.course.notebook_code.notebook_function`),
and the rest of this module holds the chapter's sizes and shapes results for people.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import launchers
from ..bench.served import server_counters
from ..units import count
from .chapter import NO_MODEL, ChapterResult, choose_size, run_parts
from .notebook_code import notebook_function
from .saved import SavedView
from .tables import Column, people_table

NUMBER = "13"
SLUG = "engines"
TITLE = "13 · Engines: one load generator, every engine, and the decision chart"
NEEDS_MODEL = True
PARTS = {
    "variants": "Serve and measure every variant",
    "sweep": "Sweep concurrency on our engine",
}
WORKLOAD = "shared-prefix"
HF_VARIANT = "hf (one at a time)"


@dataclass(frozen=True)
class Sizes:
    """The load: which variants, how many requests at what concurrency, and their lengths."""

    size: str
    variants: tuple[str, ...]  # keys of OUR_VARIANTS
    concurrency: int  # requests in flight, the same for every variant
    requests: int  # measured requests per variant and repeat
    output_tokens: int  # tokens generated per request (EOS ignored)
    repeats: int
    prefix_words: int  # words of the shared system prompt
    input_words: int  # words of each request's own question
    sweep_variant: str
    sweep_concurrencies: tuple[int, ...]
    slo_ttft_ms: float  # the TTFT objective of the sweep's goodput (ms)
    max_model_len: int = 512

    def workload_options(self) -> dict[str, int]:
        """The shared-prefix workload's shape (words; see :func:`infer_lab.loadgen.build_workload`)."""
        return {**WORKLOAD_DEFAULTS, "prefix_words": self.prefix_words, "input_words": self.input_words}


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: 4 short requests per variant, 3 variants (seconds each on 2 cores); ``full``: every
    variant, 32 requests at concurrency 16, 2 repeats."""
    size = choose_size(device, size)
    if size == "quick":
        return Sizes(size, variants=(HF_VARIANT, "+ prepacked weights", "+ prefix cache (radix)"),
                     concurrency=4, requests=4, output_tokens=4, repeats=1, prefix_words=32, input_words=8,
                     sweep_variant="+ prefix cache (radix)", sweep_concurrencies=(1, 4), slo_ttft_ms=2000.0)
    return Sizes(size, variants=tuple(OUR_VARIANTS), concurrency=16, requests=32, output_tokens=64,
                 repeats=2, prefix_words=128, input_words=32, sweep_variant="+ prefix cache (radix)",
                 sweep_concurrencies=(1, 4, 16, 32), slo_ttft_ms=2000.0)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class ServedLoad:
    """What the clients measured at one load level (pooled over repeats): ms, and rates per second.

    The field names are :mod:`infer_lab.loadgen`'s, so a list of these is a loadgen ``pooled``
    table (see :func:`as_loadgen_results`).
    """

    point: str
    load: float
    concurrency: int
    completed: int
    failed: int
    output_tokens_per_s: float | None
    request_throughput_per_s: float | None
    tokens_per_s_per_user: float | None  # 1000 / TPOT p50
    goodput_per_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p90: float | None
    itl_ms_p99: float | None
    tpot_ms_p50: float | None
    tpot_ms_p90: float | None
    tpot_ms_p99: float | None
    e2e_ms_p50: float | None
    e2e_ms_p90: float | None
    e2e_ms_p99: float | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ServedLoad:
        return cls(**{f.name: row.get(f.name) for f in dataclasses.fields(cls)})


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


@dataclass(frozen=True)
class SweepResult:
    variant: str
    workload: str
    model: str  # the served model's id
    server_version: str
    slo_ttft_ms: float
    points: list[ServedLoad]
    note: str = ""  # why another model was served than the one loaded (see servable_model)


@dataclass
class Result(ChapterResult):
    """Chapter 13's measurements; a part not run is ``None``."""

    model: str = ""
    variants: VariantsResult | None = None
    sweep: SweepResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# Measurements


_EMBEDDED: dict[str, Any] = {}  # the fallback model, loaded once per device


def servable_model(lm: Any) -> tuple[Any, str]:
    """The model to serve and, when it is not ``lm``, a sentence saying why.

    The server speaks text (chat and completions with a tokenizer). A model without one (random
    weights of a vocabulary no tokenizer here matches, which is a GPU's default) is replaced by
    the embedded SmolLM2-135M on the same device: the engines are compared on the same workload,
    and the absolute numbers are the small model's.
    """
    if lm.tokenizer is not None:
        return lm, ""
    from ..models import EMBEDDED_NAME, load_model

    key = str(lm.device)
    if key not in _EMBEDDED:
        _EMBEDDED[key] = load_model(EMBEDDED_NAME, device=lm.device)
    served = _EMBEDDED[key]
    return served, (f"**Served instead of {lm.name}:** {served.describe()}. {lm.name} has random weights and no "
                    "tokenizer, and the server takes text, so this part serves the embedded model: the variants "
                    "are compared on the same workload, and the absolute numbers are the small model's. Pick a "
                    "pretrained model to serve it instead.")


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


def sweep_result(results: dict[str, Any], variant: str, model: str, sizes: Sizes, note: str = "") -> SweepResult:
    """What ``concurrency_sweep`` returned (loadgen's results dict), one point per concurrency."""
    points = sorted((ServedLoad.from_row(r) for r in results["pooled"]), key=lambda p: p.load)
    return SweepResult(variant, WORKLOAD, model, str(results["server"].get("version", "unknown")),
                       sizes.slo_ttft_ms, points, note)


def run_sweep(lm: Any, sizes: Sizes) -> SweepResult:
    """Run the notebook's ``concurrency_sweep`` on the chapter's sweep variant (the embedded model
    instead when ``lm`` has no tokenizer: :func:`servable_model`)."""
    served, note = servable_model(lm)
    sweep = notebook_function(NUMBER, "concurrency_sweep")
    results = sweep(served, OUR_VARIANTS[sizes.sweep_variant], sizes.sweep_concurrencies, sizes.requests,
                    sizes.output_tokens, sizes.workload_options(), sizes.slo_ttft_ms, sizes.repeats)
    return sweep_result(results, sizes.sweep_variant, served.name, sizes, note)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "variants": lambda: run_variants(lm, sizes),
        "sweep": lambda: run_sweep(lm, sizes),
    })


# ---------------------------------------------------------------------------------------------
# What others reported, said as it was measured


@dataclass(frozen=True)
class ReportedRun:
    """A throughput reported elsewhere (not measured here), with the load it was measured at."""

    config: str
    output_tokens_per_s: float
    requests_in_flight: int


WORKSHOP_SETUP = "an H100 serving Mistral-7B"
WORKSHOP_RUNS = (
    ReportedRun("HF transformers baseline", 51, 1),
    ReportedRun("vLLM default (paged KV, continuous batching)", 736, 10),
)


def workshop_text() -> str:
    """The workshop's vLLM-vs-HF figure, with the load each side had (numbers from WORKSHOP_RUNS)."""
    hf, vllm = WORKSHOP_RUNS
    return (
        f"The workshop this course grew from reported, on {WORKSHOP_SETUP}, {vllm.output_tokens_per_s:,.0f} "
        f"output tokens/s for vLLM against {hf.output_tokens_per_s:,.0f} for HF transformers: "
        f"{vllm.output_tokens_per_s / hf.output_tokens_per_s:.0f}×. That ratio is not engine against engine: "
        f"HF had **{hf.requests_in_flight} request** in flight and vLLM **{vllm.requests_in_flight}**, so much "
        "of it is batching, which any engine with continuous batching gets. Here every variant gets the same "
        "workload at the same concurrency; the HF variant still serves one request at a time, because that "
        "is what a plain `generate` loop behind an API does."
    )


# ---------------------------------------------------------------------------------------------
# Words, tables and figures


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


def sweep_text(s: SweepResult) -> str:
    note = s.note + "\n\n" if s.note else ""
    return note + _sweep_words(s)


def _sweep_words(s: SweepResult) -> str:
    a, b = s.points[0], s.points[-1]
    if not (a.output_tokens_per_s and b.output_tokens_per_s and a.tokens_per_s_per_user and b.tokens_per_s_per_user):
        return f"{s.variant}: some load levels completed no request, see the table."
    return (f"**{s.variant}** from concurrency {a.concurrency} to {b.concurrency}: total output tokens/s went "
            f"from {a.output_tokens_per_s:,.1f} to {b.output_tokens_per_s:,.1f} "
            f"({b.output_tokens_per_s / a.output_tokens_per_s:.1f}×), while each user's tokens/s went from "
            f"{a.tokens_per_s_per_user:,.1f} to {b.tokens_per_s_per_user:,.1f}.")


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}.", workshop_text()]
    if result.variants:
        lines.append(variants_text(result.variants))
    if result.sweep:
        lines.append(sweep_text(result.sweep))
    lines.append(scale_out_text(scale_out_plan()))
    if saved() is None:  # where the engines are compared, say that vLLM and SGLang were not measured
        lines.append(gpu_note())
    return "\n\n".join(lines)


_LATENCY = [
    Column("ttft_ms_p50", "TTFT p50 (ms)"), Column("ttft_ms_p99", "TTFT p99 (ms)"),
    Column("itl_ms_p50", "ITL p50 (ms)"), Column("itl_ms_p99", "ITL p99 (ms)"),
    Column("tpot_ms_p50", "TPOT p50 (ms)"), Column("e2e_ms_p50", "E2E p50 (ms)"),
]
VARIANT_COLUMNS = [
    Column("variant", "variant", "text"), Column("options", "engine switches", "text"),
    Column("completed", "completed", "int"), Column("failed", "failed", "int"),
    Column("output_tokens_per_s", "output tokens/s"), Column("request_throughput_per_s", "requests/s"),
    *_LATENCY,
    Column("prefix_hit_rate", "prefix hit rate", "pct", missing="— (no prefix cache)"),
    Column("kv_blocks_used_max", "KV blocks used, peak", "int", missing="— (no paged KV)"),
]
SWEEP_COLUMNS = [
    Column("concurrency", "concurrency", "int"), Column("completed", "completed", "int"),
    Column("failed", "failed", "int"), Column("output_tokens_per_s", "output tokens/s"),
    Column("tokens_per_s_per_user", "tokens/s per user"),
    Column("goodput_per_s", "goodput (requests/s within the SLO)"), *_LATENCY,
]
SCALE_OUT_COLUMNS = [
    Column("n_gpus", "GPUs", "int"), Column("fits", "weights fit", "bool"),
    Column("max_users_memory", "users by memory", "int"),
    Column("max_users_within_slo", "users within the ITL SLO", "int"),
    Column("itl_ms", "ITL (ms)", missing="— (does not fit)"),
    Column("tokens_per_s", "output tokens/s", missing="— (does not fit)"),
    Column("meets_slo", "meets the SLO", "bool"),
]


def variants_table(v: VariantsResult):
    return people_table([r.row() for r in v.runs], VARIANT_COLUMNS)


def sweep_table(s: SweepResult):
    return people_table(s.points, SWEEP_COLUMNS)


def decision_table(v: VariantsResult | None = None):
    """The engine decision chart; with ``v``, the numbers this machine measured for the rows they support."""
    measured = None
    if v:
        measured = [{"variant": r.variant, "output_tokens_per_s": r.served.output_tokens_per_s or 0.0,
                     "ttft_ms_p50": r.served.ttft_ms_p50 or 0.0, "prefix_hit_rate": r.prefix_hit_rate}
                    for r in v.runs]
    return decision_chart_frame(measured)


# The capacity planner's question of the scale-out section (inputs, not results).
SCALE_OUT = {"model": "llama-3-70b", "gpu": "H100-SXM", "context": 8192, "itl_slo_ms": 50.0, "min_users": 16}


def scale_out_plan() -> dict[str, Any]:
    """:func:`infer_lab.launchers.scale_out` for :data:`SCALE_OUT` (analytic: roofline bounds)."""
    return launchers.scale_out(**SCALE_OUT)


def scale_out_text(plan: dict[str, Any]) -> str:
    q = SCALE_OUT
    most = max(r["n_gpus"] for r in plan["plans"])
    answer = f"{plan['chosen']} GPUs" if plan["chosen"] else f"more than {most} GPUs"
    return (f"The capacity planner (chapter 05) for {q['model']} at {q['context']:,} tokens of context, "
            f"{q['min_users']} users within a {q['itl_slo_ms']:g} ms ITL on {q['gpu']} (roofline bounds): "
            f"**{answer}** of tensor parallelism. Launch a distributed engine for that and measure it with the "
            "same loadgen; our engine stays on one device on purpose.")


def scale_out_table(plan: dict[str, Any]):
    return people_table(plan["plans"], SCALE_OUT_COLUMNS)


def scale_out_commands(plan: dict[str, Any]) -> str:
    """The vLLM and SGLang launch lines for the planned number of GPUs (a markdown code block)."""
    return "\n".join(["```bash", " ".join(plan["vllm"]), " ".join(plan["sglang"]), "```"])


def decision_figure():
    """The decision chart as a flowchart-style figure (analytic: no measurement in it)."""
    return plot_decision_chart()


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.variants:
        out["Every variant under the same load"] = variants_table(result.variants)
    if result.sweep:
        out[f"Concurrency sweep of {result.sweep.variant}"] = sweep_table(result.sweep)
    out["The engine decision chart"] = decision_table(result.variants)
    out["When one GPU is not enough (analytic)"] = scale_out_table(scale_out_plan())
    return out


def variants_figure(v: VariantsResult, source: str):
    """Output tokens/s and TTFT p50/p99 per variant, under the same load."""
    import numpy as np

    from ..figures import subplots

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


def as_loadgen_results(s: SweepResult, source: str) -> dict[str, Any]:
    """The sweep as a loadgen results dict, for :mod:`infer_lab.loadgen.report`'s plots."""
    return {"pooled": [dataclasses.asdict(p) for p in s.points],
            "config": {"workload": s.workload, "client": {"model": s.model}},
            "server": {"engine": f"ours, {s.variant}", "device": source}}


def sweep_figures(s: SweepResult, source: str) -> dict[str, Any]:
    """Latency percentiles, throughput and the Pareto frontier against concurrency (loadgen's plots)."""
    from ..loadgen import report

    results = as_loadgen_results(s, source)
    figs = {"sweep_latency": report.plot_latency_vs_load(results),
            "sweep_throughput": report.plot_throughput_vs_load(results),
            "sweep_pareto": report.plot_pareto(results)}
    for fig in figs.values():  # latencies and rates start at zero, so their ratios read true
        for ax in fig.axes:
            ax.set_ylim(bottom=0)
    figs["sweep_pareto"].axes[0].set_xlim(left=0)
    return figs


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.variants:
        out["variants"] = variants_figure(result.variants, result.model)
    if result.sweep:
        out.update(sweep_figures(result.sweep, result.model))
    out["decision_chart"] = decision_figure()
    return out


# ---------------------------------------------------------------------------------------------
# vLLM and SGLang, and saved GPU results

GPU_MODEL = "mistralai/Mistral-7B-Instruct-v0.3"


def gpu_commands(model: str = GPU_MODEL) -> list[str]:
    """The commands that measure vLLM and SGLang with the same loadgen, one engine at a time."""
    launches = [f"infer-lab engines launch {e} --model {model} --prefix-caching on" for e in launchers.ENGINES]
    return launches + [
        f"infer-lab loadgen --url http://127.0.0.1:8000 --model {model} --workload agentic "
        "--concurrency 1,4,16,64 --repeats 3 --out results/vllm",
        "infer-lab engines stop",
    ]


def engines_text(model: str = GPU_MODEL) -> str:
    """Which engines this machine has, and how to measure them on a GPU box (markdown)."""
    installed = launchers.which_engines()
    status = ", ".join(f"{e}: {'installed ' + str(d['version']) if d['installed'] else 'not installed'}"
                       for e, d in installed.items())
    launch = " ".join(launchers.build_command("vllm", launchers.EngineOptions(model=model), python="python"))
    return "\n".join([
        f"Here, in this Python: {status} (vLLM's CPU build, above, runs from a virtual environment of its "
        "own). On a GPU box with them installed, start each one (one at a time on the same port) "
        "and run the same loadgen:", "", "```bash", *gpu_commands(model), "```", "",
        f"`launch` runs, for vLLM, `{launch}`, waits for `/health`, and records the version and the PID.",
    ])


def saved() -> SavedView | None:
    """No vLLM/SGLang run is saved yet: ``None`` (see :func:`gpu_note`)."""
    return None


def gpu_note() -> str:
    """What is missing without a saved GPU run (markdown)."""
    return ("**No saved vLLM or SGLang results exist in `src/infer_lab/results/` yet**, so nothing measured is shown "
            "for them here: run the commands above on a GPU and save the loadgen JSON as "
            "`src/infer_lab/results/<gpu>-engines-<date>.json`.")


# ---------------------------------------------------------------------------------------------
# Course material: our variants side by side through HTTP, the sweep, the decision chart

# Each optimization of our engine switched on one at a time (options of infer_lab.engine.EngineConfig).
OUR_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "hf (one at a time)": ("hf", {}),
    "ours: contiguous KV, static batch": (
        "ours", {"kv_mode": "contiguous", "policy": "static", "prepack_weights": False}),
    "ours: paged + continuous": ("ours", {"kv_mode": "paged", "policy": "continuous", "prepack_weights": False}),
    # On a CPU, GEMMs on weights reordered once for oneDNN (engine/cpu/prepack.py); on a GPU, the rung above.
    "+ prepacked weights": ("ours", {"kv_mode": "paged", "policy": "continuous"}),
    "+ prefix cache (hash)": ("ours", {"prefix_cache": "hash"}),
    "+ prefix cache (radix)": ("ours", {"prefix_cache": "radix"}),
    "+ chunked prefill": (
        "ours",
        {"prefix_cache": "radix", "chunked_prefill": True, "max_num_batched_tokens": 64},
    ),
    # The ladder as talks on inference present it: KV quantization shrinks KV memory for about the same throughput.
    "+ KV cache int8": ("ours", {"prefix_cache": "radix", "kv_dtype": "int8"}),
    "+ speculative (n-gram)": ("ours", {"prefix_cache": "radix", "speculative": "ngram"}),
}


# The chapter's shared-prefix workload (words); the sizes' prefix and question lengths go on top.
WORKLOAD_DEFAULTS = {"input_words": 32, "prefix_words": 128, "turns": 2, "branches": 2}


# ---------------------------------------------------------------------------------------------
# The engine decision chart


@dataclass(frozen=True)
class EngineChoice:
    """One row of the decision chart: when to pick which engine, why, and what measures it."""

    need: str
    engine: str
    reason: str
    evidence: str


DECISION_CHART: tuple[EngineChoice, ...] = (
    EngineChoice(
        "standard API traffic (chat, ShareGPT-like)",
        "vLLM",
        "the production default: paged KV, continuous batching, broad model and hardware support",
        "loadgen --workload sharegpt/random on vLLM vs SGLang: similar tokens/s at equal concurrency",
    ),
    EngineChoice(
        "agentic / shared-prefix heavy",
        "SGLang",
        "radix-tree prefix cache reuses branching histories at token granularity",
        "loadgen --workload agentic: prefix hit rate and TTFT p50 with radix vs hash vs off "
        "(our engine here; SGLang vs vLLM on a GPU)",
    ),
    EngineChoice(
        "peak NVIDIA performance, fixed model",
        "TensorRT-LLM",
        "ahead-of-time compiled kernels; pays a compile step per model/shape",
        "not measured here: compare its loadgen numbers with vLLM's on the same GPU",
    ),
    EngineChoice(
        "multi-node, disaggregated prefill/decode, session routing",
        "Dynamo / llm-d",
        "route sessions to the worker holding their KV; separate prefill and decode pools",
        "capacity planner: GPUs needed; then loadgen against the cluster endpoint",
    ),
    EngineChoice(
        "laptop / edge, CPU or Apple silicon",
        "llama.cpp",
        "quantized GGUF weights, no GPU required",
        "chapter 06 memory per precision; loadgen at concurrency 1 on the laptop",
    ),
    EngineChoice(
        "simplest possible, one user",
        "HF transformers",
        "no extra server stack; one request at a time",
        "loadgen: hf variant's tokens/s stays flat as concurrency grows (requests queue)",
    ),
)


def decision_chart_frame(measured: list[dict[str, Any]] | None = None):
    """The decision chart as a DataFrame; ``measured`` (one dict per variant: ``variant``,
    ``output_tokens_per_s``, ``ttft_ms_p50``, ``prefix_hit_rate``) adds this machine's numbers to the
    rows they support."""
    import pandas as pd

    df = pd.DataFrame([dataclasses.asdict(c) for c in DECISION_CHART])
    if measured:
        by_variant = {r["variant"]: r for r in measured}
        notes = []
        for choice in DECISION_CHART:
            note = ""
            if choice.engine == "HF transformers" and "hf (one at a time)" in by_variant:
                r = by_variant["hf (one at a time)"]
                note = f"hf: {r['output_tokens_per_s']:.1f} output tok/s, TTFT p50 {r['ttft_ms_p50']:.0f} ms"
            elif choice.engine == "SGLang":
                parts = [
                    f"{k}: hit rate {r['prefix_hit_rate']:.0%}, TTFT p50 {r['ttft_ms_p50']:.0f} ms"
                    for k, r in by_variant.items()
                    if r.get("prefix_hit_rate") is not None
                ]
                note = "; ".join(parts)
            elif choice.engine == "vLLM" and ({"ours: paged + continuous", "+ prepacked weights"} & set(by_variant)):
                name = next(n for n in ("+ prepacked weights", "ours: paged + continuous") if n in by_variant)
                r = by_variant[name]
                note = f"{name} (ours): {r['output_tokens_per_s']:.1f} output tok/s"
            notes.append(note)
        df["measured here"] = notes
    return df


def plot_decision_chart():
    """A flowchart-style figure: questions on the left, the engine each answer leads to on the right."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(10, 0.75 * len(DECISION_CHART) + 0.8))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.5, len(DECISION_CHART) - 0.2)
    ax.axis("off")
    for i, choice in enumerate(reversed(DECISION_CHART)):
        ax.text(
            0.1,
            i,
            choice.need,
            va="center",
            ha="left",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "#eef3fb", "ec": "#7a9cc6"},
        )
        ax.annotate(
            "", xy=(6.6, i), xytext=(5.6, i), arrowprops={"arrowstyle": "->", "color": "gray"}
        )
        ax.text(
            6.7,
            i,
            choice.engine,
            va="center",
            ha="left",
            fontsize=10,
            fontweight="bold",
            bbox={"boxstyle": "round", "fc": "#fdf1e3", "ec": "#d49a52"},
        )
    ax.set_title(
        "Which engine? Pick the model first, shrink it, then pick the engine for the workload",
        fontsize=10,
    )
    fig.tight_layout()
    return fig
