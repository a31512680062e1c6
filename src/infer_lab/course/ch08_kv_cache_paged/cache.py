"""Part 1 of chapter 08's page: no cache vs KV cache, the same generation step by step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...figures import subplots
from ...harness import progress
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes


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


KV_MODES = ("nocache", "paged")


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


CACHE_COLUMNS = [
    Column("mode", "KV mode", "text"), Column("tokens_computed", "tokens computed", "int"),
    Column("flops", "work (TFLOP)", scale=1e-12), Column("seconds", "total (s)"),
    Column("first_decode_s", "first decode steps (ms)", scale=1e3),
    Column("last_decode_s", "last decode steps (ms)", scale=1e3),
]


def cache_table(cache: CacheResult):
    return people_table(cache.totals(), CACHE_COLUMNS)


def cache_figure(cache: CacheResult, source: str):
    """Decode step time vs position, and cumulative work (2 × params × tokens) vs position, per KV mode."""
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
