"""Chapter 07, "KV cache and PagedAttention": why the cache exists, and where its memory goes.

1. **No cache vs KV cache** (measured): the same generation through the engine with
   ``kv_mode="nocache"`` (every step recomputes the whole context) and ``kv_mode="paged"``
   (every step computes one token and reads the cached K/V).
2. **Where KV memory goes** (simulated, no model): a mixed workload shares a KV budget under
   three layouts (:mod:`infer_lab.analysis.fragmentation`); every slot of every step is
   classified as used, reserved for future tokens, internal or external fragmentation.
3. **How many requests fit** (the engine's own allocators, no model run): the same workload
   reserved with :class:`~infer_lab.engine.ContiguousKVCache` and
   :class:`~infer_lab.engine.PagedKVCache`, end of life, and how many requests fit at once.

Times are ``time.perf_counter`` around synchronized engine steps (the engine reads each step's
sampled tokens back to the host). Bytes are counted from the allocators or from slot counts ×
the model's K/V bytes per token.
"""

from __future__ import annotations

import math
import random
import textwrap
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..analysis.fragmentation import LAYOUTS, make_layout, make_requests, simulate
from ..analysis.memory import kv_bytes_per_token
from ..engine import ContiguousKVCache, Engine, EngineConfig, PagedKVCache, SamplingParams, Sequence
from ..harness import progress
from ..shape import ModelShape, model_shape
from ..units import GB, GiB
from .chapter import NO_MODEL, ChapterResult, choose_size, run_parts
from .saved import SavedView
from .tables import Column, people_table

NUMBER = "07"
SLUG = "kv_cache_paged"
TITLE = "07 · KV cache and PagedAttention"
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
BYTES_PER_VALUE = {"bf16": 2, "fp32": 4}
STORAGE_DTYPES = {2: torch.bfloat16, 4: torch.float32}


@dataclass(frozen=True)
class WasteSettings:
    """One KV-memory experiment: a model shape, a mixed workload and a KV budget. Analytic: no model runs.

    Prompt and output lengths are drawn log-uniformly up to ``max_model_len // 4`` each
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
        longest = self.max_model_len // 4
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
class LayoutWaste:
    """One layout's KV memory over a simulated run (:func:`kv_waste_breakdown`).

    The four ``*_fraction`` are time-averaged shares of the memory allocated or blocked (they
    sum to 1); the ``*_bytes`` are the same classes' mean over the steps, in bytes.
    ``eol_*`` are summed over requests at the last step of each one's life.
    """

    layout: str
    requests: int
    kv_budget_bytes: int
    max_model_len: int
    max_tokens: int | str | None
    block_size: int | None
    steps: int
    mean_running: float
    peak_running: int
    preemptions: int
    external_frag_steps: int
    used_fraction: float
    reserved_future_fraction: float
    internal_frag_fraction: float
    external_frag_fraction: float
    used_bytes: float
    reserved_future_bytes: float
    internal_frag_bytes: float
    external_frag_bytes: float
    eol_used_bytes: int
    eol_reserved_bytes: int
    eol_wasted_fraction: float

    @property
    def wasted_fraction(self) -> float:
        """The vLLM paper's waste: 1 − used."""
        return 1.0 - self.used_fraction

    @property
    def label(self) -> str:
        return self.layout + (f" (block {self.block_size})" if self.block_size else "")

    def segments(self) -> list[tuple[str, str, float]]:
        """(legend, colour, bytes) of each bar segment, in stacking order."""
        return [("holds a token's K/V", "tab:blue", self.used_bytes),
                ("reserved for future tokens", "tab:cyan", self.reserved_future_bytes),
                ("internal fragmentation", "tab:orange", self.internal_frag_bytes),
                ("external fragmentation", "tab:red", self.external_frag_bytes)]


@dataclass(frozen=True)
class AllocatorWaste:
    """The engine's allocator holding every request at the end of its life (:func:`kv_memory_waste`)."""

    layout: str  # "contiguous" or "paged"
    requests: int
    used_bytes: int
    reserved_bytes: int
    wasted_bytes: int
    wasted_fraction: float
    block_size: int | None
    max_model_len: int

    @property
    def label(self) -> str:
        return self.layout + (f" (block {self.block_size})" if self.block_size else f" ({self.max_model_len:,} slots)")

    def segments(self) -> list[tuple[str, str, float]]:
        return [("holds a token's K/V", "tab:blue", self.used_bytes),
                ("reserved, empty", "tab:orange", self.wasted_bytes)]


