"""Chapter 02, "Feel the pain": the four problems of serving an LLM, measured on your machine.

1. Memory grows with tokens and with users (KV bytes counted from the cache tensors).
2. Time to first token grows with context length (prefill).
3. Naive serving runs requests one after another.
4. Each decode step (the inter-token latency) costs a full read of the weights and the KV.

Each part is predict -> run -> compare. The prediction (from the config alone, through
:mod:`infer_lab.analysis`) is on the page first, with a guess field where it teaches. The
experiments are the notebook's own ``@app.function`` s (``kv_after_prefill``, ``ttft_by_prompt``,
``serve_one_by_one_then_batched``, ``decode_step_times`` in ``infer_lab/notebooks/02_feel_the_pain.py``),
which call :func:`infer_lab.harness.timed_generate` directly; this module turns what they return
into results, figures, tables and words, and runs the same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

Every timing goes through :mod:`infer_lab.harness` (warm-up, synchronization, repeats,
percentiles). The prompts are random token ids and EOS is ignored, so every run has exactly
the length asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis import memory, roofline
from ..analysis.compare import dtype_name, shape_of
from ..figures import finish
from ..timing import CONTRADICTED, INCONCLUSIVE, SUPPORTED, MachineLoad, compare_spreads
from ..units import GB, count, human
from .chapter import (
    NO_MODEL,
    SINGLE_RUN_NOISE,
    ChapterResult,
    chapter_number,
    check_machine,
    choose_size,
    finding,
    run_parts,
)
from .notebook_code import notebook_function
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "02"
SLUG = "feel_the_pain"
TITLE = "02 · Feel the pain: memory, TTFT, sequential serving, ITL"
NEEDS_MODEL = True
PARTS = {
    "memory": "Measure KV memory",
    "ttft": "Measure TTFT vs prompt length",
    "serving": "Serve requests one by one, then batched",
    "itl": "Measure the decode step",
}


@dataclass(frozen=True)
class Sizes:
    """Sweep sizes (tokens, users, requests) for the four measurements."""

    size: str
    contexts: tuple[int, ...]  # prompt lengths of the KV measurement (1 user)
    users: tuple[int, ...]  # user counts of the KV measurement (at the first context)
    ttft_lengths: tuple[int, ...]
    itl_contexts: tuple[int, ...]
    itl_batches: tuple[int, ...]
    n_requests: int
    prompt_len: int
    new_tokens: int
    repeats: int
    itl_steps: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Sizes for this device: ``quick`` fits a 2-core CPU in seconds, ``full`` a GPU's 7B model."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        return Sizes(size, contexts=(512, 2048, 8192, 16384), users=(1, 8, 32, 64),
                     ttft_lengths=(128, 512, 2048, 8192, 16384), itl_contexts=(128, 2048, 8192, 16384),
                     itl_batches=(1, 8, 32, 64, 128), n_requests=4, prompt_len=512,
                     new_tokens=32 if size == "quick" else 128, repeats=3 if size == "quick" else 5,
                     itl_steps=8 if size == "quick" else 16)
    if size == "quick":
        return Sizes(size, contexts=(64, 256), users=(1, 4), ttft_lengths=(32, 128, 256),
                     itl_contexts=(64, 256), itl_batches=(1, 4), n_requests=3, prompt_len=32,
                     new_tokens=8, repeats=3, itl_steps=6)
    return Sizes(size, contexts=(128, 512, 1024, 2048), users=(1, 4, 8, 16), ttft_lengths=(64, 256, 1024, 2048),
                 itl_contexts=(128, 1024, 2048), itl_batches=(1, 4, 16), n_requests=8, prompt_len=128,
                 new_tokens=32, repeats=3, itl_steps=8)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class MemoryPoint:
    """KV bytes after one prefill of ``users`` prompts of ``context`` tokens (from the cache tensors)."""

    axis: str  # "context" (1 user) or "users" (at the first context)
    context: int
    users: int
    kv_bytes: int
    weight_bytes: int

    @property
    def tokens(self) -> int:
        return self.context * self.users

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_bytes / self.tokens


@dataclass(frozen=True)
class MemoryResult:
    points: list[MemoryPoint]
    device_memory_bytes: int
    device_memory_label: str  # "GPU memory" or "RAM"
    max_context: int  # the model's position limit (tokens)
    predicted_kv_bytes_per_token: int | None = None  # from the config alone (analysis.memory)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.points[0].kv_bytes_per_token

    @property
    def weight_bytes(self) -> int:
        return self.points[0].weight_bytes

    @property
    def tokens_that_fit(self) -> float:
        """Tokens of KV the device memory holds beside the weights, shared by all users."""
        return (self.device_memory_bytes - self.weight_bytes) / self.kv_bytes_per_token


@dataclass(frozen=True)
class TTFTPoint:
    """Prefill time of one request with ``prompt_len`` tokens over ``repeats`` runs (seconds)."""

    prompt_len: int
    p50_s: float
    p90_s: float
    min_s: float
    repeats: int
    max_s: float | None = None
    machine: MachineLoad | None = field(default=None, compare=False)  # the busier check, before or after


@dataclass(frozen=True)
class RequestTimes:
    """One request's life in seconds since all requests arrived (t = 0)."""

    mode: str  # "sequential" or "batched"
    request: int
    start_s: float
    first_token_s: float
    finish_s: float


