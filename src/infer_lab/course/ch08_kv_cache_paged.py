"""Chapter 08, "KV cache and PagedAttention": why the cache exists, and where its memory goes.

The chapter's experiments are the ``@app.function`` of ``infer_lab/notebooks/08_kv_cache_paged.py``, which
call the library directly; this module prepares their inputs and presents their results, and
runs the notebook's own functions (:func:`~infer_lab.course.notebook_code.notebook_function`)
for the tour, the tests, the deck and the Jupyter edition.

1. **No cache vs KV cache** (measured, ``generate_step_by_step``): the same generation through
   the engine with ``kv_mode="nocache"`` (every step recomputes the whole context) and
   ``kv_mode="paged"`` (every step computes one token and reads the cached K/V).
2. **Where KV memory goes** (simulated, no model, ``where_memory_goes``): a mixed workload shares
   a KV budget under three layouts (:mod:`infer_lab.analysis.fragmentation`); every slot of
   every step is classified as used, reserved for future tokens, internal or external
   fragmentation (:mod:`infer_lab.analysis.kv_waste` turns slots into bytes).
3. **How many requests fit** (the engine's own allocators, no model run, ``fill_until_full``):
   :class:`~infer_lab.engine.ContiguousKVCache` and :class:`~infer_lab.engine.PagedKVCache` in
   one budget (:func:`infer_lab.bench.kv_allocators.caches_in_budget`) take the workload's
   requests in order until the next one does not fit.

Times are ``time.perf_counter`` around synchronized engine steps (the engine reads each step's
sampled tokens back to the host). Bytes are counted from the allocators or from slot counts ×
the model's K/V bytes per token.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.fragmentation import LAYOUTS
from ..analysis.kv_waste import LayoutWaste, budget_problem, layout_waste, mixed_lengths
from ..analysis.memory import kv_bytes_per_token
from ..bench.kv_allocators import AllocatorWaste, caches_in_budget
from ..harness import progress
from ..shape import ModelShape, model_shape
from ..units import GB, GiB, count
from .chapter import NO_MODEL, ChapterResult, chapter_number, choose_size, run_parts
from .library_code import source_without_docstring
from .notebook_code import notebook_function
from .saved import SavedView
from .tables import Column, people_table

NUMBER = "08"
SLUG = "kv_cache_paged"
TITLE = "08 · KV cache and PagedAttention"
NEEDS_MODEL = True
PARTS = {
    "cache": "Measure no cache vs KV cache",
    "waste": "Simulate where KV memory goes",
    "fit": "Reserve the workload with the engine's allocators",
}
# Parts that need no model and measure nothing here (computed or simulated): the saved-only deck keeps them.
ANALYTIC_PARTS = ("waste", "fit")

# What the vLLM paper reports (cited, not measured here): share of KV memory wasted.
PAPER = "the vLLM paper (Kwon et al., 2023)"
PAPER_WASTE_BEFORE = (0.60, 0.80)  # earlier systems (contiguous reservations)
PAPER_WASTE_PAGED = 0.04  # vLLM with PagedAttention: under this
# What paging buys in requests or throughput, as cited (neither is measured here):
PAPER_THROUGHPUT = (2, 4)  # the vLLM paper's abstract: 2-4x the throughput of FasterTransformer and Orca, same latency
TALK_REQUESTS = 3  # the system talk (talk 2): paging lets you "serve three times more requests"
RATIO_EXPLAINED = 0.15  # a measured ratio within 15% of max_model_len / mean request is "close to it"
BYTES_PER_VALUE = {"bf16": 2, "fp32": 4}


LENGTH_DIVISOR = 4  # the workload's longest prompt and longest output are each max_model_len // LENGTH_DIVISOR


def share_words(divisor: int) -> str:
    """``1 / divisor`` in words: "half", "a third", "a quarter", else "1/n"."""
    return {2: "half", 3: "a third", 4: "a quarter"}.get(divisor, f"1/{divisor}")


@dataclass(frozen=True)
class WasteSettings:
    """One KV-memory experiment: a model shape, a mixed workload and a KV budget. Analytic: no model runs.

    Prompt and output lengths are drawn log-uniformly up to ``max_model_len // LENGTH_DIVISOR`` each
    (:func:`mixed_lengths`, seeded); request ``i`` arrives at step ``i``. ``max_tokens`` is the
    limit each client declares (``None``: an oracle that declares exactly its output length).
    """

    shape_name: str = "mistral-7b"
    requests: int = 64
    max_model_len: int = 2048
    max_tokens: int | None = 512
    budget_bytes: int = 2 * GiB
    block_size: int = 16
    kv_dtype: str = "bf16"
    seed: int = 0

    @property
    def shape(self) -> ModelShape:
        return model_shape(self.shape_name)

    @property
    def bytes_per_value(self) -> int:
        return BYTES_PER_VALUE[self.kv_dtype]

    def lengths(self) -> tuple[list[int], list[int]]:
        """(prompt lengths, output lengths) of the workload, in tokens."""
        longest = self.max_model_len // LENGTH_DIVISOR
        return mixed_lengths(self.requests, seed=self.seed, max_prompt=longest, max_output=longest)

    def describe(self) -> str:
        declared = self.max_tokens if self.max_tokens is not None else "oracle"
        return (f"{self.shape_name} shape, {self.kv_dtype} K/V, {self.requests} mixed-length requests (one per "
                f"step), max_model_len {self.max_model_len:,}, max_tokens {declared}, "
                f"{self.budget_bytes / GiB:g} GiB budget")


@dataclass(frozen=True)
class Sizes:
    """The generation of part 1 (tokens) and the workload of parts 2 and 3."""

    size: str
    prompt_len: int
    new_tokens: int
    waste: WasteSettings = field(default_factory=WasteSettings)


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` (a few seconds on a 2-core CPU) or ``full``; a GPU gets longer contexts.

    The no-cache run recomputes the whole context at every step, so its cost grows with the
    square of ``new_tokens``: on a CPU the quick size keeps it to a few dozen tokens.
    """
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        return (Sizes(size, prompt_len=128, new_tokens=128) if size == "quick"
                else Sizes(size, prompt_len=512, new_tokens=512, waste=WasteSettings(requests=256)))
    if size == "quick":
        return Sizes(size, prompt_len=16, new_tokens=16)
    return Sizes(size, prompt_len=16, new_tokens=96, waste=WasteSettings(requests=256))


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class StepPoint:
    """One engine step of a generation: ``tokens_computed`` tokens in ``step_s`` seconds.

    ``position`` is the tokens in context when the step ran (step 0 is the prompt's prefill).
    ``flops`` counts ``2 × parameters × tokens computed`` (the matmul work of the step).
    """

    mode: str  # "nocache" or "paged"
    step: int
    position: int
    step_s: float
    tokens_computed: int
    flops: float

    @property
    def phase(self) -> str:
        return "prefill" if self.step == 0 else "decode"