@dataclass(frozen=True)
class FitRow:
    """How many of the workload's requests fit at once in a KV budget."""

    layout: str
    kv_budget_bytes: int
    requests_that_fit: int


@dataclass(frozen=True)
class WasteResult:
    settings: WasteSettings
    layouts: list[LayoutWaste]

    def layout(self, name: str) -> LayoutWaste:
        return next(r for r in self.layouts if r.layout == name)


@dataclass(frozen=True)
class FitResult:
    settings: WasteSettings
    eol: list[AllocatorWaste]
    fit: list[FitRow]

    def fits(self, layout: str) -> int:
        return next(r.requests_that_fit for r in self.fit if r.layout == layout)

    def waste(self, layout: str) -> AllocatorWaste:
        return next(r for r in self.eol if r.layout == layout)


@dataclass
class Result(ChapterResult):
    """Chapter 07's results; a part not run is ``None``."""

    model: str = ""
    cache: CacheResult | None = None
    waste: WasteResult | None = None
    fit: FitResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# The workload and the KV arithmetic


def mixed_lengths(n: int, seed: int = 0, max_prompt: int = 512, max_output: int = 512) -> tuple[list[int], list[int]]:
    """A reproducible mixed workload: prompt (8 ..) and output (4 ..) lengths drawn log-uniformly, tokens."""
    rng = random.Random(seed)
    return (
        [int(math.exp(rng.uniform(math.log(8), math.log(max_prompt)))) for _ in range(n)],
        [int(math.exp(rng.uniform(math.log(4), math.log(max_output)))) for _ in range(n)],
    )


def _kv_dtype(bytes_per_value: int) -> str:
    return {v: k for k, v in BYTES_PER_VALUE.items()}[bytes_per_value]


def kv_memory_waste(shape: ModelShape, prompt_lens: list[int], output_lens: list[int], max_model_len: int,
                    block_size: int = 16, bytes_per_value: int = 2) -> list[AllocatorWaste]:
    """Wasted KV memory of a contiguous max-length reservation vs paged blocks, for one workload.

    Each request holds ``prompt + output`` tokens at the end of its life. Contiguous mode reserves
    ``max_model_len`` slots per request (over-reservation + internal waste); paged mode reserves
    whole blocks (waste only in each request's last block). Slot counts come from the engine's
    allocators and their :class:`~infer_lab.engine.KVMemoryReport`; the stores are one element
    wide (no model, next to no memory) and bytes are scaled to the shape's K/V bytes per token.
    :func:`kv_waste_breakdown` follows the same workload over time.
    """
    dtype = STORAGE_DTYPES[bytes_per_value]
    narrow = replace(shape.with_layers(1), kv_heads=1, head_dim=1)
    per_token = kv_bytes_per_token(shape, _kv_dtype(bytes_per_value))
    n = len(prompt_lens)
    seqs = [Sequence(f"r{i}", [0] * p, SamplingParams(max_tokens=o), 0.0)
            for i, (p, o) in enumerate(zip(prompt_lens, output_lens, strict=True))]
    blocks = sum(math.ceil((p + o) / block_size) for p, o in zip(prompt_lens, output_lens, strict=True))
    rows = []
    for name, cache in (("contiguous", ContiguousKVCache(narrow, n, max_model_len, dtype)),
                        ("paged", PagedKVCache(narrow, blocks, block_size, dtype))):
        scale = per_token // cache.bytes_per_token
        for seq, o in zip(seqs, output_lens, strict=True):
            seq.num_computed, seq.block_table, seq.region = 0, [], None
            cache.allocate(seq, seq.num_tokens + o)
            seq.num_computed = seq.num_tokens + o
        report = cache.memory_report(seqs)
        rows.append(AllocatorWaste(name, n, report.used_bytes * scale, report.reserved_bytes * scale,
                                   report.wasted_bytes * scale, report.wasted_fraction,
                                   block_size if name == "paged" else None, max_model_len))
        for seq in seqs:
            cache.free(seq)
    return rows


# StepSlots field -> LayoutWaste field prefix
_WASTE_CLASSES = (("used", "used"), ("future", "reserved_future"), ("internal", "internal_frag"),
                  ("external", "external_frag"))


