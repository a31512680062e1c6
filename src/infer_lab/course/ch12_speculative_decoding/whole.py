"""Chapter 12 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...analysis.plausibility import line_fit_flags, speedup_flags
from ...analysis.speculation import DraftMechanism
from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
from ..saved import SavedView, load_saved
from ..tables import people_table
from .batch import batch_figure, batch_table, batch_text, run_batch
from .passes import passes_figure, passes_table, passes_text, run_passes
from .scenario import PARTS
from .sweep import (
    SWEEP_COLUMNS,
    alpha_text,
    cost_text,
    detail_table,
    run_sweep,
    sweep_figure,
    sweep_table,
    sweep_text,
)
from .variants import (
    cited_table,
    mechanisms_table,
    run_variants,
    variants_figure,
    variants_result,
    variants_text,
)
from .workloads import (
    points_table,
    run_workloads,
    workloads_figure,
    workloads_table,
    workloads_text,
)

if TYPE_CHECKING:
    from .batch import BatchResult
    from .passes import PassesResult
    from .scenario import Sizes
    from .sweep import SweepResult
    from .variants import VariantsResult
    from .workloads import WorkloadResult


@dataclass
class Result(ChapterResult):
    """Chapter 12's measurements; a part not run is ``None``."""

    model: str = ""
    passes: PassesResult | None = None
    sweep: SweepResult | None = None
    workloads: WorkloadResult | None = None
    batch: BatchResult | None = None
    variants: VariantsResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("passes", run_passes,
         text=lambda r: passes_text(r.passes),
         tables=lambda r: {"One request, counted": passes_table(r.passes)},
         figures=lambda r: {"passes": passes_figure(r.passes, r.model)}),
    Part("sweep", run_sweep,
         text=lambda r: [sweep_text(r.sweep), alpha_text(r.sweep), cost_text(r.sweep)],
         tables=lambda r: {"Proposers x k on grounded prompts: measured vs predicted": sweep_table(r.sweep),
                           "Why accepted/proposed is not alpha": detail_table(r.sweep)},
         figures=lambda r: {"sweep": sweep_figure(r.sweep, r.model)}),
    Part("workloads", run_workloads,
         text=lambda r: workloads_text(r.workloads),
         tables=lambda r: {"Grounded vs open-ended chat": workloads_table(r.workloads),
                           "Per prompt": points_table(r.workloads)},
         figures=lambda r: {"workloads": workloads_figure(r.workloads, r.model)}),
    Part("batch", run_batch,
         text=lambda r: batch_text(r.batch, measured_chat_tokens_per_pass(r)),
         tables=lambda r: {"Speedup vs batch size": batch_table(r.batch)},
         figures=lambda r: {"batch": batch_figure(r.batch, r.model)}),
    Part("variants", lambda lm, sizes: run_variants(sizes),
         text=lambda r: variants_text(r.variants),
         tables=lambda r: {"EAGLE, Medusa, MTP: computed from configs": mechanisms_table(r.variants),
                           "What the papers report (cited, not measured here)": cited_table(r.variants)},
         figures=lambda r: {"variants": variants_figure(r.variants, r.sweep, r.model if r.sweep else "")}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def implausible(result: Result) -> list[str]:
    """Every caution the chapter prints instead of a finding (fits and speedups that cannot be true)."""
    flags = []
    if result.sweep:
        v = result.sweep.verify
        flags += line_fit_flags("verification time t(q)", v.t0_s, v.t1_s, result.sweep.verify_r2)
        flags += [f for r in result.sweep.rows
                  for f in speedup_flags(f"{r.proposer} at k = {r.k}", r.speedup, r.tokens_per_pass)]
    if result.workloads:
        flags += [f for r in result.workloads.rows
                  for f in speedup_flags(f"{r.proposer} at k = {r.k} ({r.workload})", r.speedup, r.tokens_per_pass)]
    if result.batch:
        flags += [f for p in result.batch.points
                  for f in speedup_flags(f"batch {p.batch}", p.speedup, p.tokens_per_pass)]
    return flags


def chat_tokens_per_pass(workloads: WorkloadResult | None, batch: BatchResult | None) -> float | None:
    """Section 3's tokens per pass on open-ended chat for section 4's proposer and k; ``None`` when either part
    has not run or section 3 did not measure that proposer and k."""
    if not (batch and workloads):
        return None
    point = batch.points[0]
    row = next((r for r in workloads.rows if (r.workload, r.proposer, r.k) == ("chat", point.proposer, point.k)),
               None)
    return row.tokens_per_pass if row else None


def measured_chat_tokens_per_pass(result: Result) -> float | None:
    """The batch part's proposer and k on open-ended chat (section 3), tokens per pass; ``None`` if not run."""
    return chat_tokens_per_pass(result.workloads, result.batch)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}. Timings were "
                                "taken on a machine that may be shared; read speedups as this run's, not as constants.")


def sweep_details(sweep: SweepResult, source: str, mechanisms: list[DraftMechanism]) -> dict[str, list[Any]]:
    """What section 2 keeps one click away (the page shows them in closed accordions): the
    acceptance derivation, the costs, every column, the proposers next to the papers'."""
    return {
        "Why the engine's acceptance rate is not α, and how to back α out": [
            sweep_figure(sweep, source, rows="acceptance"), alpha_text(sweep), detail_table(sweep)],
        "The costs the prediction needs, measured": [cost_text(sweep)],
        "Every column of the sweep": [sweep_table(sweep)],
        "The measured proposers on the same axes as the papers": [
            variants_figure(variants_result(mechanisms), sweep, source)],
    }


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> SavedView | None:
    """``infer-lab bench spec --save src/infer_lab/results/<gpu>-bench-spec-*.json`` runs from a GPU, if any."""
    found = [s for s in load_saved("*bench-spec-*.json") if s.raw.get("environment", {}).get("device_kind") == "cuda"]
    if not found:
        return None
    src = found[0]
    table = people_table(src.data.get("rows", []), [c for c in SWEEP_COLUMNS if c.key in (
        "proposer", "k", "acceptance_rate", "tokens_per_pass", "tokens_per_s", "speedup", "predicted_speedup",
        "identical")])
    return SavedView(
        title=f"Speculative decoding on {src.device}: {src.raw.get('workload', '')} prompts, batch "
              f"{src.raw.get('batch', '')}",
        source=src, tables={"Measured on the GPU": table}, notes=[f"Measured by: {src.command}"],
    )