@dataclass(frozen=True)
class ModeTotals:
    """One KV mode's whole generation: tokens computed, FLOPs and seconds, and its decode steps."""

    mode: str
    tokens_computed: int
    flops: float
    seconds: float
    first_decode_s: float
    last_decode_s: float


@dataclass(frozen=True)
class CacheResult:
    points: list[StepPoint]
    prompt_len: int
    new_tokens: int
    params: int

    def steps(self, mode: str, phase: str | None = None) -> list[StepPoint]:
        return [p for p in self.points if p.mode == mode and (phase is None or p.phase == phase)]

    def totals(self) -> list[ModeTotals]:
        out = []
        for mode in ("nocache", "paged"):
            steps, decode = self.steps(mode), self.steps(mode, "decode")
            out.append(ModeTotals(mode, sum(p.tokens_computed for p in steps), sum(p.flops for p in steps),
                                  sum(p.step_s for p in steps), _mean_step(decode[:4]), _mean_step(decode[-4:])))
        return out


def _mean_step(points: list[StepPoint]) -> float:
    return sum(p.step_s for p in points) / len(points) if points else float("nan")



@dataclass(frozen=True)
class FitRow:
    """One of the engine's allocators filled from the workload, in order, until the next request did not fit.

    The bytes are the allocator's own :class:`~infer_lab.engine.KVMemoryReport` for the requests it
    holds, each at the end of its life (``prompt + output`` tokens).
    """

    layout: str  # "contiguous" or "paged"
    requests_that_fit: int
    capacity_bytes: int
    reserved_bytes: int
    used_bytes: int
    block_size: int | None
    max_model_len: int

    @property
    def wasted_bytes(self) -> int:
        return self.reserved_bytes - self.used_bytes

    @property
    def wasted_fraction(self) -> float:
        """Share of the reserved bytes that hold no token."""
        return self.wasted_bytes / self.reserved_bytes if self.reserved_bytes else 0.0

    @property
    def label(self) -> str:
        return self.layout + (f" (block {self.block_size})" if self.block_size else f" ({self.max_model_len:,} slots)")


