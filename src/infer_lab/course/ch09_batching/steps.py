"""Section 1 of chapter 09: static vs continuous batching, step by step (the notebook's ``serve``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...bench.engine import workload
from ...engine.scheduler import Scheduler
from ...figures import finish, subplots
from ..library_code import code_block
from ..notebook_code import notebook_function
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


POLICIES = ("static", "continuous")
LONG_SHARE = 0.25  # share of long answers in the step-by-step workload


def skewed_output_lens(n: int, top: int, seed: int) -> list[int]:
    """``n`` output lengths (tokens), seeded and skewed like real answers: most are short, a few long.

    One in four (:data:`LONG_SHARE`) gets ``top`` tokens and the rest 2 .. ``top // 4``. A static
    batch then runs as long as its longest member while its short ones sit done.
    """
    rng = random.Random(seed)
    return [top if rng.random() < LONG_SHARE else rng.randint(2, max(2, top // 4)) for _ in range(n)]


def steps_requests(lm: Any, sizes: Sizes) -> tuple[list[list[int]], list[int]]:
    """Prompt token ids and output lengths (:func:`skewed_output_lens`) for the step-by-step part, seeded."""
    lens = skewed_output_lens(sizes.steps_requests, sizes.steps_max_output, sizes.seed)
    prompts = workload(lm, sizes.steps_requests, sizes.prompt_len, seed=sizes.seed)
    return prompts, lens


@dataclass(frozen=True)
class StepsResult:
    """Both policies' step records (:class:`~infer_lab.engine.StepRecord`) on the same requests."""

    slots: int
    output_lens: tuple[int, ...]
    runs: dict[str, list[Any]]


def run_steps(lm: Any, sizes: Sizes, slots: int | None = None) -> StepsResult:
    """Run the notebook's own experiment (``serve`` of ``infer_lab/notebooks/09_batching.py``) for both
    policies, with ``slots`` batch slots (default ``sizes.steps_slots``, the number the notebook's cell starts at)."""
    serve = notebook_function(NUMBER, "serve")
    slots = slots or sizes.steps_slots
    prompts, lens = steps_requests(lm, sizes)
    runs = {policy: serve(lm, prompts, lens, policy, max_num_seqs=slots) for policy in POLICIES}
    return StepsResult(slots, tuple(lens), runs)


def idle_slot_steps(records: Sequence[Any]) -> int:
    """Slot-steps nobody used: the sum of each step's idle slots."""
    return sum(r.idle_slots for r in records)


def admission_code() -> str:
    """The scheduler's admission step, the library's real code (its docstring left out, the words
    around it on the page say the same), as a markdown code block."""
    return code_block(Scheduler.admit)


def steps_text(runs: dict[str, list[Any]], slots: int) -> str:
    """Steps and idle slots of both policies, every number from the engine's step records."""
    static, cont = runs["static"], runs["continuous"]
    s_idle, c_idle = idle_slot_steps(static), idle_slot_steps(cont)
    return (f"With **{slots} slots**, static batching took **{len(static)} steps** and continuous batching "
            f"**{len(cont)}**: static took **{len(static) / len(cont):.2f}×** the steps for the same tokens. "
            f"Static left {s_idle} of its {len(static) * slots} slot-steps idle ({s_idle / len(static):.2f} "
            f"slots per step), continuous {c_idle} of {len(cont) * slots} ({c_idle / len(cont):.2f} per step). "
            "A static batch runs as long as its longest request, so its short ones finish and wait; "
            "continuous batching gives a freed slot to the next request in the very next step. "
            "The gap needs more requests than slots: with as many slots as requests both policies admit "
            "everyone in the first step and take the same steps, and with one slot both serve one request "
            "at a time.")


def steps_figure(runs: dict[str, list[Any]], slots: int, source: str = ""):
    """Per step, the slots each policy filled and the ones it left idle (grey)."""
    fig, axes = subplots(len(runs), 1, figsize=(10, 1.9 * len(runs) + 0.6), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for ax, (policy, records) in zip(axes, runs.items(), strict=True):
        steps = range(len(records))
        busy = [r.num_seqs for r in records]
        ax.bar(steps, busy, width=1.0, color="tab:blue" if policy == "continuous" else "tab:orange",
               label="running requests")
        ax.bar(steps, [r.idle_slots for r in records], bottom=busy, width=1.0, color="0.85", label="idle slots")
        ax.set_ylim(0, slots)
        ax.set_ylabel("batch slots")
        ax.set_title(f"{policy} batching: {len(records)} steps, {idle_slot_steps(records)} idle slot-steps",
                     fontsize=10, loc="left")
    axes[-1].set_xlabel("engine step")
    fig.suptitle(f"Who ran each step, {slots} slots" + (f": {source}" if source else ""), fontsize=9,
                 x=0.01, ha="left")
    finish(fig)
    fig.subplots_adjust(top=0.86)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper right", fontsize=8, ncols=2, frameon=False)
    return fig
