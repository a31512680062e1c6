"""Section 4 of chapter 12: speedup against batch size, and the roofline that says where the gain vanishes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...analysis.compare import dtype_name, shape_of
from ...analysis.plausibility import caution, speedup_flags
from ...analysis.roofline import gpu_roof
from ...analysis.speculation import roofline_verify_ratio
from ...bench.speculative import Comparison
from ...figures import finish, subplots
from ..chapter import SINGLE_RUN_NOISE
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, PARTS, SECTIONS
from .shared import COLORS, _hardware, _x, prompts_note

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class BatchPoint:
    """Speculative vs plain decoding of ``batch`` concurrent requests (continuous batching)."""

    batch: int
    proposer: str
    k: int
    plain_tokens_per_s: float
    tokens_per_s: float
    speedup: float
    decode_speedup: float
    tokens_per_pass: float
    step_ratio: float  # measured target time of a speculative decode step / a plain one
    roofline_step_ratio: float  # predicted t(batch x (k+1) tokens) / t(batch x 1)
    roofline_speedup: float  # tokens per pass / the roofline step ratio (draft cost ignored)
    identical: bool


@dataclass(frozen=True)
class RooflineCurve:
    """Predicted verification cost vs batch for one model on one roof (analytic)."""

    label: str
    batches: tuple[int, ...]
    step_ratio: tuple[float, ...]
    speedup: tuple[float, ...]  # at ``tokens_per_pass``
    tokens_per_pass: float
    ridge_point: float  # FLOP/B
    vanish_batch: int | None  # first batch where the predicted gain falls under VANISHED


@dataclass(frozen=True)
class BatchResult:
    points: list[BatchPoint]
    curves: list[RooflineCurve]
    roof: str
    bandwidth_Bps: float
    peak_flops: float
    context: int
    max_new_tokens: int
    hardware: str
    threads: int
    prompts_note: str = ""


def roofline_curve(label: str, model: Any, roof: Any, k: int, context: int, tokens_per_pass: float,
                   dtype: str, batches: tuple[int, ...]) -> RooflineCurve:
    """Predicted verification cost and speedup (draft cost ignored) for each batch size."""
    ratios = tuple(roofline_verify_ratio(model, roof, b, k, context, dtype) for b in batches)
    speedups = tuple(tokens_per_pass / r for r in ratios)
    vanish = next((b for b, s in zip(batches, speedups, strict=True) if s < VANISHED), None)
    return RooflineCurve(label, batches, ratios, speedups, tokens_per_pass, roof.ridge_point, vanish)


ANALYTIC_BATCHES = tuple(2**i for i in range(11))

VANISHED = 1.1  # a predicted speedup under this counts as "the gain has vanished"


def batch_result(ids: list[list[int]], runs: dict[int, Comparison], roof: Any, lm: Any, proposer: str, k: int,
                 sizes: Sizes) -> BatchResult:
    """What ``speedup_by_batch`` returned, next to the roofline's prediction of where the gain vanishes
    (on this machine's measured roof, and analytically for a 7B model on an H200)."""
    shape, dtype = shape_of(lm), dtype_name(lm)
    max_new = next(iter(runs.values())).max_new_tokens
    context = round(sum(len(p) for p in ids) / len(ids) + max_new / 2)
    points = []
    for b, comparison in runs.items():
        plain, spec = comparison.plain, comparison.totals(proposer, k)
        step_ratio = ((spec.decode_s - spec.draft_s) / spec.decode_steps) / plain.step_s
        roof_ratio = roofline_verify_ratio(shape, roof, b, k, context, dtype)
        points.append(BatchPoint(b, proposer, k, plain.tokens_per_s, spec.tokens_per_s,
                                 spec.tokens_per_s / plain.tokens_per_s,
                                 spec.decode_tokens_per_s / plain.decode_tokens_per_s, spec.tokens_per_pass,
                                 step_ratio, roof_ratio, spec.tokens_per_pass / roof_ratio,
                                 comparison.identical[(proposer, k)]))
    tpp = points[0].tokens_per_pass
    h200 = gpu_roof("h200")
    curves = [
        roofline_curve(f"{lm.name} ({dtype}) on {roof.name}", shape, roof, k, context, tpp, dtype, ANALYTIC_BATCHES),
        roofline_curve(f"mistral-7b (bf16) on {h200.name} (datasheet)", "mistral-7b", h200, k, context, tpp,
                       "bf16", ANALYTIC_BATCHES),
    ]
    return BatchResult(points, curves, roof.name, roof.bandwidth_Bps, roof.peak_flops, context,
                       max_new, _hardware(lm), torch.get_num_threads(), prompts_note(lm))


def run_batch(lm: Any, sizes: Sizes) -> BatchResult:
    """Run the notebook's ``speedup_by_batch`` at the batch sizes of ``sizes``."""
    experiment = notebook_function(NUMBER, "speedup_by_batch")
    proposer, k = sizes.batch_config
    ids, runs, roof = experiment(lm, sizes.batch_prompts, proposer, k, sizes.batches, sizes.max_new_tokens,
                                 sizes.rounds)
    return batch_result(ids, runs, roof, lm, proposer, k, sizes)


def frontier_shift_text(curve: RooflineCurve, chat_tokens_per_pass: float | None = None,
                        task: str = "the grounded prompts (copy, edit, quote)") -> str:
    """Speculation as a shift of the speed/throughput frontier (chapters 09 and 14), from one roofline curve.

    The shift is as large as the tokens a proposer keeps per pass, which depend on the task: the text
    names ``task`` (where ``curve.tokens_per_pass`` was measured), gives the same projection at
    ``chat_tokens_per_pass`` (open-ended chat, when measured) and at 1 token per pass (nothing kept), and
    says what the projection leaves out (the draft's cost and the engine's own verification overhead)."""
    pairs = list(zip(curve.batches, curve.speedup, strict=True))
    small = [(b, x) for b, x in pairs if x >= VANISHED]
    if not small:
        return (f"On {curve.label} the roofline gives no batch where speculation at {curve.tokens_per_pass:.2f} tokens "
                f"per pass (measured on {task}) moves the speed/throughput frontier.")
    b0, s0 = small[0]
    ratio0 = dict(zip(curve.batches, curve.step_ratio, strict=True))[b0]
    def verdict(shift: float) -> str:  # judged on the value as printed (2 decimals)
        shown = round(shift, 2)
        return ", a loss." if shown < 1 else ", no shift worth the name." if shown < VANISHED else "."

    if chat_tokens_per_pass is not None:
        chat = chat_tokens_per_pass / ratio0
        other = (f"The same proposer kept {chat_tokens_per_pass:.2f} tokens per pass on open-ended chat "
                 f"(section {SECTIONS['workloads']}): "
                 f"there the same roofline gives {chat:.2f}× at batch {b0}" + verdict(chat))
    else:
        other = (f"On open-ended chat a proposer keeps fewer (section {SECTIONS['workloads']} measures it): "
                 "with nothing kept, 1 token per "
                 f"pass, the same roofline gives {1 / ratio0:.2f}× at batch {b0}" + verdict(1 / ratio0))
    return (
        f"**A shift of the frontier, not a point on it.** Batching trades each user's speed for total throughput "
        f"along one curve (chapter 09). Speculation moves the curve, by as much as the proposer's guesses are kept, "
        f"and that depends on the task. At the {curve.tokens_per_pass:.2f} tokens per pass measured here on {task}, "
        f"the roofline of {curve.label} gives the same batch {s0:.2f}× the tokens per step at batch {b0}: on such a "
        f"task each user would be {s0:.2f}× faster *and* the GPU would serve {s0:.2f}× the tokens, with no extra GPUs, "
        f"before the draft's cost and the engine's own verification overhead (both left out here; section "
        f"{SECTIONS['sweep']} measures them on this machine). {other} " + shift_reach_text(curve) + " Speculation moves the fast, "
        "small-batch end of the frontier outward, where fast modes live (chapter 14)."
    )


def shift_reach_text(curve: RooflineCurve) -> str:
    """How far in batch the projected shift lasts, from ``curve``: whether it shrinks from the first batch to
    the last computed, and the batch where it falls under :data:`VANISHED` or, when it never does in the
    computed range, that it stays above it up to the largest batch computed."""
    first, last = curve.speedup[0], curve.speedup[-1]
    shape = (f"The shift shrinks as the batch grows ({first:.2f}× at batch {curve.batches[0]}, {last:.2f}× at batch "
             f"{curve.batches[-1]:,})" if last < first else
             f"The shift does not shrink with batch here ({first:.2f}× at batch {curve.batches[0]}, {last:.2f}× at "
             f"batch {curve.batches[-1]:,})")
    if curve.vanish_batch is None:
        return f"{shape} and stays above {VANISHED}× up to batch {curve.batches[-1]:,}, the largest computed."
    return f"{shape} and falls under {VANISHED}× at batch {curve.vanish_batch:,}."


def trend(before: float, after: float, noise: float = 0.0) -> str:
    """'rose', 'fell' or 'flat' from ``before`` to ``after`` (ratios such as speedups): a change is read only
    when ``after / before`` is more than ``noise`` (a fraction) away from 1 and shows at the 2 decimals the
    page prints."""
    if round(before, 2) == round(after, 2) or before <= 0 or abs(after / before - 1) <= noise:
        return "flat"
    return "rose" if after > before else "fell"


def batch_trend_text(points: list[BatchPoint], noise: float = SINGLE_RUN_NOISE) -> str:
    """Whether the run's gain changes with batch the way the roofline says: the measured speedup's change
    from the first batch to the last (read as a change only beyond ``noise``, a fraction: one run's noise,
    ``chapter.SINGLE_RUN_NOISE``) against the roofline's (analytic: judged at the printed rounding),
    and the words follow it."""
    if len(points) < 2:
        return "One batch size was measured: there is no trend with batch to hold against the roofline's."
    first, last = points[0], points[-1]
    measured = trend(first.speedup, last.speedup, noise)
    predicted = trend(first.roofline_speedup, last.roofline_speedup)
    said = {"rose": "rose", "fell": "fell", "flat": "stayed flat"}
    between = (f"from batch {first.batch} to {last.batch} the measured gain "
               f"{said[measured] + (' within noise' if measured == 'flat' else '')} ({_x(first.speedup)} → "
               f"{_x(last.speedup)}) and the roofline's {said[predicted]} ({_x(first.roofline_speedup)} → "
               f"{_x(last.roofline_speedup)})")
    if measured == predicted:
        return f"The roofline gets the trend with batch right on this run: {between}."
    if measured == "flat":
        return (f"This run cannot tell whether the gain follows the roofline's trend with batch: {between}; a "
                f"change under {noise:.0%} is within one run's noise on a shared machine.")
    return (f"On this run the trend with batch disagrees with the roofline's: {between}, and the measured step cost went "
            f"{_x(first.step_ratio)} → {_x(last.step_ratio)} against the roofline's {_x(first.roofline_step_ratio)} "
            f"→ {_x(last.roofline_step_ratio)}. This run does not show the roofline's trend: its timings carry "
            "costs the roofline does not model (the engine's per-step overhead, a shared machine's noise).")


def small_batch_text(first: BatchPoint) -> str:
    """The roofline against the measurement at the smallest batch: above it (it misses the engine's own cost
    of a verification pass) or not, from the two numbers."""
    if first.roofline_speedup > first.speedup:
        return (f"At batch {first.batch} it predicts more than is measured ({_x(first.roofline_speedup)} vs "
                f"{_x(first.speedup)}): it misses the engine's own cost of a verification pass (v in section {SECTIONS['sweep']}).")
    return (f"At batch {first.batch} the measurement reached it ({_x(first.speedup)} vs {_x(first.roofline_speedup)} "
            "predicted): the engine's own cost of a verification pass did not show on this run.")


def batch_text(result: BatchResult, chat_tokens_per_pass: float | None = None) -> str:
    """Section 4 in words (every paragraph of :func:`batch_paragraphs`)."""
    return "\n\n".join(batch_paragraphs(result, chat_tokens_per_pass).values())


def batch_lead(result: BatchResult) -> str:
    """Section 4's measurement at a glance (with its caution, if any); the rest is :func:`batch_derivation`."""
    parts = batch_paragraphs(result)
    return "\n\n".join(parts[k] for k in ("note", "measured", "caution") if k in parts)


def batch_derivation(result: BatchResult, chat_tokens_per_pass: float | None = None) -> str:
    """The roofline's reasoning behind section 4, and speculation as a shift of the frontier (with the chat
    case at ``chat_tokens_per_pass``, section 3's measurement, when given)."""
    parts = batch_paragraphs(result, chat_tokens_per_pass)
    return "\n\n".join(parts[k] for k in ("roof", "why", "shift") if k in parts)


def chat_case_note(proposer: str, k: int) -> str:
    """What the page adds once section 3 has measured this section's ``proposer`` and ``k`` on open-ended chat
    (markdown): their measured chat case in the shift paragraph."""
    return (f"*Section {SECTIONS['workloads']} has not measured {proposer} at k = {k} on open-ended chat yet: with that pair in "
            f"`_configs` in its cell (it is there by default), press **{PARTS['workloads']}**, and the shift paragraph "
            "above adds its tokens per pass there, with the roofline's projection at that number.*")


def batch_paragraphs(result: BatchResult, chat_tokens_per_pass: float | None = None) -> dict[str, str]:
    """Section 4 in words, one paragraph each ('note', 'measured', 'roof', 'why', 'caution', 'shift';
    an empty one is left out). ``chat_tokens_per_pass``: the same proposer's tokens per pass on open-ended
    chat (section 3), shown beside the grounded prompts' projection when it was measured."""
    first, last = result.points[0], result.points[-1]
    here, gpu = result.curves
    lines = [
        f"Measured with {first.proposer}, k = {first.k}: **{_x(first.speedup)}** at batch {first.batch}, "
        f"**{_x(last.speedup)}** at batch {last.batch}. A speculative decode step cost {first.step_ratio:.2f}× a "
        f"plain one at batch {first.batch} and {last.step_ratio:.2f}× at batch {last.batch} "
        f"(roofline: {first.roofline_step_ratio:.2f}× and {last.roofline_step_ratio:.2f}×). "
        + batch_trend_text(result.points),
        f"This machine's measured roof: {result.bandwidth_Bps / 1e9:.1f} GB/s, {result.peak_flops / 1e9:.0f} GFLOP/s, "
        f"ridge point {here.ridge_point:.1f} FLOP/B. "
        + f"At {here.tokens_per_pass:.2f} tokens per pass the roofline says the gain falls under {VANISHED}× at batch "
        + (f"**{here.vanish_batch}** here" if here.vanish_batch else f"beyond {here.batches[-1]} here")
        + "; for mistral-7b (bf16) on an H200 at batch "
        + (f"**{gpu.vanish_batch}**." if gpu.vanish_batch else f"beyond {gpu.batches[-1]}."),
        "While decode is memory-bound, verifying k + 1 tokens reads the same weights as decoding 1, so the "
        "guesses are free. Batching already fills the idle FLOPs; once batch × (k + 1) tokens pass the ridge "
        "point, each guess costs real compute and the gain vanishes. The roofline is the hardware's bound. "
        + small_batch_text(first),
        caution([f for p in result.points for f in speedup_flags(f"batch {p.batch}", p.speedup, p.tokens_per_pass)]),
        frontier_shift_text(gpu, chat_tokens_per_pass),
    ]
    keys = ("note", "measured", "roof", "why", "caution", "shift")
    return {key: line for key, line in zip(keys, [result.prompts_note or "", *lines], strict=True) if line}


BATCH_COLUMNS = [
    Column("batch", "batch", "int"), Column("proposer", "proposer", "text"), Column("k", "k", "int"),
    Column("plain_tokens_per_s", "plain tokens/s"), Column("tokens_per_s", "speculative tokens/s"),
    Column("speedup", "speedup (wall)", "ratio"), Column("tokens_per_pass", "tokens per pass"),
    Column("step_ratio", "step cost vs plain (measured)", "ratio"),
    Column("roofline_step_ratio", "step cost vs plain (roofline)", "ratio"),
    Column("roofline_speedup", "speedup (roofline)", "ratio"), Column("identical", "token-identical", "bool"),
]

BATCH_LESSON = ("batch", "tokens per pass", "speedup (wall)", "step cost vs plain (measured)",
                "step cost vs plain (roofline)", "speedup (roofline)")


def batch_table(result: BatchResult):
    return people_table(result.points, BATCH_COLUMNS)


def batch_details(result: BatchResult, chat_tokens_per_pass: float | None = None) -> dict[str, list[Any]]:
    """Section 4's roofline reasoning (with the chat case at ``chat_tokens_per_pass``, section 3's measured
    tokens per pass, or a note on how to add it), and every column of its table."""
    reasoning = [batch_derivation(result, chat_tokens_per_pass)]
    if chat_tokens_per_pass is None:
        reasoning.append(chat_case_note(result.points[0].proposer, result.points[0].k))
    return {"The roofline's reasoning, and speculation as a shift of the frontier": reasoning,
            "Every column": [batch_table(result)]}


def batch_figure(result: BatchResult, source: str):
    """Measured speedup vs batch with the roofline's, and the analytic verification cost to batch 1024."""
    fig, axes = subplots(1, 2, figsize=(11, 4))
    b = [p.batch for p in result.points]
    axes[0].plot(b, [p.speedup for p in result.points], "o-", label="measured (wall)")
    axes[0].plot(b, [p.roofline_speedup for p in result.points], "s--", label="roofline: tokens/pass ÷ step cost")
    axes[0].axhline(1, color="k", lw=0.8)
    axes[0].set_xscale("log", base=2)
    axes[0].set(xlabel="concurrent requests (batch)", ylabel="speedup over plain decoding (×)", ylim=(0, None),
                title=f"{result.points[0].proposer}, k = {result.points[0].k}, this machine")
    axes[0].legend(fontsize=8)
    for color, curve in zip(COLORS, result.curves, strict=False):
        axes[1].plot(curve.batches, curve.speedup, "-", color=color, label=curve.label)
        if curve.vanish_batch:
            axes[1].axvline(curve.vanish_batch, color=color, ls=":", lw=1)
    axes[1].axhline(1, color="k", lw=0.8)
    axes[1].set_xscale("log", base=2)
    axes[1].set(xlabel="batch", ylabel="predicted speedup (×)", ylim=(0, None),
                title=f"analytic: {result.curves[0].tokens_per_pass:.2f} tokens per pass, draft cost ignored")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"Where the gain vanishes ({result.threads} threads): {source}", fontsize=10)
    finish(fig)
    return fig