@dataclass(frozen=True)
class WasteResult:
    settings: WasteSettings
    layouts: list[LayoutWaste]

    def layout(self, name: str) -> LayoutWaste:
        return next(r for r in self.layouts if r.layout == name)


@dataclass(frozen=True)
class FitResult:
    settings: WasteSettings
    block_size: int
    rows: list[FitRow]

    def fits(self, layout: str) -> int:
        return self.row(layout).requests_that_fit

    def row(self, layout: str) -> FitRow:
        return next(r for r in self.rows if r.layout == layout)


@dataclass
class Result(ChapterResult):
    """Chapter 08's results; a part not run is ``None``."""

    model: str = ""
    cache: CacheResult | None = None
    waste: WasteResult | None = None
    fit: FitResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# The notebook's experiments (run from infer_lab/notebooks/08_kv_cache_paged.py) and their inputs

KV_MODES = ("nocache", "paged")
FIT_BLOCK_SIZE = 16  # tokens per block; the notebook's part-3 cell starts at the same number


def cache_prompt(lm: Any, sizes: Sizes) -> list[int]:
    """The prompt of part 1: ``sizes.prompt_len`` random token ids (seeded)."""
    return lm.random_ids(1, sizes.prompt_len, seed=7)[0].tolist()


def cache_result(runs: dict[str, list[Any]], prompt_len: int, lm: Any) -> CacheResult:
    """Both KV modes' engine step records as per-step points: tokens computed, seconds, FLOPs."""
    params = sum(p.numel() for p in lm.model.parameters())
    points = [StepPoint(mode, i, prompt_len + i, rec.duration_s, rec.num_tokens, 2 * params * rec.num_tokens)
              for mode in KV_MODES for i, rec in enumerate(runs[mode])]
    return CacheResult(points, prompt_len, len(runs["paged"]), params)


def run_cache(lm: Any, sizes: Sizes) -> CacheResult:
    """Run the notebook's own experiment (``generate_step_by_step``) for both KV modes."""
    generate = notebook_function(NUMBER, "generate_step_by_step")
    prompt = cache_prompt(lm, sizes)
    runs = {mode: generate(lm, prompt, sizes.new_tokens, mode) for mode in progress(KV_MODES, desc="no cache, then a KV cache")}
    return cache_result(runs, len(prompt), lm)


def budget_slots(settings: WasteSettings) -> int:
    """Token slots of the KV budget: ``budget_bytes // (the shape's K/V bytes per token)``."""
    return settings.budget_bytes // kv_bytes_per_token(settings.shape, settings.kv_dtype)


def waste_problem(settings: WasteSettings) -> str | None:
    """Why ``settings`` cannot be simulated (one request needs more than the whole budget), or None."""
    prompts, outputs = settings.lengths()
    return budget_problem(settings.shape, prompts, outputs, settings.max_model_len, settings.budget_bytes,
                          settings.max_tokens, settings.block_size, settings.kv_dtype)


def waste_result(settings: WasteSettings, timelines: dict[str, Any]) -> WasteResult:
    """The simulation's timelines (slot counts per step, one per layout) as bytes and shares."""
    per_token = kv_bytes_per_token(settings.shape, settings.kv_dtype)
    return WasteResult(settings, [
        layout_waste(name, timeline, settings.requests, per_token, settings.max_model_len, settings.max_tokens,
                     settings.block_size) for name, timeline in timelines.items()])


def run_waste(settings: WasteSettings) -> WasteResult:
    """Run the notebook's own simulation (``where_memory_goes``) on the workload of ``settings``."""
    where_memory_goes = notebook_function(NUMBER, "where_memory_goes")
    prompts, outputs = settings.lengths()
    timelines = where_memory_goes(prompts, outputs, settings.max_model_len, settings.max_tokens,
                                  budget_slots(settings), settings.block_size)
    return waste_result(settings, timelines)