@dataclass(frozen=True)
class ServingResult:
    requests: list[RequestTimes]
    n_requests: int
    prompt_len: int
    new_tokens: int
    wall_s: dict[str, float]  # mode -> seconds until the last request finished

    def tokens_per_s(self, mode: str) -> float:
        return self.n_requests * self.new_tokens / self.wall_s[mode]

    def mean_finish_s(self, mode: str) -> float:
        rows = [r for r in self.requests if r.mode == mode]
        return sum(r.finish_s for r in rows) / len(rows)

    @property
    def speedup(self) -> float:
        return self.tokens_per_s("batched") / self.tokens_per_s("sequential")


@dataclass(frozen=True)
class ITLPoint:
    """Decode step time over ``steps`` cached steps at one (context, batch), seconds."""

    context: int
    batch: int
    p50_s: float
    p90_s: float
    steps: int
    kv_bytes: int

    @property
    def tokens_per_s_total(self) -> float:
        return self.batch / self.p50_s

    @property
    def tokens_per_s_per_user(self) -> float:
        return 1 / self.p50_s


@dataclass
class Result(ChapterResult):
    """Chapter 02's measurements; a part not run is ``None``."""

    model: str = ""
    memory: MemoryResult | None = None
    ttft: list[TTFTPoint] | None = None
    serving: ServingResult | None = None
    itl: list[ITLPoint] | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# The experiments are the notebook's own functions (``infer_lab/notebooks/02_feel_the_pain.py``); this module
# predicts before them, turns what they return into typed results, and runs them for the tour,
# the tests and the Jupyter edition through :func:`notebook_function`.


def _shape_dtype(lm: Any) -> tuple[Any, str]:
    return shape_of(lm), dtype_name(lm)


def predicted_kv_bytes_per_token(lm: Any) -> int:
    """KV bytes one token adds, from the model's config alone (:func:`infer_lab.analysis.memory.kv_bytes_per_token`)."""
    shape, dtype = _shape_dtype(lm)
    return memory.kv_bytes_per_token(shape, dtype)


def memory_prediction(lm: Any) -> str:
    """The KV formula with this model's numbers, before anything runs."""
    shape, dtype = _shape_dtype(lm)
    per_token = memory.kv_bytes_per_token(shape, dtype)
    return (f"**Predicted from the config alone:** 2 (K and V) × {shape.layers} layers × {shape.kv_heads} KV heads "
            f"× {shape.head_dim} dims × {memory.kv_bytes_per_element(dtype)} B ({dtype}) = "
            f"**{per_token:,} bytes per token**, so 4× the tokens or 4× the users is 4× the bytes.")


def memory_panels_text(contexts: tuple[int, ...], users: tuple[int, ...]) -> str:
    """What the memory figure's two panels show, from the sweep's contexts and user counts (tokens, users)."""
    def listed(numbers: tuple[int, ...]) -> str:
        words = [f"{n:,}" for n in numbers]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]

    return (f"The dots are those counts; the line extends them. Left: one user at {listed(contexts)} tokens. "
            f"Right: {listed(users)} users, each at {contexts[0]:,} tokens, the context the right panel's dots were "
            "measured at, so its line carries that same context.")


def memory_result(lm: Any, kv: dict[tuple[int, int], int]) -> MemoryResult:
    """The notebook's ``kv_after_prefill`` output ({(context, users): bytes}) as a :class:`MemoryResult`."""
    from ..hardware import detect

    first = min(c for c, _ in kv)
    points = [MemoryPoint("context", c, u, b, lm.weight_bytes) for (c, u), b in sorted(kv.items()) if u == 1]
    points += [MemoryPoint("users", c, u, b, lm.weight_bytes) for (c, u), b in sorted(kv.items())
               if c == first]
    info = detect(lm.device)
    return MemoryResult(points, info.memory_total_bytes, "GPU memory" if info.kind == "cuda" else "RAM",
                        lm.config.max_position_embeddings, predicted_kv_bytes_per_token(lm))


def run_memory(lm: Any, sizes: Sizes) -> MemoryResult:
    """Run the notebook's own experiment (``kv_after_prefill`` of ``infer_lab/notebooks/02_feel_the_pain.py``)."""
    experiment = notebook_function(NUMBER, "kv_after_prefill")
    return memory_result(lm, experiment(lm, sizes.contexts, sizes.users))


def prefill_flops(lm: Any, prompt_len: int) -> float:
    """FLOPs of one prefill of ``prompt_len`` tokens (batch 1, every position's logits), from the config."""
    shape, dtype = _shape_dtype(lm)
    ops = roofline.prefill_ops(shape, 1, prompt_len, weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype,
                               logits="all")
    return sum(o.flops for o in ops)


