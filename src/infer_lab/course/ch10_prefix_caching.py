"""Chapter 10, "Prefix caching": hashed blocks (vLLM style) vs a radix tree (SGLang style).

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/10_prefix_caching.py`` that call the engine directly, called from the page's
visible cells. This module sizes them, predicts, draws and describes what they return, and runs
the very same functions for the tour, the tests and the Jupyter edition (``run_*``, through
:mod:`infer_lab.course.notebook_code`).

1. **Match granularity, measured** (counted; ``tokens_reused``): two prompts share their first
   *k* tokens; the engine reports how many prompt tokens each cache handed the second one. The
   prediction (hash: whole blocks; radix: every shared token) is drawn beside the measurement.
2. **Three prefix-sharing workloads** (counted and timed; ``serve_waves``): a shared system
   prompt, multi-turn chat and agentic branching (:mod:`infer_lab.bench.prefix_workloads`), each
   served with no cache, the hash cache and the radix tree: hit rate, prefill tokens computed
   (the exact measure of work saved) and TTFT.

Prompts are random token ids (prefix reuse depends only on ids) and EOS is ignored, so every
run does exactly the work asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from ..bench.baselines import Workload
from ..bench.prefix_workloads import PREFIX_WORKLOADS, prefix_sharing_workloads
from ..engine.prefix_cache import RadixPrefixCache
from ..progress import progress
from ..timing import summarize
from ..units import count
from .chapter import NO_MODEL, ChapterResult, choose_size, run_parts
from .library_code import code_block
from .notebook_code import notebook_function
from .saved import SavedView
from .tables import Column, people_table

NUMBER = "10"
SLUG = "prefix_caching"
TITLE = "10 · Prefix caching: hash blocks vs a radix tree"
NEEDS_MODEL = True
PARTS = {
    "granularity": "Measure what each cache matches",
    "workloads": "Run the three workloads",
}
CACHES = ("hash", "radix")
WORKLOADS = PREFIX_WORKLOADS  # name -> label of the three workloads


@dataclass(frozen=True)
class Sizes:
    """Sizes of the two parts, in tokens and requests."""

    size: str
    match_block: int  # KV block size of the granularity probe (tokens)
    match_blocks: int  # its prompts are this many blocks long
    block_size: int  # KV block size of the workloads (tokens)
    system_len: int  # tokens of the shared system prompt
    users: int  # users of the shared-system-prompt workload
    conversations: int  # conversations of the multi-turn workload
    turns: int  # turns of each conversation
    branches: int  # proposals of the agentic workload
    output_len: int  # tokens generated per request

    @property
    def match_prompt_len(self) -> int:
        return self.match_block * self.match_blocks


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: a few hundred prompt tokens per cache (seconds on 2 cores); ``full``: a GPU's run."""
    size = choose_size(device, size)
    if size == "quick":
        return Sizes(size, match_block=4, match_blocks=3, block_size=16, system_len=40, users=4,
                     conversations=2, turns=2, branches=2, output_len=2)
    return Sizes(size, match_block=16, match_blocks=4, block_size=16, system_len=256, users=8,
                 conversations=3, turns=3, branches=3, output_len=8)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class MatchPoint:
    """Prompt tokens one cache handed the second request when the two prompts share ``shared_tokens``."""

    cache: str
    shared_tokens: int
    reused_tokens: int


@dataclass(frozen=True)
class MatchResult:
    block_size: int  # tokens per KV block
    prompt_len: int  # tokens of each of the two prompts
    points: list[MatchPoint]

    def reused(self, cache: str, shared: int) -> int:
        return next(p.reused_tokens for p in self.points if p.cache == cache and p.shared_tokens == shared)

    def shared_values(self) -> list[int]:
        return sorted({p.shared_tokens for p in self.points})

    def whole_blocks(self, shared: int) -> int:
        """Tokens in the whole blocks of a ``shared``-token prefix."""
        return shared // self.block_size * self.block_size

    def granularity(self, cache: str) -> str:
        """``"token"`` when the cache reused every shared token, ``"block"`` when it reused
        exactly the whole blocks of each shared prefix, ``"other"`` otherwise (measured, not assumed)."""
        points = [p for p in self.points if p.cache == cache]
        if all(p.reused_tokens == p.shared_tokens for p in points):
            return "token"
        if all(p.reused_tokens == self.whole_blocks(p.shared_tokens) for p in points):
            return "block"
        return "other"