def fit_result(settings: WasteSettings, block_size: int, held: dict[str, tuple[int, Any]]) -> FitResult:
    """Each allocator's (requests that fit, memory report) as rows."""
    rows = [FitRow(name, n, report.capacity_bytes, report.reserved_bytes, report.used_bytes,
                   block_size if name == "paged" else None, settings.max_model_len)
            for name, (n, report) in held.items()]
    return FitResult(settings, block_size, rows)


def run_fit(settings: WasteSettings, block_size: int = FIT_BLOCK_SIZE) -> FitResult:
    """Run the notebook's own experiment (``fill_until_full``) on both of the engine's allocators."""
    fill_until_full = notebook_function(NUMBER, "fill_until_full")
    prompts, outputs = settings.lengths()
    caches = caches_in_budget(settings.shape, settings.budget_bytes, settings.max_model_len, block_size,
                              settings.kv_dtype)
    return fit_result(settings, block_size, {name: fill_until_full(c, prompts, outputs) for name, c in caches.items()})


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiments in a row (``parts`` picks some of :data:`PARTS`), run from the notebook."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "cache": lambda: run_cache(lm, sizes),
        "waste": lambda: run_waste(sizes.waste),
        "fit": lambda: run_fit(sizes.waste),
    })


def paging_code() -> str:
    """The engine's real paging code, docstrings left out, as a markdown code block: the slot
    lookup through a block table (``paged_slots``), the count of new blocks a request needs, and
    the block manager growing a request's table from its free list."""
    from ..engine.block_manager import BlockManager, paged_blocks_needed
    from ..engine.kv_store import paged_slots

    code = ["# kv_store.paged_slots: position -> slot through the block table", source_without_docstring(paged_slots),
            "", "# block_manager.paged_blocks_needed: new blocks for num_new_tokens more tokens",
            source_without_docstring(paged_blocks_needed), "", "# BlockManager.grow: free blocks join a table",
            source_without_docstring(BlockManager.grow)]
    return "```python\n" + "\n".join(code).rstrip() + "\n```"

# ---------------------------------------------------------------------------------------------
# Words


def predicted_tokens_computed(prompt_len: int, new_tokens: int) -> tuple[int, int]:
    """Tokens computed in all to generate ``new_tokens`` after a prompt: (no cache, KV cache).

    Step 0 prefills the prompt (and samples the first token); step ``i`` then computes the
    prompt and the ``i`` tokens so far without a cache, one token with it:
    ``N·P + N(N−1)/2`` against ``P + N − 1``.
    """
    n, p = new_tokens, prompt_len
    return n * p + n * (n - 1) // 2, p + n - 1


def cache_text(cache: CacheResult) -> str:
    nocache, paged = cache.totals()
    last_nc, last_p = cache.steps("nocache")[-1], cache.steps("paged")[-1]
    p, n = cache.prompt_len, cache.new_tokens
    predicted_nc, predicted_p = predicted_tokens_computed(p, n)
    return (
        f"Both runs prefill the same {cache.prompt_len}-token prompt (step 0) and generate "
        f"{cache.new_tokens} tokens. Without a cache the last step recomputed **{last_nc.tokens_computed} tokens**, "
        f"with it **{last_p.tokens_computed}**: {nocache.tokens_computed:,} tokens computed in all against "
        f"{paged.tokens_computed:,} ({nocache.flops / paged.flops:.1f}× the FLOPs; predicted "
        f"{predicted_nc:,} = {n}·{p} + {n}·{n - 1}/2 and {predicted_p:,} = {p} + {n} − 1). The decode step went from "
        f"{nocache.first_decode_s * 1e3:.1f} to {nocache.last_decode_s * 1e3:.1f} ms without a cache "
        f"({nocache.last_decode_s / nocache.first_decode_s:.2f}×) and from {paged.first_decode_s * 1e3:.1f} to "
        f"{paged.last_decode_s * 1e3:.1f} ms with it (mean of the first and last 4 decode steps); the whole "
        f"generation took {nocache.seconds:.2f} s against {paged.seconds:.2f} s. Whether the *time* grows as fast "
        "as the work depends on the device: a small model's step is dominated by reading the weights, so "
        "recomputing a few dozen tokens costs little at first; the gap widens with the context."
    )


