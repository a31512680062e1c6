"""Chapter 15 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...cluster.engine_check import SimVsEngine
from ..ch14_tensor_parallel import LAYOUT_COLUMNS
from ..chapter import ChapterResult, Page, Part, model_name
from ..tables import Column, people_table
from .check import check_table, check_text, run_check
from .cluster import MODE_COLUMNS, ClusterResult, cluster_figure, cluster_text, run_cluster
from .hetero import AFD_COLUMNS, FITNESS_COLUMNS, HeteroResult, hetero_text, run_hetero, wafer_rows
from .plan import PlanResult, plan_text, run_plan
from .scenario import PARTS

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass
class Result(ChapterResult):
    """Chapter 15's parts; a part not run is ``None``."""

    model: str = ""
    cluster: ClusterResult | None = None
    hetero: HeteroResult | None = None
    plan: PlanResult | None = None
    check: SimVsEngine | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def cluster_tables(c: ClusterResult) -> dict[str, Any]:
    return {f"Serving modes (simulated): {c.model} on {c.n_gpus} x {c.gpu}": people_table(
                [m for w in c.workloads for m in w.modes], MODE_COLUMNS),
            "Every P:D split (simulated)": people_table([m for w in c.workloads for m in w.splits], MODE_COLUMNS)}


def hetero_tables(h: HeteroResult) -> dict[str, Any]:
    return {
        f"Phase fitness per GPU (analytic): {h.model}": people_table(h.fitness, FITNESS_COLUMNS),
        "Heterogeneous vs homogeneous (simulated, chat)": people_table(h.reports, MODE_COLUMNS),
        "Wafer-scale chip: cited claims vs computed": people_table(wafer_rows(h.wafer), [
            Column("what", "quantity", "text"), Column("value", "value", "text"), Column("source", "source", "text")]),
        f"Attention/FFN split (analytic): {h.afd_model}": people_table([h.afd_colocated, h.afd_split], AFD_COLUMNS),
    }


def plan_tables(p: PlanResult) -> dict[str, Any]:
    return {f"Layouts the planner considered: {p.model} on {p.gpu}": people_table(p.considered, LAYOUT_COLUMNS)}


PAGE = Page(
    PARTS,
    Part("cluster", run_cluster,
         text=lambda r: cluster_text(r.cluster),
         tables=lambda r: cluster_tables(r.cluster),
         figures=lambda r: {"cluster_itl": cluster_figure(r.cluster)}),
    Part("hetero", run_hetero, text=lambda r: hetero_text(r.hetero), tables=lambda r: hetero_tables(r.hetero)),
    Part("plan", run_plan, text=lambda r: plan_text(r.plan), tables=lambda r: plan_tables(r.plan)),
    Part("check", run_check,
         text=lambda r: check_text(r.check),
         tables=lambda r: {"Simulator vs our engine (this machine)": check_table(r.check)}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    return PAGE.measure(Result(size=sizes.size, model=model_name(lm)), lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {result.threads} torch thread(s).")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> None:
    """Nothing saved from a real cluster yet: every number of this chapter is simulated, computed or
    measured on this machine (chapter 14 shows tensor-parallel runs saved from multi-GPU machines)."""
    return None
