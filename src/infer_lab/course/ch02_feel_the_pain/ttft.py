"""Section 2 of chapter 02: time to first token grows with the prompt (the notebook's ``ttft_by_prompt``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...analysis import roofline
from ...figures import finish, subplots
from ...timing import MachineLoad, compare_spreads
from ...units import human
from ..chapter import check_machine
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes
from .shared import _shape_dtype, guess_line, verdict


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


def ttft_compare_text(lm: Any, ttft: list[TTFTPoint], guess: float | None = None) -> str:
    """The longest prompt's TTFT over the shortest's: guess, the prefill FLOPs ratio, measured."""
    a, b = ttft[0].prompt_len, ttft[-1].prompt_len
    return guess_line(f"TTFT at {b:,} tokens ÷ TTFT at {a:,}", guess, prefill_flops(lm, b) / prefill_flops(lm, a),
                      ttft_ratio(ttft))


TTFT_COLUMNS = [
    Column("prompt_len", "prompt (tokens)", "int"), Column("p50_s", "TTFT p50 (ms)", scale=1e3),
    Column("p90_s", "TTFT p90 (ms)", scale=1e3), Column("repeats", "runs", "int"),
]


def ttft_table(ttft: list[TTFTPoint]):
    return people_table(ttft, TTFT_COLUMNS)


def ttft_figure(ttft: list[TTFTPoint], source: str, saved: list[dict[str, Any]] | None = None,
                saved_label: str = ""):
    """TTFT p50 (band to p90) vs prompt length; optionally a saved GPU curve beside it."""
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