def kv_waste_breakdown(shape: ModelShape, prompt_lens: list[int], output_lens: list[int], max_model_len: int,
                       kv_budget_bytes: int, max_tokens: int | list[int] | None = 512, block_size: int = 16,
                       arrival_every: float = 1.0, bytes_per_value: int = 2) -> list[LayoutWaste]:
    """KV waste split into over-reservation, internal and external fragmentation, over time.

    The workload runs through :func:`~infer_lab.analysis.fragmentation.simulate` once per layout
    (``contiguous-max``, ``contiguous-exact``, ``paged``) in a shared budget of
    ``kv_budget_bytes // bytes_per_token`` token slots, where ``bytes_per_token = 2 (K and V) ×
    layers × kv_heads × head_dim × bytes_per_value``. Request ``i`` arrives at step
    ``int(i * arrival_every)`` and declares ``max_tokens`` (``None``: exactly its output length).
    Raises ``ValueError`` when one request's reservation exceeds the budget.
    """
    per_token = kv_bytes_per_token(shape, _kv_dtype(bytes_per_value))
    budget_slots = kv_budget_bytes // per_token
    requests = make_requests(prompt_lens, output_lens, max_model_len, max_tokens, arrival_every)
    declared = max_tokens if max_tokens is None or isinstance(max_tokens, int) else "per request"
    rows = []
    for name in LAYOUTS:
        timeline = simulate(make_layout(name, budget_slots, max_model_len, block_size), requests, budget_slots)
        frac, steps = timeline.fractions(), len(timeline.steps)
        running = [s.running for s in timeline.steps]
        classes: dict[str, float] = {}
        for kind, prefix in _WASTE_CLASSES:
            classes[f"{prefix}_fraction"] = frac[kind]
            classes[f"{prefix}_bytes"] = timeline.total(kind) / steps * per_token
        rows.append(LayoutWaste(
            layout=name, requests=len(requests), kv_budget_bytes=budget_slots * per_token,
            max_model_len=max_model_len, max_tokens=declared, block_size=block_size if name == "paged" else None,
            steps=steps, mean_running=sum(running) / steps, peak_running=max(running),
            preemptions=timeline.preemptions, external_frag_steps=sum(1 for s in timeline.steps if s.external),
            eol_used_bytes=timeline.eol_used * per_token, eol_reserved_bytes=timeline.eol_reserved * per_token,
            eol_wasted_fraction=1.0 - timeline.eol_used / timeline.eol_reserved, **classes,
        ))
    return rows


