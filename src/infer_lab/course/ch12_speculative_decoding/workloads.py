"""Section 3 of chapter 12: grounded prompts against open-ended chat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...analysis.plausibility import caution, speedup_flags
from ...bench.speculative import (
    PLAIN,
    Comparison,
    SpecRow,
    rows,
)
from ...figures import finish, subplots
from ...units import count
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER
from .shared import _hardware, _x, prompts_note

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class PromptPoint:
    """One prompt under one configuration (all rounds), against plain decoding."""

    workload: str
    prompt: str
    task: str
    proposer: str
    k: int
    output_tokens: int
    tokens_per_pass: float
    speedup: float


@dataclass(frozen=True)
class WorkloadResult:
    rows: list[SpecRow]  # one per (workload, configuration)
    points: list[PromptPoint]
    max_new_tokens: int
    hardware: str
    threads: int
    prompts_note: str = ""

    def row(self, workload: str, proposer: str, k: int) -> SpecRow:
        return next(r for r in self.rows if (r.workload, r.proposer, r.k) == (workload, proposer, k))


def workloads_result(runs: dict[str, tuple[list[Any], Comparison]], lm: Any, sizes: Sizes) -> WorkloadResult:
    """``proposers_by_k`` per workload ({workload: (prompts, comparison)}), with per-prompt speedups."""
    all_rows, points = [], []
    for workload, (chosen, comparison) in runs.items():
        configs = [key for key in comparison.runs if key[0] != PLAIN]
        all_rows += rows(comparison, workload)
        for g, prompt in enumerate(chosen[: comparison.groups]):
            plain = comparison.group_totals(PLAIN, 0, g)
            for proposer, k in configs:
                spec = comparison.group_totals(proposer, k, g)
                points.append(PromptPoint(workload, prompt.name, prompt.task, proposer, k, spec.output_tokens,
                                          spec.tokens_per_pass, spec.tokens_per_s / plain.tokens_per_s))
    max_new = next(iter(runs.values()))[1].max_new_tokens
    return WorkloadResult(all_rows, points, max_new, _hardware(lm), torch.get_num_threads(), prompts_note(lm))


def run_workloads(lm: Any, sizes: Sizes) -> WorkloadResult:
    """Run the notebook's ``proposers_by_k`` on grounded and on chat prompts."""
    experiment = notebook_function(NUMBER, "proposers_by_k")
    runs = {w: experiment(lm, w, sizes.workload_prompts, list(sizes.workload_configs), sizes.max_new_tokens,
                          sizes.rounds) for w in ("grounded", "chat")}
    return workloads_result(runs, lm, sizes)


def workloads_text(result: WorkloadResult) -> str:
    lines = []
    for proposer, k in dict.fromkeys((r.proposer, r.k) for r in result.rows):
        g, c = result.row("grounded", proposer, k), result.row("chat", proposer, k)
        lines.append(
            f"**{proposer}, k = {k}**: grounded prompts {g.tokens_per_pass:.2f} tokens per pass, **{_x(g.speedup)}**; "
            f"open-ended chat {c.tokens_per_pass:.2f} tokens per pass, **{_x(c.speedup)}**"
            + (" — speculation *costs* time there: every failed guess still paid its verification." if c.speedup < 1
               else ".")
        )
    lines.append("Low-entropy, input-grounded text (copying, editing, quoting) is where guesses are right; "
                 f"on {result.hardware} with {count(result.threads, 'thread')}.")
    lines.append(caution([f for r in result.rows for f in speedup_flags(
        f"{r.proposer} at k = {r.k} ({r.workload})", r.speedup, r.tokens_per_pass)]))
    if result.prompts_note:
        lines.insert(0, result.prompts_note)
    return "\n\n".join(line for line in lines if line)


WORKLOAD_COLUMNS = [
    Column("workload", "workload", "text"), Column("proposer", "proposer", "text"), Column("k", "k", "int"),
    Column("requests", "prompts", "int"), Column("acceptance_rate", "acceptance", "pct"),
    Column("tokens_per_pass", "tokens per target pass"), Column("plain_tokens_per_s", "plain tokens/s"),
    Column("tokens_per_s", "tokens/s"), Column("speedup", "speedup (wall)", "ratio"),
    Column("identical", "token-identical", "bool"),
]

POINT_COLUMNS = [
    Column("workload", "workload", "text"), Column("prompt", "prompt", "text"), Column("task", "task", "text"),
    Column("proposer", "proposer", "text"), Column("k", "k", "int"), Column("output_tokens", "tokens out", "int"),
    Column("tokens_per_pass", "tokens per pass"), Column("speedup", "speedup", "ratio"),
]

WORKLOAD_LESSON = ("workload", "proposer", "k", "acceptance", "tokens per target pass", "speedup (wall)")


def workloads_table(result: WorkloadResult):
    return people_table(result.rows, WORKLOAD_COLUMNS)


def points_table(result: WorkloadResult):
    return people_table(result.points, POINT_COLUMNS)


def workloads_details(result: WorkloadResult) -> dict[str, list[Any]]:
    """Section 3's rows prompt by prompt, and every column of its table."""
    return {"Prompt by prompt": [points_table(result)], "Every column": [workloads_table(result)]}


def workloads_figure(result: WorkloadResult, source: str):
    """Per-prompt speedup and tokens per pass, grounded vs chat."""
    configs = list(dict.fromkeys((p.proposer, p.k) for p in result.points))
    fig, axes = subplots(1, 2, figsize=(11, 0.9 + 0.32 * len(result.points)), sharey=True)
    labels = [f"{p.workload}: {p.prompt} ({p.proposer}, k={p.k})" for p in result.points]
    colors = ["tab:green" if p.workload == "grounded" else "tab:gray" for p in result.points]
    y = list(range(len(result.points)))
    axes[0].barh(y, [p.speedup for p in result.points], color=colors)
    axes[0].axvline(1, color="k", lw=1)
    axes[0].set(xlabel="speedup over plain decoding (×)", xlim=(0, None), title="wall-clock speedup per prompt")
    axes[1].barh(y, [p.tokens_per_pass for p in result.points], color=colors)
    axes[1].axvline(1, color="k", lw=1)
    axes[1].set(xlabel="tokens per target pass", xlim=(0, None), title="tokens per target pass")
    axes[0].set_yticks(y, labels, fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle(f"Grounded (green) vs open-ended chat (grey), {', '.join(f'{p} k={k}' for p, k in configs)}, "
                 f"batch 1 ({result.threads} threads): {source}", fontsize=10)
    finish(fig)
    return fig
