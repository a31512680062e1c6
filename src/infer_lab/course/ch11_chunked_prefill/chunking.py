"""Section 1 of chapter 11: a long prompt among running decodes, without and with chunking (the notebook's ``serve``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...bench.baselines import Workload
from ...bench.long_prompt import long_prompt_among_decoders
from ...engine.scheduler import Scheduler, split_budget
from ...figures import finish, subplots
from ...progress import progress
from ...timing import CONTRADICTED, SUPPORTED, MachineLoad, compare_spreads, summarize
from ..chapter import check_machine, finding
from ..library_code import code_block
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes

# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class StepPoint:
    """One engine step of one run: its time (seconds) and what it computed (tokens)."""

    chunking: bool
    step: int
    step_s: float
    prefill_tokens: int
    decode_tokens: int

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


@dataclass(frozen=True)
class RunSummary:
    """One run: the decoders' ITL and the long request's TTFT (seconds), from the engine's timings."""

    chunking: bool
    max_num_batched_tokens: int | None  # the step budget (None: the whole prompt in one step)
    steps: int
    max_step_tokens: int
    long_prefill_steps: int  # steps that ran part of the long prompt
    decoder_itl_p50_s: float
    decoder_itl_max_s: float
    long_ttft_s: float  # from the long request's arrival to its first token

    @property
    def label(self) -> str:
        return f"chunked ({self.max_num_batched_tokens} tokens/step)" if self.chunking else "whole prompt in one step"


@dataclass(frozen=True)
class ChunkingResult:
    sizes: Sizes
    steps: list[StepPoint]
    runs: list[RunSummary]  # without chunking, then with
    machine: MachineLoad | None = field(default=None, compare=False)  # the busier check, before or after

    def decode_step_spread_s(self) -> float:
        """Timing noise: the widest range (max - min, seconds) of decode-only step times in one run."""
        spreads = []
        for chunking in (False, True):
            times = [p.step_s for p in self.steps_of(chunking) if p.prefill_tokens == 0]
            if len(times) > 1:
                spreads.append(max(times) - min(times))
        return max(spreads, default=0.0)

    def outcome(self) -> str:
        """Whether chunking lowered the decoders' worst gap by more than the decode-step noise."""
        return compare_spreads([self.run(True).decoder_itl_max_s], [self.run(False).decoder_itl_max_s],
                               margin=self.decode_step_spread_s())

    def run(self, chunking: bool) -> RunSummary:
        return next(r for r in self.runs if r.chunking == chunking)

    def prefill_step(self, chunking: bool = False) -> StepPoint:
        """The step that carried the long prompt's prefill (the most prefill tokens at or after its arrival),
        found by what the step computed, not by how long it took."""
        late = [p for p in self.steps_of(chunking) if p.step >= self.sizes.arrive_at_step and p.prefill_tokens > 0]
        return max(late or self.steps_of(chunking), key=lambda p: (p.prefill_tokens, -p.step))

    def decode_step_median_s(self, chunking: bool = False) -> float:
        """The median time (seconds) of the decode-only steps of one run: the step the spike is sized against."""
        times = [p.step_s for p in self.steps_of(chunking) if p.prefill_tokens == 0]
        return summarize(times).p50 if times else 0.0

    def steps_of(self, chunking: bool) -> list[StepPoint]:
        return [s for s in self.steps if s.chunking == chunking]



# ---------------------------------------------------------------------------------------------
# The experiment (the notebook's `serve`), its prediction and the scheduler's code


def run_summary(chunking: bool, max_num_batched_tokens: int, arrive_at_step: int, step_log: Sequence[Any],
                outputs: Sequence[Any]) -> tuple[list[StepPoint], RunSummary]:
    """One run of ``serve`` tidied: every step, the decoders' ITL (all requests but the last) and the
    long request's TTFT (the last one, timed from its arrival)."""
    steps = [StepPoint(chunking, r.step, r.duration_s, r.prefill_tokens, r.decode_tokens) for r in step_log]
    itl = [x for o in outputs[:-1] for x in o.itl_s]
    long_steps = sum(1 for p in steps if p.step >= arrive_at_step and p.prefill_tokens > 0)
    return steps, RunSummary(chunking, max_num_batched_tokens if chunking else None, len(steps), max(p.tokens for p in steps),
                             long_steps, summarize(itl).p50, max(itl), outputs[-1].ttft_s)


