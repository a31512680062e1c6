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
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import launchers
from ..bench.served import server_counters
from ..package_files import results_dir
from ..units import count
from .ch10_prefix_caching import SGLANG_AGENTIC_CLAIM
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


def variants_not_run_text(s: Sizes, full: Sizes | None = None) -> str:
    """Which rungs of :data:`OUR_VARIANTS` size ``s`` leaves out and ``full`` (default: the full
    size) runs (markdown; "" when ``s`` leaves none out)."""
    full = full or sizes("cpu", "full")
    added = [name for name in full.variants if name not in s.variants]
    if not added or s.size == full.size:
        return ""
    return (f"At {s.size} size {len(s.variants)} of the {len(OUR_VARIANTS)} rungs run; the {full.size} size "
            "adds " + ", ".join(f"**{name}**" for name in added) + ".")


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
    """One row of a benchmark reported elsewhere (not measured here), with what it was measured at
    and where each of its numbers comes from.

    ``output_tokens_per_s`` is ``None`` where no number was given for the row (only words, in
    ``said``); ``ttft_ms`` and ``itl_ms`` likewise (milliseconds). ``said_vs_baseline`` is a ratio
    to the baseline the speaker said aloud ("almost 15x"). ``line`` is the line of talk 1's
    transcript with the speaker's words for the row and ``quote`` those words, verbatim, where they
    hold numbers. A number comes from the transcript unless its field is in ``from_table``: then it
    comes from the workshop's results as the course brief records them (its vLLM table, its list of
    what went wrong), and is not in the transcript.
    ``units_from_table`` names the fields whose number the transcript gives without a unit.
    """

    config: str
    output_tokens_per_s: float | None
    requests_in_flight: int | None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    said: str = ""  # the speaker's words for this row, paraphrased
    said_vs_baseline: float | None = None
    line: int | None = None
    quote: str = ""
    from_table: tuple[str, ...] = ()
    units_from_table: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """A number credited to the transcript must stand in the row's quote of it."""
        if wrong := self.not_in_quote():
            raise ValueError(f"{self.config}: {', '.join(wrong)} credited to {TALK_1} but not in its quote "
                             f"{self.quote!r}; put the field in from_table or quote the words")

    def not_in_quote(self) -> list[str]:
        """The fields credited to the transcript whose number is not in ``quote`` as a whole number."""
        return [name for name in NUMBER_WORDS
                if (self.source_of(name) or "").startswith(TALK_1)
                and not re.search(rf"(?<![\d.,]){re.escape(_number(getattr(self, name)))}(?![\d]|[.,]\d)", self.quote)]

    def source_of(self, name: str) -> str | None:
        """Where the number in field ``name`` comes from; ``None`` when the row has no such number."""
        if getattr(self, name) is None:
            return None
        return WORKSHOP_TABLE if name in self.from_table else f"{TALK_1}, line {self.line}"

    @property
    def source(self) -> str:
        """Every number of the row with its source, grouped by source ("" for a row of words only)."""
        groups: dict[str, list[str]] = {}
        for name, words in NUMBER_WORDS.items():
            if (where := self.source_of(name)) is not None:
                unit = " (no unit spoken; ms from the brief's table)" if name in self.units_from_table else ""
                groups.setdefault(where, []).append(f"{words} {_number(getattr(self, name))}{unit}")
        words_only = f"{TALK_1}, line {self.line}: words only" if self.line is not None else ""
        return "; ".join(f"{where}: {', '.join(items)}" for where, items in groups.items()) or words_only


TALK_1 = "talk 1"
WORKSHOP_TABLE = "the workshop's results as the course brief records them (not in the transcript)"
# The numbered fields of a ReportedRun, in the words the source column uses.
NUMBER_WORDS = {"output_tokens_per_s": "output tok/s", "said_vs_baseline": "ratio to the baseline said aloud",
                "ttft_ms": "TTFT", "itl_ms": "ITL", "requests_in_flight": "requests in flight"}