@dataclass(frozen=True)
class WorkloadRun:
    """One workload through one cache: tokens, hit rate and TTFT (seconds)."""

    workload: str
    cache: str  # "none", "hash" or "radix"
    block_size: int
    requests: int
    prompt_tokens: int  # prompt tokens asked for
    prefill_tokens_computed: int  # prompt tokens the engine actually ran through the model
    hit_rate: float  # prompt tokens found in the cache / prompt tokens looked up
    ttft_p50_s: float
    ttft_mean_s: float
    elapsed_s: float  # the engine's steps, summed (seconds)

    @property
    def prefill_tokens_saved(self) -> int:
        return self.prompt_tokens - self.prefill_tokens_computed

    @property
    def label(self) -> str:
        return WORKLOADS.get(self.workload, self.workload)


@dataclass(frozen=True)
class WorkloadsResult:
    runs: list[WorkloadRun]
    block_size: int
    system_len: int
    output_len: int

    def run(self, workload: str, cache: str) -> WorkloadRun:
        return next(r for r in self.runs if r.workload == workload and r.cache == cache)

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(r.workload for r in self.runs))


@dataclass
class Result(ChapterResult):
    """Chapter 10's measurements; a part not run is ``None``."""

    model: str = ""
    granularity: MatchResult | None = None
    workloads: WorkloadsResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# Part 1: match granularity (the experiment is the notebook's `tokens_reused`)


def shared_lengths(block_size: int, prompt_len: int) -> list[int]:
    """0, 1 and one token either side of every block edge inside the prompt: where a staircase shows."""
    edges = range(block_size, prompt_len, block_size)
    return sorted({0, 1, *(k + d for k in edges for d in (-1, 0, 1))} & set(range(prompt_len)))


def predicted_reuse(cache: str, shared: int, block_size: int, prompt_len: int) -> int:
    """The prediction: radix reuses every shared token, hash the whole blocks of the shared prefix;
    both stop before the prompt's last token (it must be computed to give the first output's logits)."""
    usable = min(shared, prompt_len - 1)
    return usable if cache == "radix" else usable // block_size * block_size


def match_result(block_size: int, prompt_len: int, reused: Mapping[tuple[str, int], int]) -> MatchResult:
    """The experiment cell's ``{(cache, shared tokens): tokens reused}`` as a :class:`MatchResult`."""
    return MatchResult(block_size, prompt_len, [MatchPoint(cache, k, int(n)) for (cache, k), n in reused.items()])


def run_granularity(lm: Any, sizes: Sizes, block_size: int | None = None, shared: Seq[int] | None = None) -> MatchResult:
    """Run the notebook's own experiment (``tokens_reused`` of ``infer_lab/notebooks/10_prefix_caching.py``)
    as its cell does: every cache, every shared length (default :func:`shared_lengths`)."""
    tokens_reused = notebook_function(NUMBER, "tokens_reused")
    block_size = block_size or sizes.match_block
    prompt_len = sizes.match_blocks * block_size
    ks = list(shared) if shared is not None else shared_lengths(block_size, prompt_len)
    plan = [(cache, k) for cache in CACHES for k in ks]
    reused = {(cache, k): tokens_reused(lm, cache, block_size, prompt_len, k)
              for cache, k in progress(plan, desc="prefix match, per cache and shared length")}
    return match_result(block_size, prompt_len, reused)


def radix_match_code() -> str:
    """The radix tree's lookup, the library's real code (its docstring left out: the words around
    it on the page say the same), as a markdown code block."""
    return code_block(RadixPrefixCache.match)


# ---------------------------------------------------------------------------------------------
# Part 2: three workloads (the experiment is the notebook's `serve_waves`)


def workload_waves(lm: Any, sizes: Sizes, system_len: int | None = None, seed: int = 0) -> dict[str, list[Workload]]:
    """The three workloads at the chapter's sizes (``system_len`` overrides the system prompt's tokens)."""
    return prefix_sharing_workloads(lm.config.vocab_size, system_len or sizes.system_len, sizes.users,
                                    sizes.conversations, sizes.turns, sizes.branches, sizes.output_len, seed)