def chunking_result(sizes: Sizes, workload: Workload, max_num_batched_tokens: int,
                    runs: dict[bool, tuple[Sequence[Any], Sequence[Any]]],
                    machine: MachineLoad | None = None) -> ChunkingResult:
    """The experiment cell's ``{chunked: serve(...)}`` as a :class:`ChunkingResult`; its sizes are the
    numbers the cell ran (the long prompt, the budget, the decoders, the arrival step)."""
    ran = replace(sizes, long_prompt=len(workload.prompts[-1]), decoders=len(workload.prompts) - 1,
                  max_num_batched_tokens=max_num_batched_tokens, arrive_at_step=(workload.arrival_steps or [0])[-1])
    steps, summaries = [], []
    for chunked in (False, True):
        run_steps, summary = run_summary(chunked, max_num_batched_tokens, ran.arrive_at_step, *runs[chunked])
        steps += run_steps
        summaries.append(summary)
    return ChunkingResult(ran, steps, summaries, machine)


def run_chunking(lm: Any, sizes: Sizes) -> ChunkingResult:
    """Run the notebook's own experiment (``serve`` of ``infer_lab/notebooks/11_chunked_prefill.py``) as its cell
    does: the same workload without and with chunked prefill, the machine's load checked around it."""
    serve = notebook_function(NUMBER, "serve")
    workload = long_prompt_among_decoders(lm, sizes.decoders, sizes.long_prompt, sizes.arrive_at_step,
                                          sizes.decoder_prompt, sizes.decode_tokens, sizes.long_output)
    before = check_machine()
    runs = {chunked: serve(lm, workload, sizes.max_num_batched_tokens if chunked else None)
            for chunked in progress((False, True), desc="without and with chunking")}
    return chunking_result(sizes, workload, sizes.max_num_batched_tokens, runs, before.worst(check_machine()))


def predicted_step_tokens(long_prompt: int, decoders: int, max_num_batched_tokens: int) -> dict[bool, int]:
    """The prediction: the most tokens one step computes while the long prompt is prefilled. Whole, the
    admitting step computes the prompt and one token per decoder; chunked, never more than the budget."""
    return {False: long_prompt + decoders, True: min(max_num_batched_tokens, long_prompt + decoders)}


def prediction_text(sizes: Sizes) -> str:
    """The prediction, on the page before the run (markdown)."""
    p = predicted_step_tokens(sizes.long_prompt, sizes.decoders, sizes.max_num_batched_tokens)
    return (f"**Predict first:** without chunking, the step that admits the long prompt computes "
            f"{sizes.long_prompt:,} + {sizes.decoders} = **{p[False]:,} tokens**, and each decoder's next token "
            f"waits for all of it. With a {sizes.max_num_batched_tokens}-token budget no step computes more than "
            f"**{p[True]} tokens**, and the prompt needs at least "
            f"{-(-sizes.long_prompt // max(1, sizes.max_num_batched_tokens - sizes.decoders))} steps (the decoders take "
            f"{sizes.decoders} tokens of every budget first). A step's time grows with its tokens plus a fixed cost "
            f"per forward pass, so the decoders' worst gap should shrink by at most {p[False] / p[True]:.1f}× "
            "(the token ratio), and less, by that fixed cost; the long request's first token should come later.")


def schedule_code() -> str:
    """The scheduler's step and its split of the token budget among the running requests
    (``split_budget``, which stage 4 of the build track has you write), the library's real code
    (docstrings left out: the words around it on the page say the same), as a markdown code block."""
    return code_block(split_budget, Scheduler.schedule)


# ---------------------------------------------------------------------------------------------
# Words, tables and figures


