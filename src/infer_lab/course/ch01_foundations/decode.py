"""Section 4 of chapter 01: why decode waits on memory (the notebook's ``decode_prediction`` and ``decode_measured``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...analysis.compare import dtype_name, shape_of
from ...analysis.roofline import StepPrediction, decode_ops
from ...figures import finish, subplots
from ...units import fmt_bytes, human
from .. import ch04_prefill_decode_roofline as ch04
from ..chapter import chapter_number
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


def gpu_decode_wait_text() -> str:
    """How much of a batch-1 decode step a datasheet GPU's compute units spend waiting on memory:
    chapter 04's ``decode_wait_text`` for the model, GPU and context of its deck slides."""
    s = ch04.sizes("cpu", "quick")
    return ch04.decode_wait_text(s.model, s.gpu, s.context)


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