def workload_run(name: str, cache: str, block_size: int, waves: Seq[Workload], step_log: Seq[Any],
                 stats: Any, outputs: Seq[Any]) -> WorkloadRun:
    """One workload through one cache, tidied from what ``serve_waves`` returns: the engine's step
    records (prefill tokens computed), its prefix-cache counters (``None``: no cache) and the outputs (TTFT)."""
    ttft = summarize([o.ttft_s for o in outputs])
    return WorkloadRun(name, cache, block_size, len(outputs), sum(len(p) for w in waves for p in w.prompts),
                       sum(r.prefill_tokens for r in step_log), stats.hit_rate if stats else 0.0,
                       ttft.p50, ttft.mean, sum(r.duration_s for r in step_log))


def run_workloads(lm: Any, sizes: Sizes, system_len: int | None = None, block_size: int | None = None) -> WorkloadsResult:
    """Run the notebook's own experiment (``serve_waves``) as its cell does: every workload, every cache."""
    serve_waves = notebook_function(NUMBER, "serve_waves")
    system_len, block_size = system_len or sizes.system_len, block_size or sizes.block_size
    plan = [(name, waves, cache) for name, waves in workload_waves(lm, sizes, system_len).items()
            for cache in ("none", *CACHES)]
    runs = [workload_run(name, cache, block_size, waves, *serve_waves(lm, waves, cache, block_size))
            for name, waves, cache in progress(plan, desc="workloads x caches")]
    return WorkloadsResult(runs, block_size, system_len, sizes.output_len)


def shared_prompt_prediction(users: int, system_len: int, block_size: int) -> dict[str, int]:
    """Predicted prefill tokens saved on the shared-system-prompt workload: every user after the
    first finds the system prompt, radix all of it, hash its whole blocks."""
    return {"hash": (users - 1) * (system_len // block_size * block_size), "radix": (users - 1) * system_len}


def shared_prompt_prediction_text(sizes: Sizes) -> str:
    """The prediction for the shared system prompt, on the page before the run (markdown)."""
    p = shared_prompt_prediction(sizes.users, sizes.system_len, sizes.block_size)
    return (f"**Predict first:** {sizes.users} users share a {sizes.system_len}-token system prompt, with "
            f"{sizes.block_size}-token blocks. Every user after the first should find the system prompt in the "
            f"cache: radix all of it, hash its whole blocks, so radix should save {p['radix']:,} prefill tokens "
            f"and hash {p['hash']:,}. Where do the multi-turn chat and the agentic branches end their shared "
            "prefixes: on a block edge or inside a block? That decides where radix beats hash.")


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's experiments in a row (``parts`` picks some of :data:`PARTS`), the notebook's own code."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "granularity": lambda: run_granularity(lm, sizes),
        "workloads": lambda: run_workloads(lm, sizes),
    })


# ---------------------------------------------------------------------------------------------
# Words, tables and figures

_GRANULARITY_WORDS = {"token": "every shared token", "block": "whole blocks only",
                      "other": "neither every token nor exactly the whole blocks"}


def granularity_text(match: MatchResult) -> str:
    """What each cache was measured to reuse, with one telling example (a prefix ending inside a block)."""
    inside = [k for k in match.shared_values() if k > match.block_size and k % match.block_size]
    k = inside[-1] if inside else match.shared_values()[-1]
    parts = [f"**{cache}** reused {_GRANULARITY_WORDS[match.granularity(cache)]} "
             f"({match.reused(cache, k)} of {k} shared tokens)" for cache in CACHES]
    agree = sum(p.reused_tokens == predicted_reuse(p.cache, p.shared_tokens, match.block_size, match.prompt_len)
                for p in match.points)
    return (f"Measured with {match.block_size}-token blocks and {match.prompt_len}-token prompts: "
            + "; ".join(parts) + ". A hash names a *full* block, so a prefix that ends inside a block "
            "loses that block's tokens; the radix tree walks token by token. The prediction (dotted) and the "
            f"engine agree at {agree} of {len(match.points)} points.")