def ttft_prediction(lm: Any, lengths: tuple[int, ...]) -> str:
    """The prefill's FLOPs at the shortest and longest prompt: the work TTFT has to do."""
    a, b = min(lengths), max(lengths)
    fa, fb = prefill_flops(lm, a), prefill_flops(lm, b)
    return (f"**Predicted from the config:** a {a:,}-token prefill is {human(fa / 1e9, 3)} GFLOP, a {b:,}-token one "
            f"{human(fb / 1e9, 3)} GFLOP: **{human(fb / fa, 3)}× the work** for {human(b / a, 3)}× the tokens "
            "(attention's share grows with the square of the prompt). On a busy or tiny machine a short prefill "
            "also pays fixed per-call costs, so expect the measured ratio below that.")


def ttft_points(runs: dict[int, Any], repeats: int, machine: MachineLoad | None = None) -> list[TTFTPoint]:
    """The notebook's ``ttft_by_prompt`` output ({prompt_len: Stats in s}) as :class:`TTFTPoint` s, with
    the machine's load (``machine``, else one check taken now)."""
    machine = machine or check_machine()
    return [TTFTPoint(n, s.p50, s.p90, s.min, repeats, s.max, machine) for n, s in sorted(runs.items())]


def ttft_ratio(ttft: list[TTFTPoint]) -> float:
    """Measured TTFT p50 of the longest prompt over the shortest's."""
    return ttft[-1].p50_s / ttft[0].p50_s


def run_ttft(lm: Any, sizes: Sizes) -> list[TTFTPoint]:
    """Run the notebook's own experiment (``ttft_by_prompt`` of ``infer_lab/notebooks/02_feel_the_pain.py``)."""
    experiment = notebook_function(NUMBER, "ttft_by_prompt")
    before = check_machine()
    runs = experiment(lm, sizes.ttft_lengths, sizes.repeats)
    return ttft_points(runs, sizes.repeats, before.worst(check_machine()))


def serving_prediction(lm: Any, n_requests: int, prompt_len: int) -> str:
    """What the roofline says one batch of ``n_requests`` costs per decode step against one request."""
    shape, dtype = _shape_dtype(lm)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
    one = sum(o.bytes for o in roofline.decode_ops(shape, 1, prompt_len, **kw))
    many = sum(o.bytes for o in roofline.decode_ops(shape, n_requests, prompt_len, **kw))
    return (f"**Predicted:** one at a time, request *k* waits for the *k − 1* before it, so the last of "
            f"{n_requests} waits for {n_requests - 1} whole requests. A decode step over all {n_requests} reads "
            f"{human(many / one, 3)}× the bytes of a step over one (the weights are read once for everyone), so "
            f"a memory-bound machine would give up to **{human(n_requests * one / many, 3)}× the tokens/s** batched.")


def serving_result(times: dict[str, list[tuple[float, float, float]]], prompt_len: int,
                   new_tokens: int) -> ServingResult:
    """The notebook's ``serve_one_by_one_then_batched`` output ({mode: [(start, first token, finish) s]})."""
    requests = [RequestTimes(mode, i, *t) for mode, rows in times.items() for i, t in enumerate(rows)]
    wall = {mode: max(t[2] for t in rows) for mode, rows in times.items()}
    return ServingResult(requests, len(times["sequential"]), prompt_len, new_tokens, wall)


def run_serving(lm: Any, sizes: Sizes) -> ServingResult:
    """Run the notebook's own experiment (``serve_one_by_one_then_batched``)."""
    experiment = notebook_function(NUMBER, "serve_one_by_one_then_batched")
    times = experiment(lm, sizes.n_requests, sizes.prompt_len, sizes.new_tokens)
    return serving_result(times, sizes.prompt_len, sizes.new_tokens)


def decode_bytes(lm: Any, batch: int, context: int) -> float:
    """Bytes one decode step reads and writes (weights, KV, activations), from the config."""
    shape, dtype = _shape_dtype(lm)
    return sum(o.bytes for o in roofline.decode_ops(shape, batch, context, weight_dtype=dtype, kv_dtype=dtype,
                                                    act_dtype=dtype))


@dataclass(frozen=True)
class ITLPlan:
    """Which (context, batch) points of the decode sweep fit in the device's memory, and which do not.

    A point fits when the weights, the KV of ``batch`` sequences of ``context`` + the decoded tokens
    and the activations of their one prefill fit, by :func:`infer_lab.analysis.memory.fit` (its
    default usable fraction and runtime reserve), in ``memory_bytes``.
    """

    measured: list[tuple[int, int]]  # (context tokens, batch) that fit, in sweep order
    left_out: list[tuple[int, int]]  # (context tokens, batch) whose memory would not fit
    memory_bytes: int
    memory_label: str  # "GPU memory" or "RAM"


def itl_plan_for(model: memory.ModelLike, dtype: str, contexts: tuple[int, ...], batches: tuple[int, ...],
                 steps: int, memory_bytes: int, memory_label: str) -> ITLPlan:
    """The decode sweep's points that fit in ``memory_bytes`` (bytes) for ``model`` in ``dtype``
    (weights and KV), decoding ``steps`` tokens after the prefill's first one."""
    measured, left_out = [], []
    for context in contexts:
        for batch in batches:
            report = memory.fit(model, memory_bytes, context + steps + 1, users=batch, weight_dtype=dtype,
                                kv_dtype=dtype, prefill_chunk=batch * context)  # the whole batch prefills at once
            (measured if report.fits else left_out).append((context, batch))
    return ITLPlan(measured, left_out, memory_bytes, memory_label)


