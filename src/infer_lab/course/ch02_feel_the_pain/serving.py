"""Section 3 of chapter 02: naive serving is sequential (the notebook's ``serve_one_by_one_then_batched``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis import roofline
from ...figures import finish, subplots
from ...timing import MachineLoad
from ...units import human
from ..chapter import chapter_number, check_machine
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes
from .shared import _shape_dtype, decode_bytes, guess_line, noise_band_text, noise_outcome, verdict


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


def serving_compare_text(lm: Any, serving: ServingResult, guess: float | None = None) -> str:
    """Batched over sequential tokens/s: guess, the roofline's bound, measured."""
    n, c = serving.n_requests, serving.prompt_len
    bound = n * decode_bytes(lm, 1, c) / decode_bytes(lm, n, c)
    return guess_line(f"tokens/s of one batch of {n} ÷ one request at a time", guess, bound, serving.speedup)


def serving_text(serving: ServingResult, machine: MachineLoad | None = None) -> str:
    """The verdict (does one batch beat one request at a time?) with the machine's load, then the numbers."""
    machine = machine or check_machine()
    outcome = noise_outcome(serving.speedup)
    verdict_text = verdict(outcome, "one padded batch serves more tokens per second than one request at a time",
                           "one padded batch served fewer tokens per second than one request at a time", machine,
                           f"one run of each: a ratio {noise_band_text()} is one run's noise")
    return verdict_text + " " + (
        f"One padded batch gives **{serving.speedup:.2f}×** the throughput of one request at a time here "
        f"({serving.tokens_per_s('sequential'):.1f} → {serving.tokens_per_s('batched'):.1f} output tokens/s), "
        f"and the mean request finishes at {serving.mean_finish_s('batched'):.2f} s instead of "
        f"{serving.mean_finish_s('sequential'):.2f} s. One static batch is not the end of the story: "
        f"chapter {chapter_number('batching')} shows continuous batching."
    )


def serving_rows(serving: ServingResult) -> list[dict[str, Any]]:
    return [{"mode": m, "wall_s": serving.wall_s[m], "tokens_per_s": serving.tokens_per_s(m),
             "mean_finish_s": serving.mean_finish_s(m)} for m in ("sequential", "batched")]


SERVING_COLUMNS = [
    Column("mode", "serving", "text"), Column("wall_s", "all done (s)"),
    Column("tokens_per_s", "output tokens/s"), Column("mean_finish_s", "mean finish (s)"),
]


def serving_table(serving: ServingResult):
    return people_table(serving_rows(serving), SERVING_COLUMNS)


def serving_figure(serving: ServingResult, source: str):
    """Each request's wait, prefill and decode: one at a time vs one batch."""
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