def workloads_text(w: WorkloadsResult) -> str:
    """Tokens computed per cache and workload, and where radix beat hash (all numbers from ``w``)."""
    lines, more, same, less = [], [], [], []
    for name in w.workloads():
        none, hash_, radix = (w.run(name, c) for c in ("none", "hash", "radix"))
        lines.append(f"- {none.label}: {none.prompt_tokens:,} prompt tokens; prefill computed "
                     f"{hash_.prefill_tokens_computed:,} with hash ({hash_.hit_rate:.0%} hit rate) and "
                     f"{radix.prefill_tokens_computed:,} with radix ({radix.hit_rate:.0%}).")
        gap = radix.prefill_tokens_saved - hash_.prefill_tokens_saved
        if gap == 0:
            same.append(none.label)
        else:
            (more if gap > 0 else less).append(f"{none.label} ({abs(gap):,} tokens)")
    verdict = []
    if "shared_system_prompt" in w.workloads():
        users = w.run("shared_system_prompt", "none").requests
        predicted = shared_prompt_prediction(users, w.system_len, w.block_size)
        measured = {c: w.run("shared_system_prompt", c).prefill_tokens_saved for c in CACHES}
        verdict.append("On the shared system prompt, prefill tokens saved, predicted vs measured: " + ", ".join(
            f"{c} {predicted[c]:,} vs {measured[c]:,}" + (f" ({measured[c] / predicted[c]:.2f}×)" if predicted[c] else "")
            for c in CACHES) + ".")
    if more:
        verdict.append(f"Radix saved more prefill than hash on {', '.join(more)}: those prefixes end "
                       "inside a block (chat turns, branch points).")
    if less:
        verdict.append(f"Hash saved more than radix on {', '.join(less)}.")
    if same:
        verdict.append(f"They saved the same on {', '.join(same)}: every prefix radix found there was a "
                       "whole number of blocks.")
    verdict.append("Prefill tokens saved are exact counts; the TTFT is a time, noisy on a busy CPU with a small model.")
    return "\n".join(lines) + "\n\n" + " ".join(verdict)


# Cited, not measured: the talk's report of SGLang against vLLM on an agentic branching workload
# (a two-turn propose-then-review loop sharing a long prefix), end to end.
SGLANG_AGENTIC_CLAIM = (3.0, 4.0)


def sglang_claim_text(w: WorkloadsResult, workload: str = "agentic_branching") -> str:
    """The reported 3–4x of SGLang on agentic work, against what this measurement isolates."""
    if workload not in w.workloads():
        return ""
    none, hash_, radix = (w.run(workload, c) for c in ("none", "hash", "radix"))
    lo, hi = SGLANG_AGENTIC_CLAIM
    vs_hash = hash_.prefill_tokens_computed / max(radix.prefill_tokens_computed, 1)
    vs_none = none.prefill_tokens_computed / max(radix.prefill_tokens_computed, 1)
    return (
        f"**The reported {lo:.0f}–{hi:.0f}× and this measurement.** SGLang was reported {lo:.0f}–{hi:.0f}× faster "
        "than vLLM on an agentic branching workload (cited, end to end, not measured here). This chapter isolates "
        f"one mechanism, how a cache matches a prefix: on {none.label} radix found {radix.hit_rate:.0%} of the prompt "
        f"tokens and hash {hash_.hit_rate:.0%}, so hash computed {vs_hash:.2f}× the prefill tokens radix did. "
        f"Against no cache at all, radix computed {vs_none:.2f}× fewer. Matching granularity alone is a few points "
        "of hit rate; a gap of several × needs more: a baseline that loses the shared prefix (evicted under memory "
        "pressure, or no prefix cache on that path), a scheduler that orders requests so branches find their "
        "parent still cached, and the rest of the engine (CPU overhead per request, kernels). Prefill tokens saved "
        "bound what the cache alone can give; the rest of a reported speedup comes from elsewhere."
    )


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.granularity:
        lines.append(granularity_text(result.granularity))
    if result.workloads:
        lines += [workloads_text(result.workloads), sglang_claim_text(result.workloads)]
    return "\n\n".join(line for line in lines if line)


def granularity_rows(match: MatchResult) -> list[dict[str, int]]:
    return [{"shared": k, "whole_blocks": match.whole_blocks(k),
             **{cache: match.reused(cache, k) for cache in CACHES}} for k in match.shared_values()]