def spike_text(c: ChunkingResult) -> str:
    """The unchunked run's spike in words: the step that carried the long prompt's prefill (found by its
    tokens), its time against the median decode-only step and the decode steps' spread (the noise), and,
    when another step of that run was slower, that step named as noise (it computed fewer tokens)."""
    spike = c.prefill_step(False)
    slowest = max(c.steps_of(False), key=lambda p: p.step_s)
    median, spread = c.decode_step_median_s(False), c.decode_step_spread_s()
    words = (f"Without chunking, the long {c.sizes.long_prompt:,}-token prompt ran in one step (step {spike.step}) of "
             f"{spike.tokens:,} tokens that took **{spike.step_s * 1e3:,.0f} ms**")
    if median > 0:
        words += (f", {spike.step_s / median:.1f}× the median decode-only step ({median * 1e3:,.1f} ms)")
        excess = spike.step_s - median
        words += (f"; decode-only steps varied by {spread * 1e3:,.1f} ms, so the spike "
                  + ("stands out of that noise" if excess > spread else
                     "is **within that noise**: on this run the clock cannot show it, the token counts still do"))
    words += "."
    if slowest.step != spike.step and slowest.step_s > spike.step_s:
        words += (f" The slowest step of that run was not this one but step {slowest.step}, "
                  f"{slowest.tokens:,} tokens in {slowest.step_s * 1e3:,.0f} ms: it computed fewer tokens than the "
                  "prefill step, so its extra time is this machine's noise, not work.")
    return words


def chunking_text(c: ChunkingResult, machine: MachineLoad | None = None) -> str:
    """The verdict (does chunking lower the worst gap beyond the noise?), then the spike (the step that
    carried the long prefill, sized against the decode steps' noise), its flattening and the TTFT price,
    every number from ``c``, the prediction beside the measurement."""
    whole, chunked = c.run(False), c.run(True)
    machine = machine or c.machine or check_machine()
    verdict = finding(c.outcome(), "chunking lowers the decoding requests' worst gap between two tokens", machine,
                      f"by more than the {c.decode_step_spread_s() * 1e3:,.1f} ms that decode-only steps varied")
    predicted = predicted_step_tokens(c.sizes.long_prompt, c.sizes.decoders, c.sizes.max_num_batched_tokens)
    return verdict + " " + spike_text(c) + " " + (
        f"The {c.sizes.decoders} decoding "
        f"requests' worst gap between two tokens was **{whole.decoder_itl_max_s * 1e3:,.0f} ms** "
        f"(p50 {whole.decoder_itl_p50_s * 1e3:,.0f} ms). With a {chunked.max_num_batched_tokens}-token budget the long "
        f"prefill was spread over {chunked.long_prefill_steps} steps of at most {chunked.max_step_tokens} tokens; "
        f"the worst gap was **{chunked.decoder_itl_max_s * 1e3:,.0f} ms** (p50 "
        f"{chunked.decoder_itl_p50_s * 1e3:,.0f} ms). Largest step, predicted vs measured: {predicted[False]:,} vs "
        f"{whole.max_step_tokens:,} tokens whole, {predicted[True]} vs {chunked.max_step_tokens} chunked. "
        + shrink_text(whole.decoder_itl_max_s / chunked.decoder_itl_max_s, predicted[False] / predicted[True]) + " "
        + ttft_text(whole.long_ttft_s, chunked.long_ttft_s, c.decode_step_spread_s()) + " "
        "A smaller budget flattens the spike further but spreads the prefill over more steps (every step is in "
        "the second table)."
    )


def shrink_text(shrink: float, token_bound: float) -> str:
    """The worst gap's measured shrink (whole / chunked, a ratio) against the token ratio ``token_bound``:
    the most it can shrink when a step's time follows its tokens (each step also pays a fixed cost, so less).
    A noisy run can exceed that bound, and the words say so when it does."""
    words = f"The worst gap shrank {shrink:.1f}×"
    if shrink <= token_bound:
        return words + (f", within the {token_bound:.1f}× the token counts allow when a step's time follows its tokens "
                        "(each step also pays a fixed cost, so less is expected).")
    return words + (f", more than the {token_bound:.1f}× the token counts allow when a step's time follows its tokens: "
                    "on this run timing noise (a slow step on a shared machine) made part of that difference, not "
                    "the chunking.")