def _number(value: float) -> str:
    """A reported number as the source wrote it: no trailing zeros, thousands separated."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,g}"


WORKSHOP_SETUP = "an H100 serving Mistral-7B"
# Talk 1 (the workshop), the presenter of its vLLM benchmark notebook, lines 107-111: an HF transformers
# baseline, then vLLM with one setting added per row. The transcript gives the baseline's 51 tok/s, TTFT
# "54" and ITL "19" (no units) and "almost 15x" for vLLM's default; the ms units, the 736 and 1,034 tok/s
# and the load (1 request against 10 in flight) are the workshop's results as the course brief records
# them (the tok/s in its vLLM table, the load in its list of what went wrong), not the transcript's. The KV-quantization and
# speculative rows were given in words only.
_TABLE_LOAD = ("requests_in_flight",)
WORKSHOP_RUNS = (
    ReportedRun("HF transformers baseline", 51, 1, ttft_ms=54, itl_ms=19,
                said="the raw model behind an API: send the text, get the answer back", line=107,
                quote="hugging phase has a throughput of like around 51 tokens per second. Time to first token "
                      "was like 54 and then the inter token latency was 19",
                from_table=_TABLE_LOAD, units_from_table=("ttft_ms", "itl_ms")),
    ReportedRun("vLLM default (paged attention, continuous batching, KV cache)", 736, 10,
                said="throughput \"almost 15x\"; TTFT rises, ITL goes down", said_vs_baseline=15, line=109,
                quote="your throughput is like almost 15x",
                from_table=("output_tokens_per_s", *_TABLE_LOAD)),
    ReportedRun("+ prefix caching", 1034, None,
                said="throughput up again, TTFT down, ITL about the same, KV use per user down", line=109,
                from_table=("output_tokens_per_s",)),
    ReportedRun("+ KV-cache quantization", None, None,
                said="throughput, TTFT and ITL about the same; KV usage goes down", line=111),
    ReportedRun("+ speculative decoding", None, None,
                said="results about the same, a little less KV usage", line=111),
)
# vLLM's own defaults moved under this ladder: since vLLM 0.8.0 (March 2025) the V1 engine is the default,
# and V1 turns on automatic prefix caching and chunked prefill without a flag (vLLM V1 user guide; the
# "Optimization and Tuning" page for V1; Red Hat, "Performance boosts in vLLM 0.8.1: switching to the V1
# engine", 2025-04-28). `--no-enable-prefix-caching` gives back the workshop's "default" row.
VLLM_V1_DEFAULT_SINCE = "0.8.0"


def _change_words(before: float, after: float) -> str:
    """"raised it to" / "lowered it to" / "left it at": the direction of ``after`` against ``before``."""
    if after > before:
        return "raised it to"
    if after < before:
        return "lowered it to"
    return "left it at"


def numbers_by_source(runs: tuple[ReportedRun, ...] = WORKSHOP_RUNS) -> dict[str, list[str]]:
    """Every number of ``runs``, said with its row, grouped by where it comes from: talk 1's transcript
    (one group, its lines named) or the workshop's results as the course brief records them."""
    groups: dict[str, list[str]] = {}
    lines = sorted({r.line for r in runs if r.line is not None and any(
        (r.source_of(n) or "").startswith(TALK_1) for n in NUMBER_WORDS)})
    transcript = (f"the transcript of {TALK_1} (line{'s' if len(lines) > 1 else ''} "
                  f"{', '.join(map(str, lines))})")
    for run in runs:
        by_row: dict[str, list[str]] = {}
        for name, words in NUMBER_WORDS.items():
            if (where := run.source_of(name)) is None:
                continue
            unit = " (no unit spoken)" if name in run.units_from_table else ""
            key = WORKSHOP_TABLE if where == WORKSHOP_TABLE else transcript
            by_row.setdefault(key, []).append(f"{words} {_number(getattr(run, name))}{unit}")
        for key, items in by_row.items():
            groups.setdefault(key, []).append(f"{run.config}, {', '.join(items)}")
    return groups


