"""Chapter 09 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ...units import GB, count
from ..ch02_feel_the_pain import saved_warning
from ..chapter import ChapterResult, Page, Part, model_name
from ..saved import SavedView, load_saved
from ..tables import Column, people_table
from .anchors import HF_BASELINE_FILE, SOL_FILE, _anchor_figure, anchor_rows
from .batching import BatchingResult, batching_figure, batching_table, batching_text, run_batching
from .paths import PathRow, paths_figure, paths_table, paths_text, run_paths
from .predicted import (
    PredictedResult,
    predicted_figure,
    predicted_table,
    predicted_text,
    run_predicted,
)
from .scenario import PARTS, Sizes
from .steps import StepsResult, run_steps, steps_figure, steps_text
from .sweep import SweepPoint, run_sweep, sweep_figure, sweep_table, sweep_text


@dataclass
class Result(ChapterResult):
    """Chapter 09's measurements; a part not run is ``None``."""

    model: str = ""
    steps: StepsResult | None = None
    batching: BatchingResult | None = None
    sweep: list[SweepPoint] | None = None
    predicted: PredictedResult | None = None
    paths: list[PathRow] | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("steps", run_steps,
         text=lambda r: steps_text(r.steps.runs, r.steps.slots),
         figures=lambda r: {"steps": steps_figure(r.steps.runs, r.steps.slots, r.model)}),
    Part("batching", run_batching,
         text=lambda r: batching_text(r.batching),
         tables=lambda r: {"Contenders on one workload": batching_table(r.batching)},
         figures=lambda r: {"batching": batching_figure(r.batching, r.model)}),
    Part("sweep", run_sweep,
         text=lambda r: sweep_text(r.sweep),
         tables=lambda r: {"max_num_seqs sweep (continuous batching)": sweep_table(r.sweep)},
         figures=lambda r: {"sweep": sweep_figure(r.sweep, r.model)}),
    Part("predicted", run_predicted,
         text=lambda r: predicted_text(r.predicted),
         tables=lambda r: {"Decode step: predicted vs measured": predicted_table(r.predicted)},
         figures=lambda r: {"predicted": predicted_figure(r.predicted, r.model)}),
    Part("paths", run_paths,
         text=lambda r: paths_text(r.paths),
         tables=lambda r: {"Decode paths": paths_table(r.paths)},
         figures=lambda r: {"paths": paths_figure(r.paths, r.model)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> SavedView | None:
    """The saved H200 anchors: a naive CUDA-graph decode by batch, next to the HF eager step."""
    found = load_saved(SOL_FILE)
    if not found:
        return None
    sol = found[0]
    baselines = load_saved(HF_BASELINE_FILE)
    baseline = baselines[0] if baselines else None
    rows = anchor_rows(sol, baseline)
    no_hf = "— (not in the saved HF run)"
    table = people_table(rows, [
        Column("batch", "batch", "int"), Column("graph_step_ms", "CUDA-graph step (ms)"),
        Column("graph_tokens_per_s", "tokens/s"), Column("weight_GBps", "weights read (GB/s)"),
        Column("bandwidth_share", "all bytes / measured copy bandwidth", "pct",
               missing="— (no saved copy bandwidth)"),
        Column("hf_step_ms", "HF eager step (ms)", missing=no_hf),
        Column("hf_over_graph", "HF / CUDA graph", "ratio", missing=no_hf),
    ])
    notes = [str(sol.raw.get("description", "")), f"Command: {sol.command}"]
    warning = None
    if baseline:
        d = baseline.data
        roof = d["copy_TBps"] * 1e12 / sol.data["weight_bytes"]
        b1 = rows[0]
        notes += [f"HF eager and the copy bandwidth: {baseline.label}.",
                  f"The copy-bandwidth roofline at batch {b1.batch} is {roof:.0f} tokens/s "
                  f"({d['copy_TBps']:.2f} TB/s / {sol.data['weight_bytes'] / GB:.1f} GB of weights); the naive "
                  f"CUDA-graph decode reached {b1.graph_tokens_per_s:.0f} ({b1.graph_tokens_per_s / roof:.0%})."]
        warning = "the HF eager column comes from a saved run that is " + saved_warning(d).removeprefix("this run is ")
    return SavedView(
        title=f"Decode on {sol.device}: {sol.raw.get('model')} shape, {sol.raw.get('weights')} weights",
        source=sol,
        tables={"Decode step by batch, saved anchors": table},
        figures={"anchors": _anchor_figure(rows, sol.device, str(sol.raw.get("model")))},
        notes=notes,
        warning=warning,
    )
