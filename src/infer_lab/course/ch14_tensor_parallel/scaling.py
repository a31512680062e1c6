"""Part 2, scaling on catalogued GPUs (``scaling``, analytic): TP sizes, layouts and the frontier as results and tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis.capacity import plan_layouts
from ...analysis.memory import as_shape
from ...analysis.parallel import FastMode, FrontierPoint, fast_mode, scaling_table
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import (
    NUMBER,
    SCALING_BATCH,
    SCALING_CONTEXT,
    SCALING_MODEL,
    TALK_FAST_MODE_COMPUTE,
    TALK_FAST_MODE_SPEEDUP,
    Sizes,
)


@dataclass(frozen=True)
class ScalingRow:
    """Predicted decode ITL at one TP size (ms) and its speed-up over TP1."""

    model: str
    gpu: str
    tp: int
    fits: bool
    itl_ms: float
    compute_ms: float
    allreduce_ms: float
    allreduce_share: float
    speedup_vs_tp1: float
    ideal_speedup: int


@dataclass(frozen=True)
class LayoutRow:
    """One way to use n GPUs (capacity planner): ITL, throughput, the all-reduce part, energy."""

    gpu: str
    parallelism: str
    n_gpus: int
    interconnect: str
    itl_ms: float | None
    tokens_per_s: float | None
    input_tokens_per_s: float | None
    allreduce_ms_per_step: float | None
    meets_slo: bool
    usd_per_m_output_tokens: float | None
    joules_per_output_token: float | None


@dataclass(frozen=True)
class TalkPoint:
    """The first frontier point (from the fast-mode baseline) that costs the quoted compute ratio."""

    compute_ratio: float
    speedup: float
    layout: str
    batch: int


@dataclass(frozen=True)
class ScalingResult:
    model: str
    batch: int
    context: int
    rows: list[ScalingRow]
    small_model: str
    small_batch: int
    small_context: int
    small_allreduces: int  # per step at TP > 1
    small_model_rows: list[ScalingRow]
    layouts_model: str
    layouts_context: int
    itl_slo_ms: float
    layouts: list[LayoutRow]
    frontier: list[FrontierPoint]
    fast: FastMode | None
    at_talk_compute: TalkPoint | None

    def row(self, gpu: str, tp: int) -> ScalingRow:
        return next(r for r in self.rows if r.gpu == gpu and r.tp == tp)


def _scaling_row(model: str, r: dict[str, Any]) -> ScalingRow:
    return ScalingRow(model, r["gpu"], r["tp"], r["fits"], r["itl_ms"], r["compute_ms"], r["allreduce_ms"],
                      r["allreduce_share"], r["speedup_vs_tp1"], r["ideal_speedup"])


def _scaling_rows(model: str, gpus: tuple[str, ...], batch: int, context: int, tps=(1, 2, 4, 8)) -> list[ScalingRow]:
    return [_scaling_row(model, r) for r in scaling_table(model, gpus, batch, context, tps)]


def _layout_rows(model: str, gpu: str, n: int, context: int, slo: float) -> list[LayoutRow]:
    return [LayoutRow(p.gpu, p.parallelism, p.n_gpus, p.interconnect or "—", p.itl_ms, p.tokens_per_s,
                      p.input_tokens_per_s, p.allreduce_ms_per_step, p.meets_slo, p.usd_per_m_output_tokens,
                      p.joules_per_output_token)
            for p in plan_layouts(model, gpu, n, context=context, itl_slo_ms=slo)]


def talk_compute_point(points: list[FrontierPoint], fast: FastMode | None,
                       compute_ratio: float = TALK_FAST_MODE_COMPUTE) -> TalkPoint | None:
    """Walking the frontier from the fast-mode baseline towards speed, the first point whose GPU
    time per token is at least ``compute_ratio`` x the baseline's."""
    if fast is None:
        return None
    base = fast.baseline
    faster = sorted((p for p in points if p.on_frontier and p.tokens_per_s_per_user > base.tokens_per_s_per_user),
                    key=lambda p: p.tokens_per_s_per_user)
    for p in faster:
        ratio = base.tokens_per_s_per_gpu / p.tokens_per_s_per_gpu
        if ratio >= compute_ratio:
            return TalkPoint(ratio, p.tokens_per_s_per_user / base.tokens_per_s_per_user, p.layout, p.batch)
    return None


def run_scaling(lm: Any, sizes: Sizes) -> ScalingResult:
    """Run the notebook's own experiment (``tp_scaling`` of ``infer_lab/notebooks/14_tensor_parallel.py``;
    no measurement: the roofline + ring all-reduce on catalogued GPUs)."""
    return scaling_result(sizes.scaling_model, sizes.scaling_batch, sizes.scaling_context)


SCALING_GPUS = ("H100-SXM", "H100-PCIe")  # NVLink (SXM) and PCIe: the two links part 2 compares; the notebook reads it