def itl_plan(lm: Any, contexts: tuple[int, ...], batches: tuple[int, ...], steps: int) -> ITLPlan:
    """:func:`itl_plan_for` with the loaded model's config and dtype and its device's total memory."""
    from ..hardware import detect

    shape, dtype = _shape_dtype(lm)
    info = detect(lm.device)
    return itl_plan_for(shape, dtype, contexts, batches, steps, info.memory_total_bytes,
                        "GPU memory" if info.kind == "cuda" else "RAM")


def left_out_text(plan: ITLPlan) -> str:
    """Which sweep points are skipped because their memory would not fit ('' when none is)."""
    if not plan.left_out:
        return ""
    points = ", ".join(f"batch {b:,} at {c:,} tokens" for c, b in plan.left_out)
    return (f" Left out of the sweep: {points}: weights, KV and the prefill's activations would not fit in this "
            f"machine's {plan.memory_label} ({plan.memory_bytes / GB:.1f} GB).")


def itl_prediction(lm: Any, plan: ITLPlan) -> str:
    """Bytes a decode step moves at the smallest and the largest measured (context, batch), before anything runs."""
    if not plan.measured:
        return "**Nothing in this sweep fits in memory.**" + left_out_text(plan)
    c = min(context for context, _ in plan.measured)
    b = min(batch for context, batch in plan.measured if context == c)
    big_c, big_b = max(plan.measured, key=lambda point: (point[0] * point[1], point[1]))
    small, big = decode_bytes(lm, b, c), decode_bytes(lm, big_b, big_c)
    return (f"**Predicted from the config:** a decode step at batch {b:,} and {c:,} tokens moves "
            f"{human(small / 1e6, 3)} MB (nearly all of it weights); at batch {big_b:,} and {big_c:,} tokens "
            f"{human(big / 1e6, 3)} MB, **{human(big / small, 3)}×** the bytes for {human(big_b / b, 3)}× the tokens. "
            "If the step waits on memory, its time grows like the bytes and the total tokens/s grows almost with "
            "the batch." + left_out_text(plan))


def itl_points(runs: dict[tuple[int, int], tuple[Any, int]]) -> list[ITLPoint]:
    """The notebook's ``decode_step_times`` output ({(context, batch): (Stats in s, KV bytes)});
    ``steps`` is how many decode steps were timed (one per token after the first)."""
    return [ITLPoint(c, b, s.p50, s.p90, s.n, kv) for (c, b), (s, kv) in sorted(runs.items())]