def ttft_text(whole_ttft_s: float, chunked_ttft_s: float, noise_s: float) -> str:
    """The long request's TTFT without and with chunking (seconds), judged against ``noise_s`` (seconds, the
    decode-only steps' spread): rose or fell beyond it, or within it."""
    change = f"The long request's TTFT went from {whole_ttft_s * 1e3:,.0f} ms to {chunked_ttft_s * 1e3:,.0f} ms"
    outcome = compare_spreads([whole_ttft_s], [chunked_ttft_s], margin=noise_s)
    noise = f"the {noise_s * 1e3:,.1f} ms decode-only steps varied"
    if outcome == SUPPORTED:
        return (f"{change}, later by more than {noise}: each extra step pays the fixed cost of a forward pass, "
                "the price of a smoother stream for everyone else.")
    if outcome == CONTRADICTED:
        return (f"{change}, earlier by more than {noise}: on this run the extra steps' fixed cost did not show, "
                "and the prompt computed in pieces was no slower than in one step.")
    return (f"{change}, **within the noise** ({noise}): on this run chunking's price in TTFT, the fixed cost "
            "of each extra step, is too small to tell.")


RUN_COLUMNS = [
    Column("label", "prefill", "text"), Column("steps", "engine steps", "int"),
    Column("max_step_tokens", "largest step (tokens)", "int"),
    Column("long_prefill_steps", "steps of the long prefill", "int"),
    Column("decoder_itl_p50_s", "decoders' ITL p50 (ms)", scale=1e3),
    Column("decoder_itl_max_s", "decoders' ITL max (ms)", scale=1e3),
    Column("long_ttft_s", "long request's TTFT (ms)", scale=1e3),
]
STEP_COLUMNS = [
    Column("chunking", "chunked", "bool"), Column("step", "step", "int"),
    Column("step_s", "step time (ms)", scale=1e3), Column("prefill_tokens", "prefill (tokens)", "int"),
    Column("decode_tokens", "decode (tokens)", "int"),
]


def runs_table(c: ChunkingResult):
    return people_table(c.runs, RUN_COLUMNS)


def steps_table(c: ChunkingResult):
    return people_table(c.steps, STEP_COLUMNS)


def chunking_figure(c: ChunkingResult, source: str):
    """Step time (= the decoders' ITL) per engine step, and the tokens each step computed."""
    fig, (left, right) = subplots(1, 2, figsize=(12, 3.8))
    for chunking, colour in ((False, "tab:red"), (True, "tab:blue")):
        steps, label = c.steps_of(chunking), c.run(chunking).label
        left.plot([p.step for p in steps], [p.step_s * 1e3 for p in steps], ".-", color=colour, label=label)
        right.step([p.step for p in steps], [p.tokens for p in steps], where="mid", color=colour, label=label)
    last = max(p.step for p in c.steps)
    for ax in (left, right):
        ax.axvline(c.sizes.arrive_at_step, color="gray", ls=":", label="long prompt arrives")
        ax.set(xlabel="engine step", xlim=(-0.5, last + 0.5))
        ax.grid(alpha=0.3)
    right.axhline(c.sizes.max_num_batched_tokens, color="tab:blue", ls="--", lw=1, label="token budget per step")
    left.set(ylabel="step time = ITL of running requests (ms)", ylim=(0, None))
    right.set(ylabel="tokens computed in the step (log scale)", yscale="log",
              ylim=(0.8, 2 * max(p.tokens for p in c.steps)))
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle(f"A {c.sizes.long_prompt:,}-token prompt arrives while {c.sizes.decoders} requests decode\n{source}",
                 fontsize=10)
    finish(fig)
    return fig