def scaling_result(model: str = SCALING_MODEL, batch: int = SCALING_BATCH, context: int = SCALING_CONTEXT,
                   computed: tuple[list[dict[str, Any]], list[FrontierPoint]] | None = None) -> ScalingResult:
    """TP 1/2/4/8 on H100 SXM and PCIe (``computed``: what the notebook's ``tp_scaling`` returned;
    run here when not given), next to the fixed references: a small model, TP vs replicas, fast mode."""
    table, points = computed or notebook_function(NUMBER, "tp_scaling")(model, batch, context, SCALING_GPUS)
    rows = [_scaling_row(model, r) for r in table]
    small_model, small_batch, small_context = "smollm2-135m", 4, 256
    small = _scaling_rows(small_model, ("H100-SXM",), small_batch, small_context, tps=(1, 2))
    layouts = _layout_rows("llama-3-8b", "H100-PCIe", 4, 4096, 50.0) + _layout_rows("llama-3-8b", "H100-SXM", 4,
                                                                                   4096, 50.0)
    fast = fast_mode(points, TALK_FAST_MODE_SPEEDUP)
    return ScalingResult(model, batch, context, rows, small_model,
                         small_batch, small_context, 2 * as_shape(small_model).layers, small,
                         "llama-3-8b", 4096, 50.0, layouts, points, fast, talk_compute_point(points, fast))


SCALING_COLUMNS = [
    Column("gpu", "GPU", "text"), Column("tp", "TP", "int"), Column("fits", "fits", "bool"),
    Column("itl_ms", "ITL (ms)"), Column("compute_ms", "compute + memory (ms)"),
    Column("allreduce_ms", "all-reduces (ms)"), Column("allreduce_share", "all-reduce share", "pct"),
    Column("speedup_vs_tp1", "speed-up vs TP1", "ratio"), Column("ideal_speedup", "ideal", "ratio"),
]
SMALL_MODEL_COLUMNS = [  # the same columns in µs: a small model's steps are a fraction of a millisecond
    Column(c.key, c.label.replace("(ms)", "(µs)"), c.fmt, c.digits, scale=1e3) if "(ms)" in c.label else c
    for c in SCALING_COLUMNS
]
LAYOUT_COLUMNS = [
    Column("gpu", "GPU", "text"), Column("parallelism", "layout", "text"), Column("interconnect", "link", "text"),
    Column("itl_ms", "ITL (ms)"), Column("tokens_per_s", "output tok/s"), Column("input_tokens_per_s", "prefill tok/s"),
    Column("allreduce_ms_per_step", "all-reduces / step (ms)"), Column("meets_slo", "meets SLO", "bool"),
    Column("usd_per_m_output_tokens", "$ / M output tokens"), Column("joules_per_output_token", "J / token (at TDP)"),
]
FRONTIER_COLUMNS = [
    Column("layout", "layout", "text"), Column("batch", "batch per TP group", "int"), Column("itl_ms", "ITL (ms)"),
    Column("tokens_per_s_per_user", "tok/s per user"), Column("tokens_per_s_per_gpu", "tok/s per GPU"),
    Column("joules_per_token", "J / token (at TDP)"), Column("usd_per_m_tokens", "$ / M tokens"),
]


# The columns each of part 2's findings reads; the page keeps every other column behind a closed accordion.
SCALING_LESSON = ("GPU", "TP", "ITL (ms)", "all-reduce share", "speed-up vs TP1", "ideal")
SMALL_MODEL_LESSON = ("GPU", "TP", "ITL (µs)", "compute + memory (µs)", "all-reduces (µs)", "speed-up vs TP1")
LAYOUT_LESSON = ("GPU", "layout", "ITL (ms)", "output tok/s", "all-reduces / step (ms)", "$ / M output tokens")


def lesson_columns(frame: Any, columns: tuple[str, ...]) -> Any:
    """The columns of a people table that carry a finding, in that order."""
    return frame[list(columns)]


def scaling_tables(s: ScalingResult) -> dict[str, Any]:
    return {
        f"TP scaling (analytic): {s.model}, {s.batch} users x {s.context:,} tokens": people_table(s.rows, SCALING_COLUMNS),
        "A small model on NVLink (analytic): SmolLM2-135M, batch 4": people_table(s.small_model_rows, SMALL_MODEL_COLUMNS),
        f"TP vs replicas on 4 GPUs (analytic): {s.layouts_model}, {s.layouts_context:,} tokens, "
        f"ITL SLO {s.itl_slo_ms:.0f} ms": people_table(s.layouts, LAYOUT_COLUMNS),
        f"Pareto frontier (analytic): {s.model} on H100 SXM": people_table(
            [p for p in s.frontier if p.on_frontier], FRONTIER_COLUMNS),
    }