def run_itl(lm: Any, sizes: Sizes) -> list[ITLPoint]:
    """Run the notebook's own experiment (``decode_step_times`` of ``infer_lab/notebooks/02_feel_the_pain.py``)."""
    experiment = notebook_function(NUMBER, "decode_step_times")
    plan = itl_plan(lm, sizes.itl_contexts, sizes.itl_batches, sizes.itl_steps)
    return itl_points(experiment(lm, plan.measured, sizes.itl_steps))


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`): the notebook's experiments."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "memory": lambda: run_memory(lm, sizes),
        "ttft": lambda: run_ttft(lm, sizes),
        "serving": lambda: run_serving(lm, sizes),
        "itl": lambda: run_itl(lm, sizes),
    })


def verdict(outcome: str, claim: str, opposite: str, machine: MachineLoad, spread: str) -> str:
    """The verdict of a timed part: :func:`~infer_lab.course.chapter.finding`, except that a run
    pointing the other way on a machine not found busy is reported as what it measured.

    ``claim`` is the lesson as a sentence without its full stop, ``opposite`` what the run showed
    when it points the other way, ``spread`` the evidence. A busy machine explains a contradiction
    (``finding`` says *inconclusive*); a quiet one does not, so the page says what was measured.
    """
    if outcome != CONTRADICTED or machine.busy:
        return finding(outcome, claim, machine, spread)
    return (f"**This run measured the opposite:** {opposite} ({spread}). {machine.text()} One run can be an "
            "accident: press the button again. If it holds, it is this machine's result at these sizes, and the "
            "numbers below say by how much.")


def ttft_text(ttft: list[TTFTPoint], machine: MachineLoad | None = None) -> str:
    """Whether TTFT grew from the shortest to the longest prompt beyond the repeats' spread, with
    the machine's load (``machine``, else the check stored with the points, else one taken now)."""
    a, b = ttft[0], ttft[-1]
    machine = machine or a.machine or check_machine()
    outcome = compare_spreads([a.min_s, a.max_s if a.max_s is not None else a.p90_s],
                              [b.min_s, b.max_s if b.max_s is not None else b.p90_s])
    numbers = (f"TTFT p50 was {a.p50_s * 1e3:,.1f} ms at {a.prompt_len:,} tokens and {b.p50_s * 1e3:,.1f} ms at "
               f"{b.prompt_len:,} tokens ({a.repeats} runs each).")
    claim = f"TTFT grows with the prompt, from {a.prompt_len:,} to {b.prompt_len:,} tokens"
    opposite = f"TTFT fell from {a.prompt_len:,} to {b.prompt_len:,} tokens"
    spread = f"beyond the spread of {a.repeats} runs per length, fastest to slowest"
    return verdict(outcome, claim, opposite, machine, spread) + " " + numbers


def guess_line(what: str, guess: float | None, predicted: float, measured: float) -> str:
    """Your guess, the prediction and the measurement of one ratio, side by side."""
    mine = f"your guess **{human(guess, 3)}×**, " if guess else ""  # 0 or None: no guess entered
    return (f"{what}: {mine}predicted **{human(predicted, 3)}×**, measured **{human(measured, 3)}×** "
            f"(measured ÷ predicted = {human(measured / predicted, 3)}).")


def ttft_compare_text(lm: Any, ttft: list[TTFTPoint], guess: float | None = None) -> str:
    """The longest prompt's TTFT over the shortest's: guess, the prefill FLOPs ratio, measured."""
    a, b = ttft[0].prompt_len, ttft[-1].prompt_len
    return guess_line(f"TTFT at {b:,} tokens ÷ TTFT at {a:,}", guess, prefill_flops(lm, b) / prefill_flops(lm, a),
                      ttft_ratio(ttft))


def serving_compare_text(lm: Any, serving: ServingResult, guess: float | None = None) -> str:
    """Batched over sequential tokens/s: guess, the roofline's bound, measured."""
    n, c = serving.n_requests, serving.prompt_len
    bound = n * decode_bytes(lm, 1, c) / decode_bytes(lm, n, c)
    return guess_line(f"tokens/s of one batch of {n} ÷ one request at a time", guess, bound, serving.speedup)


# ---------------------------------------------------------------------------------------------
# Words, tables and figures


def memory_text(memory: MemoryResult) -> str:
    per_token = memory.kv_bytes_per_token
    predicted = memory.predicted_kv_bytes_per_token
    growth = ""
    ctx = [p for p in memory.points if p.axis == "context"]
    users = [p for p in memory.points if p.axis == "users"]
    if len(ctx) > 1:
        growth += (f"{human(ctx[-1].context / ctx[0].context, 3)}× the context ({ctx[0].context:,} → {ctx[-1].context:,} tokens) "
                   f"gave **{ctx[-1].kv_bytes / ctx[0].kv_bytes:.2f}×** the KV bytes; ")
    if len(users) > 1:
        growth += (f"{human(users[-1].users / users[0].users, 3)}× the users gave **{users[-1].kv_bytes / users[0].kv_bytes:.2f}×**. ")
    check = ("" if predicted is None else
             f"The config predicted {predicted:,} B per token: measured ÷ predicted = {per_token / predicted:.3f}. ")
    return growth + check + (
        f"Measured: **{per_token:,.0f} bytes of KV per token** ({per_token / 1024:.1f} KiB). At this rate "
        f"the {memory.device_memory_label} of this machine ({memory.device_memory_bytes / GB:.1f} GB) "
        f"holds about **{memory.tokens_that_fit:,.0f} tokens** of KV beside the weights, shared by all users, "
        "before anything else is counted."
    )


def serving_text(serving: ServingResult, machine: MachineLoad | None = None) -> str:
    """The verdict (does one batch beat one request at a time?) with the machine's load, then the numbers."""
    machine = machine or check_machine()
    outcome = noise_outcome(serving.speedup)
    verdict_text = verdict(outcome, "one padded batch serves more tokens per second than one request at a time",
                           "one padded batch served fewer tokens per second than one request at a time", machine,
                           f"one run of each: a ratio within {SINGLE_RUN_NOISE:.0%} of 1 is one run's noise")
    return verdict_text + " " + (
        f"One padded batch gives **{serving.speedup:.2f}×** the throughput of one request at a time here "
        f"({serving.tokens_per_s('sequential'):.1f} → {serving.tokens_per_s('batched'):.1f} output tokens/s), "
        f"and the mean request finishes at {serving.mean_finish_s('batched'):.2f} s instead of "
        f"{serving.mean_finish_s('sequential'):.2f} s. One static batch is not the end of the story: "
        f"chapter {chapter_number('batching')} shows continuous batching."
    )


def noise_outcome(ratio: float) -> str:
    """SUPPORTED when a ratio of throughputs (the lesson's side over the other) is at least one run's noise
    (``SINGLE_RUN_NOISE``) above 1, CONTRADICTED when its inverse is, else INCONCLUSIVE. The band is the
    same both ways (0.9 is as far from 1 as 1/0.9), judged at the two decimals the page prints."""
    if round(max(ratio, 1 / ratio), 2) < round(1 + SINGLE_RUN_NOISE, 2):
        return INCONCLUSIVE
    return SUPPORTED if ratio > 1 else CONTRADICTED


def itl_batch_pairs(itl: list[ITLPoint]) -> list[tuple[ITLPoint, ITLPoint]]:
    """(smallest batch, largest batch) at each context the sweep measured with two batches or more,
    shortest context first: the like-for-like comparisons of the batch's effect."""
    pairs = []
    for context in sorted({p.context for p in itl}):
        at_context = sorted((p for p in itl if p.context == context), key=lambda p: p.batch)
        if len(at_context) > 1:
            pairs.append((at_context[0], at_context[-1]))
    return pairs


def itl_text(itl: list[ITLPoint], machine: MachineLoad | None = None) -> str:
    """The verdict (does a bigger batch give more tokens/s in total?) with the machine's load, then the
    numbers: batches compared at the same context, one context at a time (:func:`itl_batch_pairs`)."""
    machine = machine or check_machine()
    pairs = itl_batch_pairs(itl)
    claim = "a decode step over a bigger batch yields more tokens per second in total"
    if not pairs:
        return finding(INCONCLUSIVE, claim, machine, "one batch size per context, so no two batches to compare")
    outcomes = [noise_outcome(big.tokens_per_s_total / small.tokens_per_s_total) for small, big in pairs]
    wins, losses = outcomes.count(SUPPORTED), outcomes.count(CONTRADICTED)
    ties = len(pairs) - wins - losses
    outcome = SUPPORTED if wins == len(pairs) else CONTRADICTED if losses == len(pairs) else INCONCLUSIVE
    spread = (f"step p50 of each point, batches compared at the same context: the bigger batch won at "
              f"{wins} of {count(len(pairs), 'context')}")
    opposite = "at every context, the bigger batch yielded fewer tokens per second in total"
    numbers = "; ".join(
        f"at {small.context:,} tokens, batch {big.batch:,} gave {human(big.tokens_per_s_total, 3)} tokens/s in total "
        f"against {human(small.tokens_per_s_total, 3)} at batch {small.batch:,} "
        f"({human(big.tokens_per_s_total / small.tokens_per_s_total, 3)}× the total tokens/s for "
        f"{human(big.p50_s / small.p50_s, 3)}× the step time)" for small, big in pairs)
    said = (contexts_disagree_text(claim, wins, losses, ties, machine) if outcome == INCONCLUSIVE and wins + losses
            else verdict(outcome, claim, opposite, machine, spread + (
                f", within one run's noise ({SINGLE_RUN_NOISE:.0%}) at every one" if ties == len(pairs) else "")))
    return said + " " + numbers[0].upper() + numbers[1:] + "."


def contexts_disagree_text(claim: str, wins: int, losses: int, ties: int, machine: MachineLoad) -> str:
    """The ITL verdict when the contexts point different ways: the bigger batch won (by more than one run's
    noise) at ``wins`` contexts, lost at ``losses`` and tied within that noise at ``ties``. That is not a
    spread wider than the effect, so the tally is said as it is."""
    tally = [f"{verb} at {n}" for verb, n in (("won", wins), ("lost", losses),
                                              (f"was within one run's noise ({SINGLE_RUN_NOISE:.0%})", ties)) if n]
    said = ", ".join(tally[:-1]) + f" and {tally[-1]}" if len(tally) > 1 else tally[0]
    return (f"**Inconclusive on this run:** the contexts disagree (the bigger batch {said} of "
            f"{count(wins + losses + ties, 'context')}), so it cannot show that {claim} at every context. "
            f"{machine.text()} Press the button again; if they still disagree, whether a bigger batch pays depends "
            "on the context at these sizes, and the numbers say where.")


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.memory:
        lines.append(memory_text(result.memory))
    if result.ttft:
        lines.append(ttft_text(result.ttft))
    if result.serving:
        lines.append(serving_text(result.serving))
    if result.itl:
        lines.append(itl_text(result.itl))
    return "\n\n".join(lines)


MEMORY_COLUMNS = [
    Column("axis", "sweep", "text"), Column("context", "context (tokens)", "int"),
    Column("users", "users", "int"), Column("kv_bytes", "KV", "bytes"),
    Column("kv_bytes_per_token", "KV per token (B)", "int"), Column("weight_bytes", "weights", "bytes"),
]
TTFT_COLUMNS = [
    Column("prompt_len", "prompt (tokens)", "int"), Column("p50_s", "TTFT p50 (ms)", scale=1e3),
    Column("p90_s", "TTFT p90 (ms)", scale=1e3), Column("repeats", "runs", "int"),
]
ITL_COLUMNS = [
    Column("context", "context (tokens)", "int"), Column("batch", "batch", "int"),
    Column("p50_s", "step p50 (ms)", scale=1e3), Column("p90_s", "step p90 (ms)", scale=1e3),
    Column("tokens_per_s_total", "tokens/s total"), Column("tokens_per_s_per_user", "tokens/s per user"),
]


def serving_rows(serving: ServingResult) -> list[dict[str, Any]]:
    return [{"mode": m, "wall_s": serving.wall_s[m], "tokens_per_s": serving.tokens_per_s(m),
             "mean_finish_s": serving.mean_finish_s(m)} for m in ("sequential", "batched")]


SERVING_COLUMNS = [
    Column("mode", "serving", "text"), Column("wall_s", "all done (s)"),
    Column("tokens_per_s", "output tokens/s"), Column("mean_finish_s", "mean finish (s)"),
]


def memory_table(memory: MemoryResult):
    return people_table(memory.points, MEMORY_COLUMNS)


def ttft_table(ttft: list[TTFTPoint]):
    return people_table(ttft, TTFT_COLUMNS)


def serving_table(serving: ServingResult):
    return people_table(serving_rows(serving), SERVING_COLUMNS)


def itl_table(itl: list[ITLPoint]):
    return people_table(itl, ITL_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.memory:
        out["KV memory, measured from the cache tensors"] = memory_table(result.memory)
    if result.ttft:
        out["Time to first token"] = ttft_table(result.ttft)
    if result.serving:
        out["Sequential vs batched serving"] = serving_table(result.serving)
    if result.itl:
        out["Decode step (ITL) by context and batch"] = itl_table(result.itl)
    return out


def users_panel_context(memory: MemoryResult) -> int:
    """Tokens per user in the figure's "users" panel: the context its dots were measured at."""
    users = [p for p in memory.points if p.axis == "users"]
    return users[0].context if users else memory.points[0].context


def memory_figure(memory: MemoryResult, source: str):
    """Weights + KV vs context (1 user) and vs users, in GB (1e9 B), on log axes.

    Dots are measured after a real prefill; the line extends the measured bytes per token and
    says so, to show where the device memory runs out. In the users panel every user has the
    context the dots were measured at (:func:`users_panel_context`), so the dots sit on the line.
    """
    import numpy as np

    from ..figures import subplots

    per_token, weights = memory.kv_bytes_per_token, memory.weight_bytes
    budget = memory.device_memory_bytes
    users_context = users_panel_context(memory)
    users_full = (budget - weights) / (per_token * users_context)  # users at which the memory is full
    users_max = max(1024, 2 * users_full)
    fig, axes = subplots(1, 2, figsize=(10, 3.8), sharey=True)
    panels = ((axes[0], "context", max(memory.max_context, max(p.context for p in memory.points)), 1,
               "context length (tokens), 1 user", "measured after a prefill, 1 user"),
              (axes[1], "users", users_max, users_context, f"concurrent users at {users_context:,} tokens each",
               f"measured after a prefill at {users_context:,} tokens"))
    for ax, axis, x_max, tokens_per_x, xlabel, dots_label in panels:
        x = np.geomspace(1, x_max, 200)
        ax.plot(x, (weights + per_token * tokens_per_x * x) / GB, color="tab:red",
                label=f"weights + KV (extrapolated from the measured {per_token:,.0f} B/token)")
        ax.axhline(weights / GB, color="tab:gray", lw=1, label=f"weights ({weights / GB:.2f} GB)")
        measured = [p for p in memory.points if p.axis == axis]
        ax.plot([p.context if axis == "context" else p.users for p in measured],
                [(p.weight_bytes + p.kv_bytes) / GB for p in measured], "ko", label=dots_label)
        ax.axhline(budget / GB, color="k", ls="--", lw=1,
                   label=f"{memory.device_memory_label} ({budget / GB:.1f} GB)")
        limit = (budget - weights) / (per_token * tokens_per_x)
        if 1 <= limit <= x_max:
            ax.axvline(limit, color="k", ls=":", lw=1)
            # right of the line and below the budget: the curve has already left that corner
            ax.annotate(f"full at {limit:,.0f}", (limit, budget / GB), textcoords="offset points",
                        xytext=(5, -14), ha="left", fontsize=8,
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.9))
        ax.set(xscale="log", yscale="log", xlabel=xlabel)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("GB (10⁹ bytes), log scale")
    fig.suptitle(f"Memory grows with tokens and users: {source}", fontsize=10)
    finish(fig)
    return fig


def ttft_figure(ttft: list[TTFTPoint], source: str, saved: list[dict[str, Any]] | None = None,
                saved_label: str = ""):
    """TTFT p50 (band to p90) vs prompt length; optionally a saved GPU curve beside it."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(6, 3.6))
    x = [p.prompt_len for p in ttft]
    ax.plot(x, [p.p50_s * 1e3 for p in ttft], "o-", label="this machine (p50)")
    ax.fill_between(x, [p.p50_s * 1e3 for p in ttft], [p.p90_s * 1e3 for p in ttft], alpha=0.2, label="p50 to p90")
    if saved:
        ax.plot([r["ctx"] for r in saved], [r["ttft_ms"] for r in saved], "s--", label=saved_label)
    ax.set(xscale="log", yscale="log", xlabel="prompt length (tokens)", ylabel="time to first token (ms)")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.set_title(f"TTFT vs prompt length\n{source}", fontsize=10)
    finish(fig)
    return fig


def serving_figure(serving: ServingResult, source: str):
    """Each request's wait, prefill and decode: one at a time vs one batch."""
    from ..figures import subplots

    fig, axes = subplots(1, 2, figsize=(10, 3.2), sharex=True)
    for ax, mode in zip(axes, ("sequential", "batched"), strict=True):
        rows = [r for r in serving.requests if r.mode == mode]
        for r in rows:
            first = r.request == 0
            ax.barh(r.request, r.start_s, color="lightgray", label="waiting" if first else None)
            ax.barh(r.request, r.first_token_s - r.start_s, left=r.start_s, color="tab:orange",
                    label="prefill (TTFT)" if first else None)
            ax.barh(r.request, r.finish_s - r.first_token_s, left=r.first_token_s, color="tab:blue",
                    label="decode" if first else None)
        ax.set_title(f"{mode}: {serving.tokens_per_s(mode):.1f} output tokens/s", fontsize=10)
        ax.set(xlabel="seconds since all requests arrived", ylabel="request")
        ax.set_yticks([r.request for r in rows])
        ax.invert_yaxis()
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Naive serving is sequential ({serving.n_requests} requests, {serving.prompt_len} in / "
                 f"{serving.new_tokens} out): {source}", fontsize=10)
    finish(fig)
    return fig


def itl_figure(itl: list[ITLPoint], source: str):
    """Decode step p50 vs batch (one line per context), and total vs per-user tokens/s."""
    from ..figures import subplots

    fig, axes = subplots(1, 2, figsize=(10, 3.6))
    for ctx in sorted({p.context for p in itl}):
        line = sorted((p for p in itl if p.context == ctx), key=lambda p: p.batch)
        axes[0].plot([p.batch for p in line], [p.p50_s * 1e3 for p in line], "o-", label=f"context {ctx:,}")
        axes[1].plot([p.tokens_per_s_per_user for p in line], [p.tokens_per_s_total for p in line], "o-",
                     label=f"context {ctx:,}")
    axes[0].set_xscale("log", base=2)
    axes[0].set(xlabel="batch size (sequences decoded together)", ylabel="decode step, p50 (ms)", ylim=(0, None))
    axes[0].legend(fontsize=8)
    axes[1].set(xlabel="tokens/s per user", ylabel="tokens/s total", title="throughput vs per-user speed",
                xlim=(0, None), ylim=(0, None))
    fig.suptitle(f"Inter-token latency vs context and batch: {source}", fontsize=10)
    finish(fig)
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.memory:
        out["memory"] = memory_figure(result.memory, result.model)
    if result.ttft:
        out["ttft"] = ttft_figure(result.ttft, result.model)
    if result.serving:
        out["serving"] = serving_figure(result.serving, result.model)
    if result.itl:
        out["itl"] = itl_figure(result.itl, result.model)
    return out


# ---------------------------------------------------------------------------------------------
# The saved GPU baseline

def saved_warning(data: dict[str, Any]) -> str:
    """Why the saved HF baseline must not be read for its shape, with its own numbers."""
    ctx, batch = data["ctx_sweep"], {r["batch"]: r for r in data["batch_sweep"]}
    b1, b_next = batch[min(batch)], batch[sorted(batch)[1]]
    return (
        f"this run is noisy and launch-bound: its ITL *falls* from {ctx[0]['itl_ms']:.0f} ms at "
        f"{ctx[0]['ctx']:,} tokens to {ctx[-1]['itl_ms']:.0f} ms at {ctx[-1]['ctx']:,}, and its decode step "
        f"jumps from {b1['step_ms']:.0f} ms at batch {b1['batch']} to {b_next['step_ms']:.0f} ms at batch "
        f"{b_next['batch']}, then stays flat. Read it only as 'HF eager decode costs tens of ms per step, "
        "far above the weight-streaming time'; draw no conclusion from its shape until it is re-measured."
    )


def saved_batch1_steps_ms(data: dict[str, Any]) -> tuple[float, float]:
    """(fastest, slowest) batch-1 decode step of the saved HF baseline, over every row that has one
    (its context sweep and its batch sweep): the one way chapters quote that noisy run."""
    steps = [r["itl_ms"] for r in data["ctx_sweep"]] + [r["step_ms"] for r in data["batch_sweep"] if r["batch"] == 1]
    return min(steps), max(steps)


def saved_batch1_text(data: dict[str, Any], roof_ms: float) -> str:
    """The saved HF eager batch-1 step as a range against ``roof_ms`` (the roofline's step, ms)."""
    lo, hi = saved_batch1_steps_ms(data)
    return (f"between **{lo:.0f} and {hi:.0f} ms** ({lo / roof_ms:.0f}–{hi / roof_ms:.0f}× the roofline's "
            f"{roof_ms:.1f} ms) across that run's batch-1 rows; the run is noisy, so it is quoted as a range, "
            "never as one row")


def saved() -> SavedView | None:
    """The saved H200 HF-eager baseline (Mistral-7B shape, random bf16 weights), with its caution."""
    found = load_saved("h200-hf-baseline-*.json")
    if not found:
        return None
    src = found[0]
    d = src.data
    ctx = people_table(d["ctx_sweep"], [
        Column("ctx", "context (tokens)", "int"), Column("ttft_ms", "TTFT (ms)"),
        Column("itl_ms", "ITL (ms)"), Column("peak_GB", "peak memory (GB)"),
    ])
    batch = people_table(d["batch_sweep"], [
        Column("batch", "batch", "int"), Column("step_ms", "decode step (ms)"),
        Column("tok_s_total", "tokens/s total"), Column("tok_s_user", "tokens/s per user"),
    ])
    return SavedView(
        title=f"HF transformers eager on {src.device}: {src.raw.get('model')} ({src.raw.get('weights')} weights)",
        source=src,
        tables={"TTFT and ITL by context, batch 1": ctx, "Decode step by batch, context 512": batch},
        notes=[f"Measured by: {src.command}"],
        warning=saved_warning(d),
    )