def waste_text(waste: WasteResult) -> str:
    cmax, exact, paged = (waste.layout(n) for n in LAYOUTS)
    low, high = PAPER_WASTE_BEFORE
    return (
        f"Time-averaged, **{cmax.wasted_fraction:.0%}** of the KV memory in play is wasted with max-length "
        f"reservations, **{exact.wasted_fraction:.0%}** with exact reservations and "
        f"**{paged.wasted_fraction:.1%}** with blocks of {paged.block_size} ({PAPER} reports "
        f"{low:.0%}–{high:.0%} for earlier systems and under {PAPER_WASTE_PAGED:.0%} for vLLM). Paging finished "
        f"the workload in **{paged.steps:,}** steps against {cmax.steps:,} for max-length reservation, because "
        f"{paged.mean_running:.1f} requests ran at once on average instead of {cmax.mean_running:.1f}: the decode "
        "batch can only be as large as the KV cache allows, and that is what buys throughput."
        + (f" Memory ran short {paged.preemptions} times in the paged run: the newest request was preempted and "
           "recomputed later." if paged.preemptions else "")
    )


def mean_request_tokens(row: FitRow, settings: WasteSettings) -> float:
    """Mean tokens per request the allocator holds (each at the end of its life), from its used bytes."""
    per_token = kv_bytes_per_token(settings.shape, settings.kv_dtype)
    return row.used_bytes / per_token / row.requests_that_fit if row.requests_that_fit else 0.0


def ratio_cause_text(fit: FitResult) -> str:
    """What sets the paged/contiguous request ratio: ``max_model_len`` over the mean request, when both are full.

    A contiguous region is ``max_model_len`` slots whatever the request holds; a paged request takes
    about its own length. So with both caches full the ratio is close to ``max_model_len`` ÷ the mean
    request length: a property of the setting and the workload. Then the cited figures, for scale.
    """
    contiguous, paged = fit.row("contiguous"), fit.row("paged")
    s = fit.settings
    mean = mean_request_tokens(paged, s)
    cited = (f"For scale, cited rather than measured: the system talk (talk 2) says paging lets you serve "
             f"\"three times more requests\" ({TALK_REQUESTS}×), and {PAPER} reports {PAPER_THROUGHPUT[0]}–"
             f"{PAPER_THROUGHPUT[1]}× the throughput of FasterTransformer and Orca at the same latency.")
    if not contiguous.requests_that_fit or not mean:
        return cited
    expected = s.max_model_len / mean
    ratio = paged.requests_that_fit / contiguous.requests_that_fit
    if paged.requests_that_fit == s.requests:
        verdict = (f"but here every request fit in the paged cache, so the {ratio:.1f}× is capped by the workload and "
                   "a larger workload would show more")
    elif abs(ratio / expected - 1) <= RATIO_EXPLAINED:
        verdict = f"close to the {ratio:.1f}× measured"
    else:
        verdict = (f"unlike the {ratio:.1f}× measured, so something else limits one of the caches here (a block "
                   "size that wastes much of each request's last block, or a budget of only a few regions)")
    return (f"**What sets that ratio.** A contiguous region is max_model_len = {s.max_model_len:,} slots whatever "
            f"the request holds; a request of this workload ends at {mean:,.0f} tokens on average, and a paged "
            f"request takes about that. So with both caches full the ratio is about max_model_len ÷ the mean "
            f"request = {expected:.1f}×, {verdict}. The ratio is a property of the setting and the workload (this "
            f"one draws its lengths up to {share_words(LENGTH_DIVISOR)} of max_model_len, so the two move together), "
            "not a constant of paging. " + cited)


def fit_text(fit: FitResult) -> str:
    contiguous, paged = fit.row("contiguous"), fit.row("paged")
    s = fit.settings
    return (
        f"In one {s.budget_bytes / GiB:g} GiB budget, the engine's contiguous cache holds "
        f"**{contiguous.requests_that_fit}** of the {s.requests} requests at once (one {s.max_model_len:,}-slot "
        f"region each; {contiguous.wasted_fraction:.0%} of what they reserve holds no token), the paged cache "
        f"with blocks of {paged.block_size} holds **{paged.requests_that_fit}** ({paged.wasted_fraction:.1%} "
        f"of its reserved blocks empty): "
        + (f"{paged.requests_that_fit / contiguous.requests_that_fit:.1f}× the requests. "
           if contiguous.requests_that_fit else "the contiguous cache holds none. ")
        + ("Every request of the workload fit, so the paged count is capped by the workload, not the budget. "
           if paged.requests_that_fit == s.requests else "")
        + f"More requests at once is a larger decode batch: the throughput that chapter {chapter_number('batching')} "
        "measures.\n\n"
        + ratio_cause_text(fit)
    )


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.cache:
        lines.append(cache_text(result.cache))
    if result.waste:
        lines.append(f"Simulated ({result.waste.settings.describe()}): " + waste_text(result.waste))
    if result.fit:
        lines.append(fit_text(result.fit))
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Tables