GRANULARITY_COLUMNS = [
    Column("shared", "tokens shared", "int"), Column("whole_blocks", "in whole blocks (tokens)", "int"),
    Column("hash", "hash reused (tokens)", "int"), Column("radix", "radix reused (tokens)", "int"),
]
WORKLOAD_COLUMNS = [
    Column("label", "workload", "text"), Column("cache", "cache", "text"), Column("requests", "requests", "int"),
    Column("prompt_tokens", "prompt (tokens)", "int"),
    Column("prefill_tokens_computed", "prefill computed (tokens)", "int"),
    Column("prefill_tokens_saved", "prefill saved (tokens)", "int"), Column("hit_rate", "hit rate", "pct"),
    Column("ttft_p50_s", "TTFT p50 (ms)", scale=1e3), Column("ttft_mean_s", "TTFT mean (ms)", scale=1e3),
]


def granularity_table(match: MatchResult):
    return people_table(granularity_rows(match), GRANULARITY_COLUMNS)


def workloads_table(w: WorkloadsResult):
    return people_table(w.runs, WORKLOAD_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.granularity:
        out["Prompt tokens reused, by tokens shared"] = granularity_table(result.granularity)
    if result.workloads:
        out["Three workloads, no cache vs hash vs radix"] = workloads_table(result.workloads)
    return out


def granularity_figure(match: MatchResult, source: str):
    """Tokens reused vs tokens shared, one line per cache, block edges in grey, the diagonal dotted."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(6.5, 3.8))
    ks = match.shared_values()
    for cache, marker, colour in zip(CACHES, ("s", "o"), ("tab:orange", "tab:blue"), strict=True):
        ax.plot(ks, [predicted_reuse(cache, k, match.block_size, match.prompt_len) for k in ks], ls=":",
                color=colour, label=f"{cache} (predicted)")
        ax.plot(ks, [match.reused(cache, k) for k in ks], marker=marker, ls="none", color=colour,
                label=f"{cache} (measured)")
    top = max(ks)
    for edge in range(match.block_size, top + 1, match.block_size):
        ax.axvline(edge, color="gray", lw=0.5, alpha=0.5)
    ax.set(xlabel="tokens the second prompt shares with the first", ylabel="prompt tokens reused from the cache",
           xlim=(0, top + 1), ylim=(0, top + 1))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"What each cache matches (block size {match.block_size}, grey lines: block edges)\n{source}",
                 fontsize=10)
    fig.tight_layout()
    return fig


def workloads_figure(w: WorkloadsResult, source: str):
    """Hit rate, prefill tokens computed and TTFT p50 per workload, one bar per cache."""
    import numpy as np

    from ..figures import subplots

    names = w.workloads()
    caches = ("none", *CACHES)
    x = np.arange(len(names))
    width = 0.8 / len(caches)
    fig, axes = subplots(1, 3, figsize=(13, 3.8))
    panels = (("hit_rate", 100, "hit rate (% of prompt tokens looked up)"),
              ("prefill_tokens_computed", 1, "prefill tokens computed"),
              ("ttft_p50_s", 1e3, "TTFT p50 (ms)"))
    for ax, (key, scale, label) in zip(axes, panels, strict=True):
        for i, cache in enumerate(caches):
            ax.bar(x + (i - 1) * width, [getattr(w.run(n, cache), key) * scale for n in names], width, label=cache)
        ax.set_xticks(x, [WORKLOADS.get(n, n) for n in names], rotation=12)
        ax.set(ylabel=label, ylim=(0, None))
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Prefix caching on three workloads (block size {w.block_size})\n{source}", fontsize=10)
    fig.tight_layout()
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.granularity:
        out["granularity"] = granularity_figure(result.granularity, result.model)
    if result.workloads:
        out["workloads"] = workloads_figure(result.workloads, result.model)
    return out


# ---------------------------------------------------------------------------------------------
# Saved GPU results


def saved() -> SavedView | None:
    """No GPU run of this chapter is saved yet: ``None`` (see :func:`gpu_note`)."""
    return None


def gpu_note() -> str:
    """What this chapter measures on a GPU, for a machine without one (markdown)."""
    full = sizes("cuda", "full")
    return (
        "**No saved GPU run of this chapter exists yet**: the numbers above are from this machine. "
        "The token counts and hit rates are exact on any device; only the TTFT depends on it. "
        f"On a GPU the workloads share a {full.system_len:,}-token system prompt across {full.users} users, "
        "where a prefix hit skips most of each prefill and the TTFT gap becomes large."
    )