def _from(run: ReportedRun, name: str) -> str:
    """A short tag for the source of one number: "talk 1" or "the workshop's table"."""
    return "the workshop's table" if run.source_of(name) == WORKSHOP_TABLE else TALK_1


def workshop_text(runs: tuple[ReportedRun, ...] = WORKSHOP_RUNS) -> str:
    """The workshop's vLLM ladder against its HF baseline, said with the load each side had and the
    source of every number (every number from ``runs``: the baseline first, vLLM's default second,
    then one setting added per row)."""
    hf, default, *added = runs
    sources = " ".join(f"From {where}: " + "; ".join(items) + "." for where, items in numbers_by_source(runs).items())
    text = (
        f"The workshop this course grew from (talk 1, the presenter of its vLLM benchmark) reported, on "
        f"{WORKSHOP_SETUP}, an HF transformers baseline and then vLLM with one setting added at a time (the table "
        f"below; its source column says where each number comes from). {sources}"
    )
    if hf.output_tokens_per_s and default.output_tokens_per_s:
        said = (f" (the speaker said \"almost {_number(default.said_vs_baseline)}x\")"
                if default.said_vs_baseline is not None else "")
        text += (f"\n\nvLLM's default served {_number(default.output_tokens_per_s)} output tokens/s "
                 f"({_from(default, 'output_tokens_per_s')}) against the baseline's {_number(hf.output_tokens_per_s)} "
                 f"({_from(hf, 'output_tokens_per_s')}): "
                 f"{default.output_tokens_per_s / hf.output_tokens_per_s:.0f}× the baseline{said}.")
    if hf.requests_in_flight is not None and default.requests_in_flight is not None:
        text += (" That ratio is not engine against engine: "
                 f"HF had **{count(hf.requests_in_flight, 'request')}** in flight ({_from(hf, 'requests_in_flight')}) "
                 f"and vLLM **{default.requests_in_flight}** ({_from(default, 'requests_in_flight')}), "
                 "so much of it is batching, which any engine with continuous batching gets.")
    previous = default
    for run in added:
        if run.output_tokens_per_s is None or previous.output_tokens_per_s is None:
            text += f" **{run.config}**: no number was given; the speaker said {run.said}."
            continue
        ratio = run.output_tokens_per_s / previous.output_tokens_per_s
        text += (f" **{run.config}** {_change_words(previous.output_tokens_per_s, run.output_tokens_per_s)} "
                 f"{_number(run.output_tokens_per_s)} ({_from(run, 'output_tokens_per_s')}; {ratio:.2f}× the row "
                 "before it).")
        previous = run
    text += (
        f"\n\nThat ladder starts from a vLLM without prefix caching. Since vLLM {VLLM_V1_DEFAULT_SINCE} the V1 "
        "engine is the default, and it turns automatic prefix caching and chunked prefill on by default: a plain "
        "`vllm serve` today is already the \"+ prefix caching\" row, and the workshop's \"default\" is "
        "`--no-enable-prefix-caching`. The talk names no vLLM version, so nobody can tell whether the vLLM "
        "behind its SGLang comparison (the decision chart below) kept prefixes at all. Here every variant "
        "gets the same workload at the same concurrency; the HF variant still serves one request at a time, "
        "because that is what a plain `generate` loop behind an API does (transformers' own continuous "
        "batching, its `ContinuousBatchingManager` through `continuous_batching_context_manager`, is a "
        "contender in chapter 09)."
    )
    return text