CACHE_COLUMNS = [
    Column("mode", "KV mode", "text"), Column("tokens_computed", "tokens computed", "int"),
    Column("flops", "work (TFLOP)", scale=1e-12), Column("seconds", "total (s)"),
    Column("first_decode_s", "first decode steps (ms)", scale=1e3),
    Column("last_decode_s", "last decode steps (ms)", scale=1e3),
]
WASTE_COLUMNS = [
    Column("label", "layout", "text"), Column("used_fraction", "used", "pct"),
    Column("reserved_future_fraction", "reserved for future tokens", "pct"),
    Column("internal_frag_fraction", "internal fragmentation", "pct"),
    Column("external_frag_fraction", "external fragmentation", "pct"),
    Column("wasted_fraction", "wasted (1 − used)", "pct"),
    Column("eol_wasted_fraction", "wasted at end of life", "pct"),
    Column("mean_running", "running at once (mean)"), Column("peak_running", "running at once (peak)", "int"),
    Column("steps", "steps to finish", "int"), Column("preemptions", "preemptions", "int"),
]
FIT_COLUMNS = [
    Column("label", "allocator", "text"), Column("requests_that_fit", "requests that fit at once", "int"),
    Column("capacity_bytes", "KV budget", "bytes"), Column("reserved_bytes", "reserved", "bytes"),
    Column("used_bytes", "holds K/V", "bytes"), Column("wasted_fraction", "reserved, empty", "pct"),
]


def cache_table(cache: CacheResult):
    return people_table(cache.totals(), CACHE_COLUMNS)


def waste_table(waste: WasteResult):
    return people_table(waste.layouts, WASTE_COLUMNS)


def fit_table(fit: FitResult):
    return people_table(fit.rows, FIT_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.cache:
        out["No cache vs KV cache, whole generation"] = cache_table(result.cache)
    if result.waste:
        out["Where KV memory goes, time-averaged (simulated)"] = waste_table(result.waste)
    if result.fit:
        out["Requests that fit at once in the KV budget (the engine's allocators)"] = fit_table(result.fit)
    return out


# ---------------------------------------------------------------------------------------------
# Figures


def cache_figure(cache: CacheResult, source: str):
    """Decode step time vs position, and cumulative work (2 × params × tokens) vs position, per KV mode."""
    from ..figures import subplots

    fig, (left, right) = subplots(1, 2, figsize=(11, 3.8))
    unit, unit_name = (1e12, "TFLOP") if sum(p.flops for p in cache.points) > 1e13 else (1e9, "GFLOP")
    for mode, colour, label in (("nocache", "tab:red", "no cache (recompute all)"),
                                ("paged", "tab:blue", "paged KV cache")):
        decode = cache.steps(mode, "decode")
        left.plot([p.position for p in decode], [p.step_s * 1e3 for p in decode], ".-", color=colour, label=label)
        steps, total = cache.steps(mode), 0.0
        cumulative = []
        for p in steps:
            total += p.flops
            cumulative.append(total / unit)
        right.plot([p.position for p in steps], cumulative, ".-", color=colour, label=label)
    left.set(xlabel="position (tokens in context)", ylabel="decode step (ms)", ylim=(0, None),
             title="time per generated token")
    right.set(xlabel="position (tokens in context)", ylabel=f"cumulative {unit_name} (2 × params × tokens)",
              ylim=(0, None), title="work done so far")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"No cache vs KV cache: {source}", fontsize=10)
    fig.tight_layout()
    return fig


