"""Chapter 01, "Foundations": the loop, where one token's FLOPs are, memory levels, why decode waits.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/01_foundations.py`` that call the engine's pieces, :mod:`infer_lab.analysis` and
:mod:`infer_lab.bench` directly, called from the page's visible cells. This module sizes them,
draws and describes what they return, and runs the very same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

0. **Why inference cost matters** (cited and analytic, no button): the opener's token volumes,
   what a month of them costs and why batching makes tokens cheaper, from
   :mod:`infer_lab.course.opener` (the deck's opener slides use the same functions), after the
   learner's guess of the latest volume's average tokens per second (:func:`rate_guess_text`).
1. **The loop** (counted; ``generate_step_by_step``): tokenize, embed, every decoder layer, the
   LM head's logits, a greedy choice, append; one full forward pass per token (no KV cache), with
   the engine's greedy tokens beside it.
2. **Where the FLOPs are** (analytic; ``flop_shares``): one decode step's FLOPs by component for
   the learner's model and a 7B of the catalog, against the "95 % in the layers" rule of thumb.
3. **Bandwidth by working set** (measured; ``bandwidth_curve``): copies from a few KiB to beyond
   the last cache, GB/s against the working set, the cache sizes marked.
   Beside it, a GPU's two levels as the talks drew them (HBM and on-chip SRAM) with catalog
   figures (:func:`gpu_memory_text`, chapter 04's ``hierarchy_text``).
4. **Why decode waits on memory** (predicted, then measured; ``decode_prediction`` and
   ``decode_measured``): first the share of a datasheet GPU's decode step spent waiting on memory
   (:func:`gpu_decode_wait_text`, chapter 04's ``decode_wait_text``), then a decode step's bytes /
   measured bandwidth against its FLOPs / measured FLOP/s on this machine, then the engine's own
   step beside the prediction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.compare import dtype_name, shape_of
from ..analysis.flops import COMPONENTS, ComponentFlops
from ..analysis.roofline import StepPrediction, decode_ops
from ..bench.bandwidth import GIB, KIB, MIB, BandwidthPoint, CacheLevel, cache_levels
from ..figures import finish, subplots
from ..hardware import device_label
from ..shape import ModelShape, model_shape
from ..units import count, fmt_bytes, human
from .chapter import NO_MODEL, ChapterResult, chapter_number, check_machine, choose_size, run_parts
from .notebook_code import notebook_function
from .opener import TITLE as OPENER_TITLE  # noqa: F401 - the part this chapter opens with (build_self_paced)
from .opener import TokenVolume, tokens_in_words
from .saved import SavedView
from .tables import Column, people_table

NUMBER = "01"
SLUG = "foundations"
TITLE = "01 · Foundations: the loop, where the FLOPs are, memory levels, why decode waits on memory"
NEEDS_MODEL = True
PARTS = {
    "loop": "Run the loop, one token at a time",
    "flops": "Count one token's FLOPs by component",
    "bandwidth": "Measure bandwidth across working-set sizes",
    "decode": "Time one decode step",
}
ANALYTIC_PARTS = ("flops",)  # counted from configs: runs without a model (the deck's saved-only build)
SEVEN_B = "mistral-7b"  # the catalog's 7B, next to the learner's model
SMALL = "smollm2-135m"  # shown instead when the learner's model is that 7B
RULE_OF_THUMB = 0.95  # "about 95 % of the compute is in the layers"


@dataclass(frozen=True)
class Sizes:
    """The prompt and tokens of the loop, the context of the FLOP count, the copies, the decode step."""

    size: str
    loop_prompt: str
    loop_new_tokens: int
    flops_context: int  # tokens the new token attends to
    bw_smallest: int  # working set in bytes (source + destination)
    bw_largest: int
    bw_repeats: int  # timed samples per working set
    decode_context: int  # prompt tokens before the timed decode steps
    decode_steps: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` fits a 2-core CPU in well under a minute per part; ``full`` is what a GPU gets."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    prompt = "The capital of France is"
    if on_gpu:
        if size == "quick":
            return Sizes(size, prompt, 6, 1024, 256 * KIB, 1 * GIB, 9, 512, 8)
        return Sizes(size, prompt, 8, 1024, 64 * KIB, 4 * GIB, 15, 1024, 16)
    if size == "quick":
        return Sizes(size, prompt, 6, 1024, 64 * KIB, 256 * MIB, 9, 128, 8)
    return Sizes(size, prompt, 8, 1024, 16 * KIB, 1 * GIB, 15, 512, 16)


# ---------------------------------------------------------------------------------------------
# Part 0: why inference cost matters (the experiment is infer_lab.course.opener, shown in the cell)

GUESS_WITHIN = 2.0  # a guess within this factor of the answer reads "close"


def rate_guess_text(guess_tokens_per_s: float | None, volume: TokenVolume) -> str:
    """The learner's guess of ``volume``'s average tokens per second against the real average.

    ``guess_tokens_per_s`` in tokens/s (``None`` or 0: no guess); the average is the monthly
    volume over a 30.44-day month (:attr:`TokenVolume.tokens_per_s`).
    """
    rate = volume.tokens_per_s
    answer = (f"{volume.qualifier.capitalize()} {tokens_in_words(volume.value)} tokens a month is "
              f"**{volume.qualifier} {tokens_in_words(rate)} tokens per second** on average, day and night.")
    if not guess_tokens_per_s:
        return answer
    ratio = rate / guess_tokens_per_s
    if 1 / GUESS_WITHIN <= ratio <= GUESS_WITHIN:
        verdict = f"your guess is within {human(GUESS_WITHIN)}× of it: close."
    elif ratio > 1:
        verdict = f"the real rate is **{human(ratio, 2)}× higher** than your guess."
    else:
        verdict = f"the real rate is **{human(1 / ratio, 2)}× lower** than your guess."
    return f"You guessed **{tokens_in_words(guess_tokens_per_s)} tokens per second**. {answer} So {verdict}"


# ---------------------------------------------------------------------------------------------
# Part 1: the loop (the experiment is the notebook's `generate_step_by_step`)


@dataclass(frozen=True)
class LoopResult:
    """The loop's steps (shapes and the chosen token of each forward pass) and the engine's tokens."""

    model: str
    prompt: str
    prompt_ids: tuple[int, ...]
    steps: list[dict[str, Any]]  # {"input": (tokens,), "hidden": (tokens, hidden), "logits": (vocab,), "token": id}
    engine_tokens: tuple[int, ...]
    pieces: tuple[str, ...] | None  # each chosen token as text; None without a tokenizer
    random_weights: bool

    @property
    def tokens(self) -> tuple[int, ...]:
        return tuple(s["token"] for s in self.steps)

    @property
    def same_as_engine(self) -> bool:
        return self.tokens == self.engine_tokens

    @property
    def first_difference(self) -> int | None:
        """The first step (0-based) where the loop and the engine chose different tokens."""
        return next((i for i, (a, b) in enumerate(zip(self.tokens, self.engine_tokens, strict=False)) if a != b),
                    None if len(self.tokens) == len(self.engine_tokens) else min(len(self.tokens), len(self.engine_tokens)))


NO_TOKENIZER = ("**This model has no tokenizer** (random weights): the prompt's words were mapped to fixed token ids, "
                "one per word (`lm.word_ids`), and the loop shows token ids instead of text. Random weights also "
                "choose meaningless tokens; the loop, the shapes and the passes are the same.")


def prompt_ids(lm: Any, prompt: str) -> list[int]:
    """Tokenize ``prompt``; without a tokenizer, one fixed id per word (what the notebook's cell does)."""
    return lm.tokenizer.encode(prompt) if lm.tokenizer else lm.word_ids(prompt)[0].tolist()


def loop_question(lm: Any, prompt: str) -> str:
    """Part 1's prediction question, with the prompt's length counted by ``lm``'s own tokenizer
    (without one, one id per word), so the learner can answer it before running the cell."""
    count = len(prompt_ids(lm, prompt))
    unit = "tokens for this model's tokenizer" if lm.tokenizer else "token ids (no tokenizer: one per word)"
    return (f"**Predict first:** the cell below writes `new_tokens` tokens (set in the cell) after the prompt "
            f"\"{prompt}\", which is **{count} {unit}**. In its last pass, how many tokens go through every "
            "layer? How long is each pass's logits vector, for this model?")


def loop_result(lm: Any, prompt: str, ids: list[int], steps: list[dict[str, Any]], engine_tokens: list[int]) -> LoopResult:
    """The notebook's loop and engine outputs, with the chosen tokens as text where there is a tokenizer."""
    tokens = [s["token"] for s in steps]
    pieces = tuple(lm.tokenizer.decode([t]) for t in tokens) if lm.tokenizer is not None else None
    return LoopResult(lm.describe(), prompt, tuple(ids), [dict(s) for s in steps], tuple(engine_tokens), pieces,
                      bool(lm.is_random))


def run_loop(lm: Any, sizes: Sizes) -> LoopResult:
    """Run the notebook's own loop (``generate_step_by_step``) and the engine's greedy tokens."""
    loop, engine = notebook_function(NUMBER, "generate_step_by_step"), notebook_function(NUMBER, "engine_greedy")
    ids = prompt_ids(lm, sizes.loop_prompt)
    return loop_result(lm, sizes.loop_prompt, ids, loop(lm, ids, sizes.loop_new_tokens),
                       engine(lm, ids, sizes.loop_new_tokens))


def _shape(s: tuple[int, ...]) -> str:
    return "(" + ", ".join(f"{n:,}" for n in s) + ")"


def loop_rows(loop: LoopResult) -> list[dict[str, Any]]:
    rows = []
    for i, s in enumerate(loop.steps):
        rows.append({"step": i + 1, "input": _shape(s["input"]), "hidden": _shape(s["hidden"]),
                     "logits": _shape(s["logits"]), "token": s["token"],
                     "text": repr(loop.pieces[i]) if loop.pieces is not None else "— (no tokenizer)",
                     "engine": loop.engine_tokens[i] if i < len(loop.engine_tokens) else None})
    return rows


LOOP_COLUMNS = [
    Column("step", "pass", "int"), Column("input", "token ids in (shape)", "text"),
    Column("hidden", "after the layers (shape)", "text"), Column("logits", "logits (shape)", "text"),
    Column("token", "chosen token id", "int"), Column("text", "as text", "text"),
    Column("engine", "the engine's token", "int"),
]


def loop_table(loop: LoopResult):
    return people_table(loop_rows(loop), LOOP_COLUMNS)


def loop_text(loop: LoopResult) -> str:
    """How many passes, how much text each re-read, what was written, and whether the engine agrees."""
    n, first, last = len(loop.steps), loop.steps[0]["input"][0], loop.steps[-1]["input"][0]
    vocab = loop.steps[0]["logits"][0]
    wrote = (f"It wrote {''.join(loop.pieces)!r} after {loop.prompt!r}." if loop.pieces is not None
             else f"It chose the token ids {list(loop.tokens)}.")
    lines = [] if loop.pieces is not None else [NO_TOKENIZER]
    lines += [f"**{n} tokens took {n} forward passes.** Each pass ran the whole text through every layer again: "
             f"{first} tokens in the first, {last} in the last. Each pass's logits hold {vocab:,} scores, one per "
             f"vocabulary entry, and only the last position's are needed. {wrote}"]
    if loop.same_as_engine:
        lines.append(f"The engine, with its KV cache and one decode step per token, chose **the same {n} tokens**: "
                     "the plain loop is the real computation; the cache only avoids redoing the earlier tokens.")
    else:
        i = loop.first_difference
        why = (" On random weights the top two scores are often nearly tied, so a different order of additions "
               "(the engine's cached, fused kernels) can pick the other one." if loop.random_weights else
               " With real weights this should not happen: report it.")
        lines.append(f"The engine's greedy tokens **differ from pass {i + 1} on** ({list(loop.engine_tokens)})." + why)
    return " ".join(lines)


# ---------------------------------------------------------------------------------------------
# Part 2: where the FLOPs are (the experiment is the notebook's `flop_shares`)


def _same_shape(a: ModelShape, b: ModelShape) -> bool:
    keys = ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def flops_models(lm: Any) -> list[Any]:
    """The learner's model (its shape, named as loaded) and the catalog's 7B; the small embedded model
    instead when the learner's model already has the 7B's shape (the GPU default). Without a model
    (``lm=None``), the embedded model's catalog entry and the 7B."""
    if lm is None:
        return [SMALL, SEVEN_B]
    mine = dataclasses.replace(shape_of(lm), name=lm.name)
    other = SMALL if _same_shape(mine, model_shape(SEVEN_B)) else SEVEN_B
    return [mine, other]


def run_flops(lm: Any, sizes: Sizes) -> list[ComponentFlops]:
    """Run the notebook's own count (``flop_shares``) for the learner's model and the catalog's other one."""
    return notebook_function(NUMBER, "flop_shares")(flops_models(lm), sizes.flops_context)


COLOURS = {"embedding": "0.6", "attention projections": "tab:blue", "attention scores": "tab:cyan",
           "MLP": "tab:green", "norms": "tab:purple", "LM head": "tab:orange"}


def flops_figure(shares: list[ComponentFlops]):
    """One stacked bar per model: the share of one decode step's FLOPs in each component."""
    fig, ax = subplots(figsize=(8, 1.1 * len(shares) + 1.9))
    names = [s.model for s in shares]
    left = [0.0] * len(shares)
    for c in COMPONENTS:
        widths = [100 * s.share(c) for s in shares]
        label = c + (" (a lookup: 0)" if c == "embedding" else "")
        ax.barh(names, widths, left=left, color=COLOURS[c], label=label)
        for i, w in enumerate(widths):
            if w >= 6:
                ax.text(left[i] + w / 2, i, f"{human(w, 2)} %", ha="center", va="center", fontsize=8, color="white")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.axvline(100 * RULE_OF_THUMB, color="k", ls="--", lw=1)
    ax.text(100 * RULE_OF_THUMB, -0.5, "95 % rule ", fontsize=8, va="bottom", ha="right")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("% of one decode step's FLOPs (batch 1)")
    ax.set_title(f"Where one token's FLOPs are, at {shares[0].context:,} tokens of context: counted from the "
                 "config, no hardware", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, frameon=False)
    finish(fig)
    return fig


def flops_text(shares: list[ComponentFlops], guess_pct: float | None = None) -> str:
    """Each model's share in the layers against the 95 % rule, and the learner's guess beside the first."""
    lines = []
    mine = shares[0]
    if guess_pct is not None:
        lines.append(f"You guessed **{human(guess_pct)} %**; for {mine.model} it is **{human(100 * mine.layers_share)} %**.")
    for s in shares:
        holds = ("the rule of thumb holds for it" if s.layers_share >= RULE_OF_THUMB else
                 "the rule of thumb does not hold for it")
        lines.append(
            f"**{s.model}**: {human(s.total / 1e9)} GFLOP per token at {s.context:,} tokens of context, "
            f"**{human(100 * s.layers_share)} %** in the layers, {human(100 * s.share('LM head'))} % in the LM head: "
            f"{holds}.")
    small = min(shares, key=lambda s: s.layers_share)
    if small.layers_share < RULE_OF_THUMB:
        lines.append(f"The LM head does the same work per token whatever the depth: vocabulary × hidden "
                     f"multiply-adds. In {small.model} the layers are small next to its vocabulary matrix, so the "
                     "head's share is large; in a 7B the layers dwarf it. Attention over the cache is the only part "
                     "that grows with the context: raise `context` in the cell and watch it take a larger share.")
    return " ".join(lines)


def flops_rows(shares: list[ComponentFlops]) -> list[dict[str, Any]]:
    rows = []
    for c in COMPONENTS:
        row: dict[str, Any] = {"component": c}
        for i, s in enumerate(shares):
            row[f"gflop{i}"], row[f"share{i}"] = s.flops[c] / 1e9, s.share(c)
        rows.append(row)
    row = {"component": "in the layers (projections, scores, MLP, norms)"}
    for i, s in enumerate(shares):
        row[f"gflop{i}"], row[f"share{i}"] = s.layers / 1e9, s.layers_share
    return [*rows, row]


def flops_table(shares: list[ComponentFlops]):
    columns = [Column("component", "component", "text")]
    for i, s in enumerate(shares):
        columns += [Column(f"gflop{i}", f"{s.model}: GFLOP per token"), Column(f"share{i}", f"{s.model}: share", "pct")]
    return people_table(flops_rows(shares), columns)


# ---------------------------------------------------------------------------------------------
# Part 3: bandwidth across working sets (the experiment is the notebook's `bandwidth_curve`)


@dataclass(frozen=True)
class BandwidthResult:
    device_type: str  # "cpu" or "cuda"
    device: str
    threads: int  # torch threads of the copies (1 on a CPU: see infer_lab.bench.bandwidth)
    points: list[BandwidthPoint]
    levels: list[CacheLevel]


def _binary(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{human(n / size)} {unit}"
    return f"{n} B"


def levels_text(device: Any = None) -> str:
    """The device's caches (default: the GPU when there is one, else the CPU), as the operating system
    (or torch) reports them: the page's prediction."""
    dev = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    levels = cache_levels(dev)
    where = "torch" if dev.type == "cuda" else "the operating system"
    if not levels:
        return f"{device_label(dev)} does not report its cache sizes here."
    listed = ", ".join(f"{c.name} {_binary(c.size_bytes)}" + ("" if dev.type == "cuda" else
                                                              (" shared" if c.shared else " per core"))
                       for c in levels)
    return f"{device_label(dev)} has these data caches ({where} says so): {listed}."


def gpu_memory_text() -> str:
    """A GPU's two memory levels, HBM and on-chip SRAM (shared memory), in sizes and bandwidths from
    the catalog: chapter 04's ``hierarchy_text`` for the GPU its deck slides use."""
    from . import ch04_prefill_decode_roofline as ch04

    gpu = ch04.sizes("cpu", "quick").gpu
    return ch04.hierarchy_text(ch04.hierarchy_rows([gpu]), gpu)


def gpu_decode_wait_text() -> str:
    """How much of a batch-1 decode step a datasheet GPU's compute units spend waiting on memory:
    chapter 04's ``decode_wait_text`` for the model, GPU and context of its deck slides."""
    from . import ch04_prefill_decode_roofline as ch04

    s = ch04.sizes("cpu", "quick")
    return ch04.decode_wait_text(s.model, s.gpu, s.context)


def run_bandwidth(lm: Any, sizes: Sizes) -> BandwidthResult:
    """Run the notebook's own sweep (``bandwidth_curve``) on the model's device."""
    points = notebook_function(NUMBER, "bandwidth_curve")(lm.device, sizes.bw_smallest, sizes.bw_largest,
                                                          sizes.bw_repeats)
    return bandwidth_result(points, lm.device)


def bandwidth_result(points: list[BandwidthPoint], device: Any) -> BandwidthResult:
    dev = torch.device(device)
    return BandwidthResult(dev.type, device_label(dev), 1 if dev.type == "cpu" else 0, list(points), cache_levels(dev))


def bandwidth_figure(points: list[BandwidthPoint], device: Any):
    """GB/s against the working set (log axis), the spread of the samples shaded, the caches marked."""
    result = bandwidth_result(points, device)
    fig, ax = subplots(figsize=(8, 4.2))
    xs = [p.working_set_bytes for p in points]
    ax.plot(xs, [p.GBps for p in points], "o-", label="median of the samples")
    ax.fill_between(xs, [p.GBps_low for p in points], [p.GBps_high for p in points], alpha=0.2,
                    label="slowest to fastest sample")
    top = max(p.GBps_high for p in points)
    for c in result.levels:
        if xs[0] <= c.size_bytes <= xs[-1] * 2:
            ax.axvline(c.size_bytes, color="0.4", ls="--", lw=1)
            ax.text(c.size_bytes, top * 1.02, f" {c.name} {_binary(c.size_bytes)}", fontsize=8, rotation=90,
                    va="top", ha="right")
    ax.set_xscale("log", base=2)
    ticks = xs[::2]
    ax.set_xticks(ticks, [_binary(x) for x in ticks], fontsize=8, rotation=30)
    ax.minorticks_off()
    ax.set_ylim(0, top * 1.1)
    ax.set(xlabel="working set (source + destination)", ylabel="copy bandwidth (GB/s, read + written)")
    threads = f", {result.threads} thread" if result.threads else ""
    ax.set_title(f"Copy bandwidth by working set: {result.device}{threads}, fp32 buffers", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    finish(fig)
    return fig


def bandwidth_text(points: list[BandwidthPoint], device: Any) -> str:
    """The fastest level, the largest working set, the drop between them; every number from the points."""
    result = bandwidth_result(points, device)
    best = max(points, key=lambda p: p.GBps)
    last = points[-1]
    fall = next((p for p in points if p.working_set_bytes > best.working_set_bytes and p.GBps < 0.6 * best.GBps), None)
    lines = [f"The fastest copies ran at **{human(best.GBps)} GB/s** with a working set of "
             f"{_binary(best.working_set_bytes)}; at the largest, {_binary(last.working_set_bytes)}, they ran at "
             f"**{human(last.GBps)} GB/s**, {human(best.GBps / last.GBps)}× slower."]
    if fall is not None:
        below = [c for c in result.levels if c.size_bytes < fall.working_set_bytes]
        above = [c for c in result.levels if c.size_bytes >= fall.working_set_bytes]
        named = [f"the {c.name} ({_binary(c.size_bytes)})" for c in (below[-1:] + above[:1])]
        where = (f", between {named[0]} and {named[1]}" if below and above else
                 f", beyond {named[0]}" if below else f", within {named[0]}" if above else "")
        lines.append(f"The curve first falls below 60 % of its peak at {_binary(fall.working_set_bytes)}{where}: "
                     "compare with the cache sizes above (on a busy machine one slow point can come early).")
    if result.threads:
        lines.append(f"One thread, so this is one core's view of {result.device}: more threads move more bytes per "
                     "second from main memory (the ceilings of part 4 use every thread). At the smallest sizes each "
                     "copy lasts well under a microsecond and torch's fixed cost per call is part of the time, so "
                     "they read lower than the cache could do.")
    else:
        lines.append("On a GPU the smallest copies are too short to fill the chip, and each is a kernel launch: "
                     "they read low for that reason, not because the L2 is slow.")
    lines.append(f"Each point: the median of {points[0].samples} timed samples after a warm-up. "
                 + check_machine().text())
    return " ".join(lines)


BANDWIDTH_COLUMNS = [
    Column("working_set_bytes", "working set (bytes)", "bytes"), Column("GBps", "GB/s (median)"),
    Column("GBps_low", "GB/s (slowest sample)"), Column("GBps_high", "GB/s (fastest sample)"),
    Column("copies_per_sample", "copies per sample", "int"),
]


def bandwidth_table(result: BandwidthResult):
    return people_table(result.points, BANDWIDTH_COLUMNS)


# ---------------------------------------------------------------------------------------------
# Part 4: why decode waits on memory (the experiments are `decode_prediction` and `decode_measured`)


@dataclass(frozen=True)
class DecodeResult:
    context: int
    step: StepPrediction  # the prediction at `context`, on the ceilings measured here
    weight_bytes: float
    kv_bytes: float
    measured: dict[str, Any]  # a row of infer_lab.bench.predicted.decode_step_predicted_vs_measured


def run_decode(lm: Any, sizes: Sizes) -> DecodeResult:
    """Run the notebook's own prediction (``decode_prediction``) and measurement (``decode_measured``)."""
    step = notebook_function(NUMBER, "decode_prediction")(lm, sizes.decode_context, quick=sizes.size == "quick")
    row = notebook_function(NUMBER, "decode_measured")(lm, sizes.decode_context, sizes.decode_steps, step.roof)
    weights, kv = byte_split(lm, sizes.decode_context)
    return DecodeResult(sizes.decode_context, step, weights, kv, row)


def byte_split(lm: Any, context: int) -> tuple[float, float]:
    """(weight bytes, KV bytes read) of one batch-1 decode step of ``lm`` at ``context`` tokens."""
    d = dtype_name(lm)
    ops = decode_ops(shape_of(lm), 1, context, weight_dtype=d, kv_dtype=d, act_dtype=d)
    return sum(o.weight_bytes for o in ops), sum(o.kv_read_bytes for o in ops)


def _times_ms(step: StepPrediction) -> tuple[float, float]:
    """(bytes / bandwidth, FLOPs / FLOP/s) of the whole step, in ms."""
    return 1e3 * step.bytes / step.roof.bandwidth_Bps, 1e3 * step.flops / step.roof.peak_flops


def budget_figure(step: StepPrediction, source: str = ""):
    """Two bars: the step's time if only its bytes counted, and if only its FLOPs did."""
    memory_ms, compute_ms = _times_ms(step)
    fig, ax = subplots(figsize=(7.5, 2.4))
    labels = ["bytes / bandwidth", "FLOPs / FLOP/s"]
    ax.barh(labels, [memory_ms, compute_ms], color=["tab:red", "tab:blue"])
    for i, v in enumerate((memory_ms, compute_ms)):
        ax.text(v, i, f" {human(v)} ms", va="center", fontsize=9)
    ax.set_xlim(0, max(memory_ms, compute_ms) * 1.3)
    ax.invert_yaxis()
    ax.set_xlabel("ms for one decode step at batch 1 (predicted)")
    ax.set_title(f"What one decode step must wait for, on {step.roof.name}" + (f"\n{source}" if source else ""),
                 fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    finish(fig)
    return fig


def budget_text(step: StepPrediction, split: tuple[float, float] | None = None) -> str:
    """The prediction in words: bytes (``split``: weights and KV, from :func:`byte_split`), FLOPs, both
    times, their ratio, intensity against the ridge."""
    memory_ms, compute_ms = _times_ms(step)
    parts = (f"{fmt_bytes(split[0])} of weights, {fmt_bytes(split[1])} of KV cache, the rest activations"
             if split else "every weight once, the KV cache, the activations")
    return (f"At batch 1 one decode step reads **{fmt_bytes(step.bytes)}** ({parts}) and does **{human(step.flops / 1e9)} GFLOP**. On this machine's measured ceilings "
            f"({human(step.roof.bandwidth_Bps / 1e9)} GB/s, {human(step.roof.peak_flops / 1e9)} GFLOP/s) the bytes "
            f"take **{human(memory_ms)} ms** and the arithmetic **{human(compute_ms)} ms**: memory takes "
            f"**{human(memory_ms / compute_ms)}×** as long. The step's arithmetic intensity is "
            f"{human(step.intensity)} FLOP per byte; the machine's ridge point is {human(step.roof.ridge_point)}: "
            f"the step sits {'left' if step.bound == 'memory' else 'right'} of it ({step.bound}-bound). Predicted "
            f"step, op by op: **{human(step.time_s * 1e3)} ms**.")


def decode_rows(step: StepPrediction, row: dict[str, Any]) -> list[dict[str, Any]]:
    memory_ms, compute_ms = 1e3 * row["bytes"] / step.roof.bandwidth_Bps, 1e3 * row["flops"] / step.roof.peak_flops
    return [
        {"what": "memory alone: bytes / measured bandwidth", "ms": memory_ms},
        {"what": "arithmetic alone: FLOPs / measured FLOP/s", "ms": compute_ms},
        {"what": "the roofline's step (op by op)", "ms": row["predicted_ms"]},
        {"what": f"the engine's step, measured (median of {row['steps_timed']})", "ms": row["measured_ms"]},
    ]


def decode_table(step: StepPrediction, row: dict[str, Any]):
    return people_table(decode_rows(step, row), [Column("what", f"batch 1, {row['context']:,} tokens", "text"),
                                                 Column("ms", "ms")])


def decode_text(step: StepPrediction, row: dict[str, Any]) -> str:
    """The measured step beside the prediction, with the ratio and what it says."""
    memory_ms, compute_ms = 1e3 * row["bytes"] / step.roof.bandwidth_Bps, 1e3 * row["flops"] / step.roof.peak_flops
    return (f"The engine's decode step took **{human(row['measured_ms'])} ms** ({row['dtype']}, {torch.get_num_threads()} "
            f"torch threads, median of {row['steps_timed']} steps at about {row['context']:,} tokens) against the "
            f"roofline's **{human(row['predicted_ms'])} ms**: **{human(row['measured_over_predicted'])}×** the "
            f"prediction. It took {human(row['measured_ms'] / compute_ms)}× what its arithmetic alone needs at the "
            f"measured FLOP/s, and {human(row['measured_ms'] / memory_ms)}× what its bytes alone need at the measured "
            "bandwidth: the bytes are the floor it stands on. What is left above the roofline is the engine's "
            f"software (Python, one kernel per op, the cache's gather), which chapter {chapter_number('batching')} "
            "takes apart.")


# ---------------------------------------------------------------------------------------------
# The chapter's surface


@dataclass
class Result(ChapterResult):
    """Chapter 01's parts; a part not run is ``None``."""

    model: str = ""
    loop: LoopResult | None = None
    flops: list[ComponentFlops] | None = None
    bandwidth: BandwidthResult | None = None
    decode: DecodeResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "loop": lambda: run_loop(lm, sizes),
        "flops": lambda: run_flops(lm, sizes),
        "bandwidth": lambda: run_bandwidth(lm, sizes),
        "decode": lambda: run_decode(lm, sizes),
    })


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.flops:
        out["flops"] = flops_figure(result.flops)
    if result.bandwidth:
        out["bandwidth"] = bandwidth_figure(result.bandwidth.points, result.bandwidth.device_type)
    if result.decode:
        out["decode"] = budget_figure(result.decode.step, result.model)
    return out


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.loop:
        out["The loop, pass by pass"] = loop_table(result.loop)
    if result.flops:
        out["One token's FLOPs by component"] = flops_table(result.flops)
    if result.bandwidth:
        out["Copy bandwidth by working set"] = bandwidth_table(result.bandwidth)
    if result.decode:
        out["One decode step: predicted and measured"] = decode_table(result.decode.step, result.decode.measured)
    return out


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.loop:
        lines.append(loop_text(result.loop))
    if result.flops:
        lines.append(flops_text(result.flops))
    if result.bandwidth:
        lines.append(bandwidth_text(result.bandwidth.points, result.bandwidth.device_type))
    if result.decode:
        lines.append(budget_text(result.decode.step, (result.decode.weight_bytes, result.decode.kv_bytes)))
        lines.append(decode_text(result.decode.step, result.decode.measured))
    return "\n\n".join(lines)


def saved() -> SavedView | None:
    """No saved GPU run for this chapter yet: every part runs on the learner's own machine."""
    return None