WORKSHOP_COLUMNS = [
    Column("config", "configuration (talk 1 and the workshop's table)", "text"),
    Column("output_tokens_per_s", "output tokens/s", missing="— (said in words only)"),
    Column("vs_baseline", "× the HF baseline", "ratio", digits=2, missing="—"),
    Column("ttft_ms", "TTFT (ms)", missing="— (not given)"),
    Column("itl_ms", "ITL (ms)", missing="— (not given)"),
    Column("requests_in_flight", "requests in flight", "int", missing="— (not given)"),
    Column("said", "what the speaker said", "text"),
    Column("source", "source of each number", "text"),
]
WORKSHOP_TITLE = "The workshop's vLLM ladder (talk 1 and the workshop's table; cited, not measured here)"


def workshop_table(runs: tuple[ReportedRun, ...] = WORKSHOP_RUNS):
    """The workshop's vLLM ladder as reported (cited, not measured here), with each row's ratio to the
    HF baseline computed from ``runs``."""
    base = runs[0].output_tokens_per_s
    rows = [{**dataclasses.asdict(r), "source": r.source,
             "vs_baseline": r.output_tokens_per_s / base if r.output_tokens_per_s and base else None}
            for r in runs]
    return people_table(rows, WORKSHOP_COLUMNS)


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
SCALE_OUT_COLUMNS = [  # the layout beside the GPU count: TP2 and DP2 are both "2 GPUs"
    Column("n_gpus", "GPUs", "int"), Column("parallelism", "layout", "text"), Column("fits", "weights fit", "bool"),
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
    answer = (f"**{plan['chosen']} GPUs as {plan['parallelism']}**" if plan["chosen"]
              else f"**more than {most} GPUs** (no layout tried meets it)")
    return (f"The capacity planner (chapter 05) for {q['model']} at {q['context']:,} tokens of context, "
            f"{q['min_users']} users within a {q['itl_slo_ms']:g} ms ITL on {q['gpu']} (roofline bounds): "
            f"{answer}. The table lists every layout it tried{_layout_contrast(plan['plans'])}. Launch a "
            "distributed engine for that and measure it with the same loadgen; our engine stays on one device "
            "on purpose.")


def _layout_contrast(plans: list[dict[str, Any]]) -> str:
    """Where one GPU count fits the weights in one layout and not in another (``n_gpus``,
    ``parallelism``, ``fits`` per plan row), a clause naming the first such pair; else ""."""
    for n in sorted({p["n_gpus"] for p in plans}):
        same = [p for p in plans if p["n_gpus"] == n]
        fit = next((p for p in same if p["fits"]), None)
        miss = next((p for p in same if not p["fits"]), None)
        if fit and miss:
            return (f": at {n} GPUs, {fit['parallelism']} fits the weights and {miss['parallelism']} does not "
                    "(a data-parallel replica holds all of them, a tensor-parallel group splits them)")
    return ""


def scale_out_table(plan: dict[str, Any]):
    return people_table(plan["plans"], SCALE_OUT_COLUMNS)


def scale_out_commands(plan: dict[str, Any]) -> str:
    """The vLLM and SGLang launch lines for the planned number of GPUs (a markdown code block)."""
    return "\n".join(["```bash", " ".join(plan["vllm"]), " ".join(plan["sglang"]), "```"])


def decision_figure():
    """The decision chart as a flowchart-style figure (analytic: no measurement in it)."""
    return plot_decision_chart()


def tables(result: Result) -> dict[str, Any]:
    out = {WORKSHOP_TITLE: workshop_table()}
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


GPU_PORT = 8000  # every engine in turn on the same port, so the same loadgen line reaches each


def gpu_commands(model: str = GPU_MODEL, port: int = GPU_PORT) -> list[str]:
    """The commands that measure vLLM and SGLang with the same loadgen, one engine at a time: for
    each engine, launch it on ``port``, drive it, save under ``results/<engine>``, stop it."""
    commands = []
    for engine in launchers.ENGINES:
        commands += [
            f"infer-lab engines launch {engine} --model {model} --port {port} --prefix-caching on",
            f"infer-lab loadgen --url http://127.0.0.1:{port} --model {model} --workload agentic "
            f"--concurrency 1,4,16,64 --repeats 3 --out results/{engine}",
            f"infer-lab engines stop {engine}",
        ]
    return commands


def engines_text(model: str = GPU_MODEL) -> str:
    """Which engines this machine has, and how to measure them on a GPU box (markdown)."""
    installed = launchers.which_engines()
    status = ", ".join(f"{e}: {'installed ' + str(d['version']) if d['installed'] else 'not installed'}"
                       for e, d in installed.items())
    launch = " ".join(launchers.build_command("vllm", launchers.EngineOptions(model=model), python="python"))
    return "\n".join([
        f"Here, in this Python: {status} (vLLM's CPU build, above, runs from a virtual environment of its "
        "own). On a GPU box with them installed, each engine in turn is started on the same port, "
        "driven by the same loadgen into a folder of its own, and stopped before the next one starts:", "", "```bash", *gpu_commands(model), "```", "",
        f"`launch` runs, for vLLM, `{launch}`, waits for `/health`, and records the version and the PID.",
    ])


def saved() -> SavedView | None:
    """This page draws no saved vLLM/SGLang GPU run: ``None`` (:func:`gpu_note` says what is saved)."""
    return None


@dataclass(frozen=True)
class SavedEngineRun:
    """A saved result file that holds numbers of vLLM or SGLang, and on what kind of device."""

    file: str  # the file's name under the results folder
    engine: str  # the server as the file labels it, e.g. "vLLM 0.32.0 (CPU build)"
    device_kind: str  # the measuring machine's device kind: "cpu", "cuda", ...


NAMED_ENGINES = ("vllm", "sglang")  # the contender names of the engines this section is about


def saved_engine_runs(folder: Path | None = None) -> list[SavedEngineRun]:
    """Every vLLM or SGLang server in the saved ``*engines*.json`` results of ``folder`` (default: the
    package's results folder), one entry per file and server."""
    folder = folder or results_dir()
    out = []
    for path in sorted(folder.glob("*engines*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            servers = data["servers"]
            kind = str((data.get("environment") or {}).get("device_kind", "unknown"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        entries = ([(s.get("contender", ""), s.get("label") or s.get("contender", "")) for s in servers]
                   if isinstance(servers, list) else
                   [(name, f"{name} {info.get('version', '')}".strip()) for name, info in servers.items()])
        out += [SavedEngineRun(path.name, label, kind) for contender, label in entries
                if str(contender).startswith(NAMED_ENGINES)]
    return out


def gpu_note(runs: list[SavedEngineRun] | None = None) -> str:
    """What is saved of vLLM and SGLang (default: :func:`saved_engine_runs`), and what is missing on a
    GPU (markdown)."""
    runs = saved_engine_runs() if runs is None else runs
    on_gpu = [r for r in runs if r.device_kind != "cpu"]
    on_cpu = [r for r in runs if r.device_kind == "cpu"]

    def listed(rs: list[SavedEngineRun]) -> str:
        return ", ".join(f"{r.engine} (`{r.file}`)" for r in rs)

    if on_gpu:
        return (f"**Saved vLLM or SGLang runs not on a CPU:** {listed(on_gpu)}. This page does not draw them; "
                "read them with the loadgen report, and add a run of each engine with the commands above.")
    cpu = (f"The saved vLLM or SGLang numbers here are CPU runs: {listed(on_cpu)}."
           if on_cpu else "Nor is any CPU run of them saved.")
    return ("**No saved vLLM or SGLang results from a GPU exist in `src/infer_lab/results/` yet**, so nothing "
            f"measured on a GPU is shown for them here. {cpu} Run the commands above on a GPU and save the loadgen "
            "JSON as `src/infer_lab/results/<gpu>-engines-<date>.json`.")


# ---------------------------------------------------------------------------------------------
# Course material: our variants side by side through HTTP, the sweep, the decision chart

# Each optimization of our engine switched on one at a time (options of infer_lab.engine.EngineConfig).
OUR_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    HF_VARIANT: ("hf", {}),
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
    """One row of the decision chart: when to pick which engine, why, and what supports the row.

    ``evidence`` starts with what kind of support it is: "cited" (reported elsewhere, named),
    "measured here" (this course's own runs, which are our engine's or HF's, never the named
    engine's), "analytic" or "not measured here".
    """

    need: str
    engine: str
    reason: str
    evidence: str


# Sources of the engine facts below (versions named where a default changed):
# - vLLM: V1 the default engine since 0.8.0, prefix caching and chunked prefill on by default (see
#   VLLM_V1_DEFAULT_SINCE above).
# - SGLang: RadixAttention keeps the KV of finished and running requests in a radix tree shared by
#   every request; cache-aware scheduling (longest prefix match first) is from the SGLang paper (Zheng et
#   al., 2024) and is `--schedule-policy lpm`. Its KV pool's default page size is 1 token; with
#   `--page-size` > 1 it matches whole pages, as vLLM matches whole blocks (chapter 10).
# - TensorRT-LLM: the LLM API and `trtllm-serve` default to the PyTorch backend since 1.0 (NVIDIA/TensorRT-LLM
#   PR #5312, "promote PyTorch to be the default LLM backend"); HF checkpoints load directly, no
#   engine build. The current docs' "Migration Guide: TensorRT Backend Removed" drops the legacy backend.
# - transformers: `generate_batch` and `ContinuousBatchingManager` (paged KV, requests join and leave),
#   and `transformers serve` built on them (transformers 5.x docs, "Continuous batching").
# - TGI: continuous batching, paged and flash attention, tensor parallelism (its README); put in
#   maintenance mode on 2025-12-11 (README commit "Maintenance mode", PR #3344); last release v3.3.7
#   (2025-12-19), reported; the repository reported archived read-only on 2026-03-21 (secondary sources,
#   not checked against GitHub here).
# - vLLM-Omni: the vLLM project's omni-modality serving (text, image, audio, video; diffusion
#   outputs), announced 2025-11-30 on the vLLM blog.
_SGLANG_REPORTED_LO, _SGLANG_REPORTED_HI = SGLANG_AGENTIC_CLAIM

DECISION_CHART: tuple[EngineChoice, ...] = (
    EngineChoice(
        "standard API traffic (chat, ShareGPT-like)",
        "vLLM",
        f"the production default: paged KV, continuous batching, and (V1, vLLM ≥ {VLLM_V1_DEFAULT_SINCE}) prefix "
        "caching and chunked prefill on by default; broad model and hardware support",
        "cited: talk 1 (line 125) found no statistical difference between vLLM and SGLang on ShareGPT questions on an H100 "
        "(requests/s, TTFT, latency); not measured here (loadgen --workload sharegpt on both, on a GPU)",
    ),
    EngineChoice(
        "agentic / multi-turn: many requests sharing long histories",
        "SGLang",
        "its radix-tree cache (RadixAttention) shares the KV of every history many requests have in common "
        "(agent branches, chat turns), and cache-aware scheduling (`--schedule-policy lpm`, longest prefix "
        "first) runs requests while their prefix is still cached; chapter 10 measures what matching granularity "
        "alone is worth on its workloads (hash blocks against a radix tree)",
        f"cited: talk 1 (line 127) reported SGLang {_SGLANG_REPORTED_LO:.0f}–{_SGLANG_REPORTED_HI:.0f}× better than vLLM "
        "on a two-turn propose-and-review loop on an H100, adding \"this depends upon the different setup\"; "
        "measured here: our engine's hash and radix caches (chapter 10), not SGLang",
    ),
    EngineChoice(
        "peak NVIDIA performance",
        "TensorRT-LLM",
        "NVIDIA's engine and kernels; since TensorRT-LLM 1.0 it defaults to a PyTorch backend that loads Hugging "
        "Face checkpoints with no build step (the legacy TensorRT backend compiled an engine per model, GPU "
        "and parallelism for maximum batch and sequence sizes)",
        "not measured here: compare its loadgen numbers with vLLM's on the same GPU",
    ),
    EngineChoice(
        "multi-node, disaggregated prefill/decode, session routing",
        "Dynamo / llm-d",
        "route sessions to the worker holding their KV; separate prefill and decode pools",
        "analytic: the capacity planner's GPUs needed; then loadgen against the cluster endpoint",
    ),
    EngineChoice(
        "images, audio or video in or out (multimodal)",
        "vLLM or SGLang; vLLM-Omni",
        "vLLM and SGLang serve vision-language models behind the same OpenAI API; vLLM-Omni (2025) adds "
        "audio, video and diffusion outputs. Talk 1 (line 131) also named a new multimodal engine from Stanford",
        "not measured here: this course's workloads are text",
    ),
    EngineChoice(
        "laptop / edge, CPU or Apple silicon",
        "llama.cpp",
        "quantized GGUF weights, no GPU required",
        "measured here: chapter 06 memory per precision; loadgen at concurrency 1 on the laptop",
    ),
    EngineChoice(
        "an existing Hugging Face TGI deployment",
        "TGI (text-generation-inference)",
        "Hugging Face's server: continuous batching, paged attention, tensor parallelism; in maintenance "
        "mode since December 2025 and reported archived read-only on 2026-03-21 (secondary sources), so new "
        "deployments pick from the rows above",
        "not measured here; loadgen speaks its OpenAI-compatible API",
    ),
    EngineChoice(
        "prototyping in Python, one model, few users",
        "HF transformers",
        "no server stack to run; `generate` serves one request at a time, while `generate_batch` / "
        "`ContinuousBatchingManager` (and `transformers serve` on them) batch continuously with paged KV",
        f"measured here: the \"{HF_VARIANT}\" variant in this chapter, transformers' `ContinuousBatchingManager` "
        "(through `continuous_batching_context_manager`) in chapter 09",
    ),
)

MEASURED_HERE = "measured here (our engine or HF, not the named engine)"


def _measured_note(choice: EngineChoice, by_variant: dict[str, dict[str, Any]]) -> str:
    """This machine's numbers for the one row they bear on, each saying whose numbers they are."""
    if choice.engine == "HF transformers" and HF_VARIANT in by_variant:
        r = by_variant[HF_VARIANT]
        return (f"HF `generate`, one at a time: {r['output_tokens_per_s']:.1f} output tok/s, "
                f"TTFT p50 {r['ttft_ms_p50']:.0f} ms")
    if choice.engine == "SGLang":
        parts = [f"{k}: hit rate {r['prefix_hit_rate']:.0%}, TTFT p50 {r['ttft_ms_p50']:.0f} ms"
                 for k, r in by_variant.items() if r.get("prefix_hit_rate") is not None]
        return "our engine's prefix caches (not SGLang): " + "; ".join(parts) if parts else ""
    if choice.engine == "vLLM":
        name = next((n for n in ("+ prepacked weights", "ours: paged + continuous") if n in by_variant), None)
        if name:
            return (f"our engine with vLLM's mechanisms (paged KV, continuous batching; not vLLM), {name}: "
                    f"{by_variant[name]['output_tokens_per_s']:.1f} output tok/s")
    return ""


def decision_chart_frame(measured: list[dict[str, Any]] | None = None):
    """The decision chart as a DataFrame; ``measured`` (one dict per variant: ``variant``,
    ``output_tokens_per_s`` in tokens/s, ``ttft_ms_p50`` in ms, ``prefix_hit_rate`` a fraction or
    ``None``) adds this machine's numbers to the rows they bear on, in a column that says they are
    our engine's or HF's, not the named engine's."""
    import pandas as pd

    df = pd.DataFrame([dataclasses.asdict(c) for c in DECISION_CHART])
    if measured:
        by_variant = {r["variant"]: r for r in measured}
        df[MEASURED_HERE] = [_measured_note(choice, by_variant) for choice in DECISION_CHART]
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
