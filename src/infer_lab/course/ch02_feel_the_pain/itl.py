"""Section 4 of chapter 02: the decode step (inter-token latency) by context and batch (the notebook's
``decode_step_times``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis import memory
from ...figures import finish, subplots
from ...hardware import detect
from ...timing import CONTRADICTED, INCONCLUSIVE, SUPPORTED, MachineLoad
from ...units import GB, count, human
from ..chapter import check_machine
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes
from .shared import _shape_dtype, decode_bytes, noise_band_text, noise_outcome, verdict


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
    numbers: batches compared at the same context, one context at a time (:func:`itl_batch_pairs`), each
    ratio read as a win, a loss or a tie within one run's noise (:func:`noise_outcome`)."""
    machine = machine or check_machine()
    pairs = itl_batch_pairs(itl)
    claim = "a decode step over a bigger batch yields more tokens per second in total"
    if not pairs:
        return ("**Not compared on this run:** every context has one batch size, so no two batches can be "
                "compared (the sweep's plan says which points memory left out).")
    ratios = [big.tokens_per_s_total / small.tokens_per_s_total for small, big in pairs]
    outcomes = [noise_outcome(r) for r in ratios]
    numbers = "; ".join(
        f"at {small.context:,} tokens, batch {big.batch:,} gave {human(big.tokens_per_s_total, 3)} tokens/s in total "
        f"against {human(small.tokens_per_s_total, 3)} at batch {small.batch:,} "
        f"({ratio:.2f}× the total tokens/s for {human(big.p50_s / small.p50_s, 3)}× the step time)"
        for (small, big), ratio in zip(pairs, ratios, strict=True))
    return itl_verdict(claim, outcomes, machine) + " " + numbers[0].upper() + numbers[1:] + "."


def itl_verdict(claim: str, outcomes: list[str], machine: MachineLoad) -> str:
    """The ITL headline from one outcome per context (SUPPORTED: the bigger batch won by more than one
    run's noise; CONTRADICTED: it lost by as much; INCONCLUSIVE: a tie). Every context the same way is
    :func:`verdict`'s; a mix is said as its tally, a loss always named as one."""
    n = len(outcomes)
    wins, losses = outcomes.count(SUPPORTED), outcomes.count(CONTRADICTED)
    ties = n - wins - losses
    contexts = count(n, "context")
    band = f"within one run's noise ({noise_band_text()})"
    if wins == n or losses == n or ties == n:
        spread = (f"step p50 of each point, batches compared at the same context: the bigger batch won at {wins} "
                  f"of {contexts}" + (f", {band} at every one" if ties == n else ""))
        outcome = SUPPORTED if wins == n else CONTRADICTED if losses == n else INCONCLUSIVE
        return verdict(outcome, claim, "at every context, the bigger batch yielded fewer tokens per second in total",
                       machine, spread)
    again = (" Close other programs and press the button again." if machine.busy else
             " Press the button again.")
    if wins and losses:
        tally = [f"won at {wins}", f"lost at {losses}"] + ([f"was {band} at {ties}"] if ties else [])
        return (f"**Inconclusive on this run:** the contexts disagree (the bigger batch {', '.join(tally[:-1])} and "
                f"{tally[-1]} of {contexts}), so it cannot show that {claim} at every context. {machine.text()}"
                f"{again} If they still disagree, whether a bigger batch pays depends on the context at these sizes, "
                "and the numbers say where.")
    if wins:  # wins and ties
        return (f"**Shown at {wins} of {contexts} on this run:** there {claim}; at the other {count(ties, 'context')} "
                f"the difference was {band}. {machine.text()}{again}")
    if machine.busy:  # losses and ties, on a busy machine: the load may explain the losses
        return (f"**Inconclusive on this run:** the bigger batch lost at {losses} of {contexts} and was {band} at "
                f"the other {count(ties, 'context')}, on a busy machine, so it cannot show that {claim}. {machine.text()}{again}")
    return (f"**This run measured the opposite at {losses} of {contexts}:** there the bigger batch yielded fewer "
            f"tokens per second in total; at the other {count(ties, 'context')} it was {band}. {machine.text()} One run can be an "
            "accident: press the button again. If it holds, it is this machine's result at these sizes, and the "
            "numbers say by how much.")


ITL_COLUMNS = [
    Column("context", "context (tokens)", "int"), Column("batch", "batch", "int"),
    Column("p50_s", "step p50 (ms)", scale=1e3), Column("p90_s", "step p90 (ms)", scale=1e3),
    Column("tokens_per_s_total", "tokens/s total"), Column("tokens_per_s_per_user", "tokens/s per user"),
]


def itl_table(itl: list[ITLPoint]):
    return people_table(itl, ITL_COLUMNS)


def itl_figure(itl: list[ITLPoint], source: str):
    """Decode step p50 vs batch (one line per context), and total vs per-user tokens/s."""
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