def requests_that_fit(shape: ModelShape, kv_budget_bytes: int, prompt_lens: list[int], output_lens: list[int],
                      max_model_len: int, block_size: int = 16, bytes_per_value: int = 2) -> list[FitRow]:
    """How many of the requests (in order) fit at once in a KV budget: contiguous reservation vs paged blocks."""
    per_token = kv_bytes_per_token(shape, _kv_dtype(bytes_per_value))
    budget_tokens = kv_budget_bytes // per_token
    contiguous = min(len(prompt_lens), budget_tokens // max_model_len)
    blocks, fit = budget_tokens // block_size, 0
    for p, o in zip(prompt_lens, output_lens, strict=True):
        need = math.ceil((p + o) / block_size)
        if need > blocks:
            break
        blocks -= need
        fit += 1
    return [FitRow("contiguous", kv_budget_bytes, contiguous), FitRow("paged", kv_budget_bytes, fit)]


# ---------------------------------------------------------------------------------------------
# Measurements


def measure_cache(lm: Any, sizes: Sizes) -> CacheResult:
    """The same prompt and generation without a cache and with a paged KV cache, step by step.

    Each mode runs once as a warm-up (a 4-token prompt), then on a fresh engine with the
    prompt of ``sizes.prompt_len`` random tokens, generating ``sizes.new_tokens`` (EOS ignored).
    """
    prompt = lm.random_ids(1, sizes.prompt_len, seed=7)[0].tolist()
    params = sum(p.numel() for p in lm.model.parameters())
    points = []
    for mode in progress(("nocache", "paged"), desc="no cache, then a KV cache"):
        config = EngineConfig(kv_mode=mode, max_num_seqs=1, max_model_len=sizes.prompt_len + sizes.new_tokens + 1)
        Engine.from_loaded(lm, config).generate([prompt[:4]], SamplingParams(max_tokens=2, ignore_eos=True))
        engine = Engine.from_loaded(lm, config)
        if engine.decode_runner is not None:  # on a GPU: capture the graphs before timing
            engine.decode_runner.capture_all()
        engine.generate([prompt], SamplingParams(max_tokens=sizes.new_tokens, ignore_eos=True))
        points += [StepPoint(mode, i, sizes.prompt_len + i, rec.duration_s, rec.num_tokens, 2 * params * rec.num_tokens)
                   for i, rec in enumerate(engine.step_log)]
    return CacheResult(points, sizes.prompt_len, sizes.new_tokens, params)


def measure_waste(settings: WasteSettings) -> WasteResult:
    """The workload of ``settings`` simulated under every layout (slot counts; no model, no hardware)."""
    prompts, outputs = settings.lengths()
    return WasteResult(settings, kv_waste_breakdown(
        settings.shape, prompts, outputs, settings.max_model_len, settings.budget_bytes,
        max_tokens=settings.max_tokens, block_size=settings.block_size, bytes_per_value=settings.bytes_per_value))


def waste_problem(settings: WasteSettings) -> str | None:
    """Why ``settings`` cannot be simulated (one request needs more than the whole budget), or None."""
    prompts, outputs = settings.lengths()
    per_token = kv_bytes_per_token(settings.shape, settings.kv_dtype)
    budget_slots = settings.budget_bytes // per_token
    try:
        requests = make_requests(prompts, outputs, settings.max_model_len, settings.max_tokens)
        for name in LAYOUTS:
            layout = make_layout(name, budget_slots, settings.max_model_len, settings.block_size)
            worst = max(layout.need(r, r.final_len) for r in requests)
            if worst > budget_slots:
                return (f"with {name}, one request needs {worst:,} token slots ({worst * per_token / GiB:.2f} GiB) "
                        f"and the budget holds {budget_slots:,} ({settings.budget_bytes / GiB:g} GiB)")
    except ValueError as err:
        return str(err)
    return None


def measure_fit(settings: WasteSettings) -> FitResult:
    """The workload reserved by the engine's allocators (end of life), and how many requests fit at once."""
    prompts, outputs = settings.lengths()
    shape, bpv = settings.shape, settings.bytes_per_value
    return FitResult(
        settings,
        kv_memory_waste(shape, prompts, outputs, settings.max_model_len, settings.block_size, bpv),
        requests_that_fit(shape, settings.budget_bytes, prompts, outputs, settings.max_model_len,
                          settings.block_size, bpv),
    )


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "cache": lambda: measure_cache(lm, sizes),
        "waste": lambda: measure_waste(sizes.waste),
        "fit": lambda: measure_fit(sizes.waste),
    })


# ---------------------------------------------------------------------------------------------
# Words


