"""Part 2 of chapter 04: prefill and decode predicted on this machine's measured roof, next to the harness."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ...analysis import roofline
from ...analysis.compare import dtype_name, explain_gaps, shape_of
from ...analysis.roofline import Roof, StepPrediction
from ...bench.hf_predicted import save_results
from ...figures import finish, subplots
from ...units import human
from ..notebook_code import notebook_function
from ..saved import results_dir
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes
from .shared import COLORS, ComparisonRow, OpRow, op_rows, roofline_figure


@dataclass(frozen=True)
class CompareResult:
    """Predicted vs measured on this machine's measured roof."""

    model: str
    roof: Roof
    rows: list[ComparisonRow]
    gaps: list[str]  # the ratios read in words (computed)
    steps: list[StepPrediction]  # prefill and decode at the longest prompt, for the figure
    prefill_ops: list[OpRow]
    decode_ops: list[OpRow]
    threads: int
    ceilings_note: str = ""  # when the roof's ceilings were measured, and how busy the machine was
    attention_implementation: str = ""  # transformers' attention kernel of the loaded model ("sdpa", "eager", ...)


def _comparison_row(r: dict[str, Any]) -> ComparisonRow:
    names = {f.name for f in dataclasses.fields(ComparisonRow)}
    return ComparisonRow(**{k: v for k, v in r.items() if k in names})


def compare_result(lm: Any, ceilings: Any, raw: list[dict[str, Any]]) -> CompareResult:
    """What the notebook's ``roofline_vs_harness`` returns (the ceilings measured here and the tidy
    predicted-vs-measured rows) as a :class:`CompareResult`, with the longest prompt's steps for the figure."""
    roof = roofline.measured_roof(ceilings)
    shape, dtype = shape_of(lm), dtype_name(lm)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype, logits="all")
    n = max([r["context"] for r in raw if r.get("phase") == "prefill"] or [1])
    steps = [roofline.predict_prefill(shape, roof, 1, n, **kw), roofline.predict_decode(shape, roof, 1, n, **kw)]
    return CompareResult(lm.describe(), roof, [_comparison_row(r) for r in raw], explain_gaps(raw), steps,
                         op_rows(roofline.prefill_ops(shape, 1, n, **kw), roof),
                         op_rows(roofline.decode_ops(shape, 1, n, **kw), roof), torch.get_num_threads(),
                         ceilings.provenance(), attention_implementation(lm))


def attention_implementation(lm: Any) -> str:
    """The attention kernel transformers runs for the loaded model (``config._attn_implementation``:
    ``"sdpa"`` by default in transformers 5.x, ``"eager"`` for the plain PyTorch one); '' if unknown."""
    return str(getattr(getattr(getattr(lm, "model", None), "config", None), "_attn_implementation", "") or "")


def run_compare(lm: Any, sizes: Sizes) -> CompareResult:
    """Run the notebook's own experiment (``roofline_vs_harness`` of ``infer_lab/notebooks/04_prefill_decode_roofline.py``)."""
    experiment = notebook_function(NUMBER, "roofline_vs_harness")
    ceilings, raw = experiment(lm, sizes.prompt_lengths, sizes.contexts, sizes.batches, sizes.new_tokens,
                               sizes.repeats, quick=sizes.quick_ceilings)
    return compare_result(lm, ceilings, raw)


def decode_ratio_text(result: CompareResult) -> str:
    """Each timed decode step: predicted, measured and the ratio, one line each."""
    rows = [r for r in result.rows if r.phase == "decode" and r.unit == "ms"]
    return "\n".join(f"- decode step, batch {r.batch}, context {r.context:,}: predicted {human(r.predicted, 3)} ms, "
                     f"measured {human(r.measured, 3)} ms, **measured ÷ predicted = {human(r.measured_over_predicted, 3)}**"
                     for r in rows)


def comparison_records(rows: list[ComparisonRow]) -> list[dict[str, Any]]:
    """Rows as plain dicts with their ratio (what a saved file holds)."""
    return [{**dataclasses.asdict(r), "measured_over_predicted": r.measured_over_predicted} for r in rows]


def save_compare(result: CompareResult, lm: Any):
    """Save a GPU comparison under ``infer_lab/results`` (what :func:`saved` shows elsewhere); return the path."""
    return save_results(comparison_records(result.rows), lm, result.roof, results_dir())


def compare_text(result: CompareResult) -> str:
    roof = result.roof
    attention = (f" Attention kernel: transformers' `{result.attention_implementation}`."
                 if result.attention_implementation else "")
    return (f"Measured on **{result.model}**, torch threads: {result.threads}; roof: "
            f"{human(roof.peak_flops / 1e9, 3)} GFLOP/s and {human(roof.bandwidth_Bps / 1e9, 3)} GB/s (measured here, ridge "
            f"{human(roof.ridge_point, 3)} FLOP/B). {result.ceilings_note}{attention}\n\n"
            + "\n".join(f"- {line}" for line in result.gaps))


COMPARE_COLUMNS = [
    Column("quantity", "quantity", "text"), Column("unit", "unit", "text"),
    Column("batch", "batch", "int"), Column("context", "context (tokens)", "int"),
    Column("predicted", "predicted"), Column("measured", "measured"),
    Column("measured_over_predicted", "measured ÷ predicted", "ratio"),
]


def compare_table(rows: list[ComparisonRow]):
    return people_table(rows, COMPARE_COLUMNS)


def compare_figure(result: CompareResult):
    return roofline_figure(result.roof, result.steps, {"prefill": result.prefill_ops, "decode": result.decode_ops},
                           result.rows, title=f"Predicted (*) and measured (x)\n{result.model}")


def ratio_figure(rows: list[ComparisonRow], title: str):
    """Measured / predicted time per timed row, on a log axis (1 = the roofline is reached)."""
    timed = [r for r in rows if r.unit == "ms"]
    labels = [f"{r.phase or r.quantity.split(' ')[0]} b{r.batch} n{r.context:,}" for r in timed]
    ratios = [r.measured_over_predicted for r in timed]
    fig, ax = subplots(figsize=(7, 3.6))
    phase_of = [r.phase or ("prefill" if "TTFT" in r.quantity or "prefill" in r.quantity else "decode") for r in timed]
    ax.bar(labels, ratios, color=[COLORS[p] for p in phase_of])
    ax.axhline(1, color="k", lw=1)
    ax.set_yscale("log")
    ax.set_ylim(min([1.0, *ratios]) / 1.5, max([1.0, *ratios]) * 1.5)
    ax.set_ylabel("measured ÷ predicted time, log scale")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", rotation=45, labelsize=7)
    ax.grid(alpha=0.3, axis="y", which="both")
    finish(fig)
    return fig