def segments(row: LayoutWaste | AllocatorWaste | FitRow) -> list[tuple[str, str, float]]:
    """(legend, colour, bytes) of each bar segment of one row, in stacking order."""
    if isinstance(row, LayoutWaste):
        return [("holds a token's K/V", "tab:blue", row.used_bytes),
                ("reserved for future tokens", "tab:cyan", row.reserved_future_bytes),
                ("internal fragmentation", "tab:orange", row.internal_frag_bytes),
                ("external fragmentation", "tab:red", row.external_frag_bytes)]
    empty = [("holds a token's K/V", "tab:blue", row.used_bytes), ("reserved, empty", "tab:orange", row.wasted_bytes)]
    if isinstance(row, FitRow):
        return [*empty, ("free, too small for the next request", "lightgrey", row.capacity_bytes - row.reserved_bytes)]
    return empty


def kv_waste_figure(rows: list[LayoutWaste] | list[AllocatorWaste] | list[FitRow], source: str):
    """One stacked horizontal bar per layout: what the KV bytes (GB = 1e9 B) are used for.

    Takes :func:`~infer_lab.analysis.kv_waste.kv_waste_breakdown` rows (used / reserved for
    future tokens / internal / external fragmentation, time-averaged over the run),
    :func:`~infer_lab.bench.kv_allocators.kv_memory_waste` rows (used / reserved-but-empty at the
    end of each request's life) or :class:`FitRow` (the same, plus the budget left free). Each
    segment wide enough is labelled with its share of the bar, and each bar with its wasted fraction.
    """
    from ..figures import subplots

    timeline = bool(rows) and isinstance(rows[0], LayoutWaste)
    filled = bool(rows) and isinstance(rows[0], FitRow)
    labels = [r.label + (f"\n{r.steps:,} steps, {r.peak_running} at once (peak)" if timeline else
                         f"\n{r.requests_that_fit} requests fit" if filled else "") for r in rows]
    totals = [sum(seg[2] for seg in segments(r)) / GB for r in rows]
    fig, ax = subplots(figsize=(8.5, 1.6 + 0.8 * len(rows)))
    left = [0.0] * len(rows)
    for k, (legend, colour, _) in enumerate(segments(rows[0])):  # one segment of every bar at a time
        widths = [segments(r)[k][2] / GB for r in rows]
        ax.barh(range(len(rows)), widths, left=left, color=colour, label=legend)
        for i, width in enumerate(widths):
            if totals[i] and width > 0.05 * max(totals):  # label only segments wide enough to hold it
                ax.text(left[i] + width / 2, i, f"{width / totals[i]:.0%}", ha="center", va="center", fontsize=8)
            left[i] += width
    for i, r in enumerate(rows):
        ax.text(totals[i], i, f" {r.wasted_fraction:.1%} wasted", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()  # first layout on top
    what = ("mean over the run" if timeline else "the whole budget, each request at the end of its life" if filled
            else "at the end of each request's life")
    ax.set(xlabel=f"KV bytes reserved or blocked, {what} (GB)", xlim=(0, max(totals) * 1.35))
    if filled:  # the bars fill the budget: the legend goes below them
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncols=3, fontsize=8, frameon=False)
    else:
        ax.legend(loc="lower right", fontsize=8)
    ax.set_title("KV memory: what the reserved bytes hold, per layout\n" + textwrap.fill(source, 90, break_on_hyphens=False), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def waste_figure(waste: WasteResult):
    return kv_waste_figure(waste.layouts, f"simulated, analytic: {waste.settings.describe()}")


def fit_figure(fit: FitResult):
    return kv_waste_figure(fit.rows, f"the engine's allocators, no model run: {fit.settings.describe()}")


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.cache:
        out["cache"] = cache_figure(result.cache, result.model)
    if result.waste:
        out["waste"] = waste_figure(result.waste)
    if result.fit:
        out["fit"] = fit_figure(result.fit)
    return out


# ---------------------------------------------------------------------------------------------
# Saved GPU results


def saved() -> SavedView | None:
    """No GPU run of this chapter is saved yet: ``None`` (see :func:`gpu_note`)."""
    return None


def gpu_note() -> str:
    """What this chapter shows on a GPU, for a machine without one (markdown)."""
    return (
        "**No saved GPU run of this chapter exists yet**: the time-per-token curve above is from this "
        "machine only. On a GPU this chapter runs a 7B shape over longer contexts "
        f"({sizes('cuda', 'full').prompt_len:,}-token prompts, {sizes('cuda', 'full').new_tokens:,} new tokens), "
        "where recomputing the context makes every no-cache step compute-heavy and the curve bends upward. "
        "The memory parts are analytic and the same on every machine."
    )