def cache_text(cache: CacheResult) -> str:
    nocache, paged = cache.totals()
    last_nc, last_p = cache.steps("nocache")[-1], cache.steps("paged")[-1]
    return (
        f"Both runs prefill the same {cache.prompt_len}-token prompt (step 0) and generate "
        f"{cache.new_tokens} tokens. Without a cache the last step recomputed **{last_nc.tokens_computed} tokens**, "
        f"with it **{last_p.tokens_computed}**: {nocache.tokens_computed:,} tokens computed in all against "
        f"{paged.tokens_computed:,} ({nocache.flops / paged.flops:.1f}× the FLOPs). The decode step went from "
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


def fit_text(fit: FitResult) -> str:
    contiguous, paged = fit.waste("contiguous"), fit.waste("paged")
    s = fit.settings
    return (
        f"Held by the engine's own allocators at the end of their lives, the {s.requests} requests use "
        f"{paged.used_bytes / GB:.2f} GB of K/V. A {s.max_model_len:,}-slot region each reserves "
        f"{contiguous.reserved_bytes / GB:.2f} GB ({contiguous.wasted_fraction:.0%} empty); blocks of "
        f"{paged.block_size} reserve {paged.reserved_bytes / GB:.2f} GB ({paged.wasted_fraction:.1%} empty). "
        f"In a {s.budget_bytes / GiB:g} GiB budget, **{fit.fits('contiguous')}** of them fit at once with "
        f"contiguous regions and **{fit.fits('paged')}** with paged blocks."
    )


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {result.threads} torch threads."]
    if result.cache:
        lines.append(cache_text(result.cache))
    if result.waste:
        lines.append(f"Simulated ({result.waste.settings.describe()}): " + waste_text(result.waste))
    if result.fit:
        lines.append(fit_text(result.fit))
    if result.waste and result.fit:
        sim, eng = result.waste.layout("paged"), result.fit.waste("paged")
        agree = sim.eol_reserved_bytes == eng.reserved_bytes
        lines.append(f"At end of life the simulation and the engine's block pool {'agree' if agree else 'DISAGREE'}: "
                     f"{sim.eol_reserved_bytes / GB:.3f} GB vs {eng.reserved_bytes / GB:.3f} GB reserved.")
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
EOL_COLUMNS = [
    Column("label", "allocator", "text"), Column("used_bytes", "holds K/V", "bytes"),
    Column("reserved_bytes", "reserved", "bytes"), Column("wasted_fraction", "reserved, empty", "pct"),
]
FIT_COLUMNS = [
    Column("layout", "allocator", "text"), Column("kv_budget_bytes", "KV budget", "bytes"),
    Column("requests_that_fit", "requests that fit at once", "int"),
]


def cache_table(cache: CacheResult):
    return people_table(cache.totals(), CACHE_COLUMNS)


def waste_table(waste: WasteResult):
    return people_table(waste.layouts, WASTE_COLUMNS)


def eol_table(fit: FitResult):
    return people_table(fit.eol, EOL_COLUMNS)


def fit_table(fit: FitResult):
    return people_table(fit.fit, FIT_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.cache:
        out["No cache vs KV cache, whole generation"] = cache_table(result.cache)
    if result.waste:
        out["Where KV memory goes, time-averaged (simulated)"] = waste_table(result.waste)
    if result.fit:
        out["The engine's allocators at the end of every request's life"] = eol_table(result.fit)
        out["Requests that fit at once in the KV budget"] = fit_table(result.fit)
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


def kv_waste_figure(rows: list[LayoutWaste] | list[AllocatorWaste], source: str):
    """One stacked horizontal bar per layout: what the KV bytes (GB = 1e9 B) are used for.

    Takes :func:`kv_waste_breakdown` rows (used / reserved for future tokens / internal /
    external fragmentation, time-averaged over the run) or :func:`kv_memory_waste` rows (used /
    reserved-but-empty at the end of each request's life). Each segment wide enough is labelled
    with its share of the bar, and each bar with its wasted fraction.
    """
    from ..figures import subplots

    timeline = bool(rows) and isinstance(rows[0], LayoutWaste)
    labels = [r.label + (f"\n{r.steps:,} steps, {r.peak_running} at once (peak)" if timeline else "") for r in rows]
    totals = [sum(seg[2] for seg in r.segments()) / GB for r in rows]
    fig, ax = subplots(figsize=(8.5, 1.6 + 0.8 * len(rows)))
    left = [0.0] * len(rows)
    for k, (legend, colour, _) in enumerate(rows[0].segments()):  # one segment of every bar at a time
        widths = [r.segments()[k][2] / GB for r in rows]
        ax.barh(range(len(rows)), widths, left=left, color=colour, label=legend)
        for i, width in enumerate(widths):
            if totals[i] and width > 0.05 * max(totals):  # label only segments wide enough to hold it
                ax.text(left[i] + width / 2, i, f"{width / totals[i]:.0%}", ha="center", va="center", fontsize=8)
            left[i] += width
    for i, r in enumerate(rows):
        ax.text(totals[i], i, f" {r.wasted_fraction:.1%} wasted", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()  # first layout on top
    what = "mean over the run" if timeline else "at the end of each request's life"
    ax.set(xlabel=f"KV bytes reserved or blocked, {what} (GB)", xlim=(0, max(totals) * 1.35))
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("KV memory: what the reserved bytes hold, per layout\n" + textwrap.fill(source, 90, break_on_hyphens=False), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def waste_figure(waste: WasteResult):
    return kv_waste_figure(waste.layouts, f"simulated, analytic: {waste.settings.describe()}")


def fit_figure(fit: FitResult):
    return kv_waste_figure(fit.eol, f"the engine's allocators, analytic (no model run): {fit.settings.describe()}")


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
