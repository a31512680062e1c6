"""Section 2 of chapter 09: every contender on one workload (the notebook's ``contenders``)."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np

from ...bench import baselines
from ...bench.engine import workload
from ...bench.engine_run import EngineRun
from ...figures import finish, subplots
from ...timing import CONTRADICTED, INCONCLUSIVE, SUPPORTED, MachineLoad
from ..chapter import SINGLE_RUN_NOISE, check_machine, finding
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER
from .shared import _wrap
from .steps import skewed_output_lens

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class BatchingWorkload:
    """The requests every contender serves: the same prompts and output lengths, all at t = 0."""

    requests: int
    max_num_seqs: int  # batch slots a contender may use
    prompt_len: int
    output_lens: tuple[int, ...]
    seed: int

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    def requests_for(self, lm: Any) -> baselines.Workload:
        """The prompt token ids (seeded, random) and output lengths, in :mod:`infer_lab.bench.baselines`' form."""
        prompts = workload(lm, self.requests, self.prompt_len, seed=self.seed)
        return baselines.Workload("varied outputs", prompts, list(self.output_lens))


def batching_workload(sizes: Sizes, max_num_seqs: int | None = None) -> BatchingWorkload:
    """Output lengths skewed like real answers (:func:`skewed_output_lens`, up to ``max_output``, seeded);
    ``max_num_seqs`` batch slots (default ``sizes.max_num_seqs``)."""
    lens = tuple(skewed_output_lens(sizes.requests, sizes.max_output, sizes.seed))
    return BatchingWorkload(sizes.requests, max_num_seqs or sizes.max_num_seqs, sizes.prompt_len, lens, sizes.seed)


@dataclass(frozen=True)
class ContenderRow:
    """How one contender served the workload. Times in ms; ``None`` where it does not apply.

    ``mean_idle_slots`` (batch slots minus running requests, per step) and ``steps`` only exist
    for contenders that schedule in steps of a fixed number of slots; TTFT and ITL only for
    contenders that report per-token times (a whole-run baseline gives throughput only).
    """

    name: str
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms_p50: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    mean_idle_slots: float | None = None
    steps: int | None = None
    outputs: tuple[tuple[int, ...], ...] | None = field(default=None, repr=False, compare=False)
    identical: bool | None = None  # its tokens equal the continuous engine's, request by request

    @classmethod
    def from_run(cls, name: str, run: EngineRun, outputs: Any = None) -> ContenderRow:
        """A row from an engine run (:class:`~infer_lab.bench.engine_run.EngineRun`)."""
        pct = {f"{key}_{q}": (getattr(stats, q) if stats else None)
               for key, stats in (("ttft_ms", run.ttft_ms), ("itl_ms", run.itl_ms)) for q in ("p50", "p90", "p99")}
        tokens = tuple(tuple(o.token_ids) for o in outputs) if outputs is not None else None
        return cls(name, run.output_tokens_per_s, run.requests_per_s, mean_idle_slots=run.mean_idle_slots,
                   steps=run.steps, outputs=tokens, **pct)


# The contenders of part 2, in the order the table and the figure show them: the strongest fair
# baselines (transformers' padded batch and its own continuous batching) next to the engine. The
# keys are :mod:`infer_lab.bench.baselines`' names and the engine's scheduling policies; the
# notebook's ``contenders`` runs them.
ENGINE_NOTE = "; on a CPU the engine, in both rows, multiplies by weights prepacked once for oneDNN (`engine/cpu/prepack.py`)"
CONTENDERS: dict[str, tuple[str, str]] = {  # key -> (name, what it does)
    "hf-sequential": ("HF one at a time", "transformers `generate`, one request after another (a naive server)"),
    "hf-padded": ("HF padded batch", "transformers `generate` on left-padded groups of all batch slots, each group "
                  "until its longest request is done"),
    "hf-continuous": ("HF continuous batching",
                      "transformers' own continuous-batching manager (paged KV; requests join and leave)"),
    "hf-padded-prepacked": ("HF padded batch, prepacked GEMMs",
                            "the HF padded batch with every linear layer on the engine's prepacked weights (CPU "
                            "only, not a transformers feature): the gap between it and the engine is scheduling "
                            "alone, the gap between it and HF padded batch is the GEMM backend"),
    "static": ("static batching (engine)",
               "forms a batch, runs it until its longest request finishes, then forms the next"),
    "continuous": ("continuous batching (engine)",
                   "decides at every step who runs: a finished request leaves, a waiting one joins" + ENGINE_NOTE),
}


@dataclass(frozen=True)
class BatchingResult:
    workload: BatchingWorkload
    rows: list[ContenderRow]

    def row(self, name: str) -> ContenderRow:
        return next(r for r in self.rows if r.name == name)


def batching_requests(lm: Any, sizes: Sizes) -> tuple[list[list[int]], list[int]]:
    """Prompt token ids (random, seeded) and output lengths (tokens) of :func:`batching_workload`."""
    requests = batching_workload(sizes).requests_for(lm)
    return requests.prompts, requests.output_lens


def contender_row(key: str, run: Any) -> ContenderRow:
    """One contender's run as a row: an HF :class:`~infer_lab.bench.baselines.ContenderRun` (whole-run
    throughput) or an engine run's ``(run, outputs)`` (:func:`~infer_lab.bench.engine.timed_engine_run`)."""
    name = CONTENDERS[key][0] if key in CONTENDERS else key
    if isinstance(run, baselines.ContenderRun):
        return ContenderRow(name, run.tokens_per_s, len(run.outputs) / run.elapsed_s,
                            outputs=tuple(tuple(o) for o in run.outputs))
    engine_run, outputs = run
    return ContenderRow.from_run(name, engine_run, outputs)


def batching_result(runs: dict[str, Any], workload: BatchingWorkload) -> BatchingResult:
    """The notebook's ``contenders`` runs as rows, each contender's tokens checked against the
    engine's continuous batching, request by request (``identical``)."""
    rows = [contender_row(key, run) for key, run in runs.items()]
    reference = next((r.outputs for r in rows if r.name == ENGINE_CONTINUOUS), None)
    if reference is not None:
        rows = [dataclasses.replace(r, identical=None if r.outputs is None else r.outputs == reference)
                for r in rows]
    return BatchingResult(workload, rows)


def run_batching(lm: Any, sizes: Sizes, max_num_seqs: int | None = None) -> BatchingResult:
    """Run the notebook's own experiment (``contenders`` of ``infer_lab/notebooks/09_batching.py``)."""
    contenders = notebook_function(NUMBER, "contenders")
    workload = batching_workload(sizes, max_num_seqs)
    prompts, output_lens = batching_requests(lm, sizes)
    return batching_result(contenders(lm, prompts, output_lens, workload.max_num_seqs), workload)


# ---------------------------------------------------------------------------------------------
# Words


def workload_text(w: BatchingWorkload) -> str:
    return (f"{w.requests} requests of {w.prompt_len} prompt tokens, {min(w.output_lens)} to {max(w.output_lens)} "
            f"output tokens each ({w.output_tokens:,} in all, EOS ignored), all arriving at t = 0, "
            f"{w.max_num_seqs} batch slots")


def contenders_text(keys: Sequence[str] | None = None) -> str:
    """The contenders (default: all of :data:`CONTENDERS`) as a markdown list: name and what it does."""
    return "\n".join(f"- **{CONTENDERS[k][0]}**: {CONTENDERS[k][1]}." for k in (keys or CONTENDERS))


ENGINE_CONTINUOUS = "continuous batching (engine)"


def _versus(ratio: float) -> str:
    """'1.85×' or, within SINGLE_RUN_NOISE of 1, 'within one run's noise of'."""
    return "within one run's noise of" if abs(ratio - 1) < SINGLE_RUN_NOISE else f"{ratio:.2f}×"


def batching_outcome(result: BatchingResult) -> str:
    """SUPPORTED when the engine's continuous batching served the workload fastest of all contenders
    by more than one run's noise (``SINGLE_RUN_NOISE``), INCONCLUSIVE when the fastest other contender
    is within that noise, else CONTRADICTED."""
    engine = next((r for r in result.rows if r.name == ENGINE_CONTINUOUS), None)
    others = [r.output_tokens_per_s for r in result.rows if r.name != ENGINE_CONTINUOUS]
    if engine is None or not others:
        return INCONCLUSIVE
    ratio = engine.output_tokens_per_s / max(others)
    if abs(ratio - 1) < SINGLE_RUN_NOISE:
        return INCONCLUSIVE
    return SUPPORTED if ratio > 1 else CONTRADICTED


# Cited, not measured: transformers' documentation (5.17, "Continuous batching"): `generate_batch` runs
# continuous batching, and `transformers serve` builds on its `ContinuousBatchingManager`. This
# chapter's "HF continuous batching" row is that manager (infer_lab.bench.baselines.hf_continuous).
TRANSFORMERS_DOCS_VERSION = "5.17"


def hf_rows_text(hf_rows: Sequence[ContenderRow]) -> str:
    """Which way of serving with transformers was fastest here, against one request at a time, and
    why "Hugging Face" does not mean one request at a time (markdown; numbers from the rows). A
    lead within one run's noise (``SINGLE_RUN_NOISE``) is said to be no lead: the rows tie."""
    ranked = sorted(hf_rows, key=lambda r: -r.output_tokens_per_s)
    best = ranked[0]
    one = next((r for r in hf_rows if r.name == CONTENDERS["hf-sequential"][0]), None)
    source = (f"transformers itself batches continuously (`generate_batch`, and `transformers serve` on its "
              f"`ContinuousBatchingManager`, per the transformers {TRANSFORMERS_DOCS_VERSION} documentation), so "
              "\"Hugging Face serves one request at a time\" describes only the naive loop, not the library.")
    tied = [r for r in ranked[1:] if r.output_tokens_per_s > 0
            and abs(best.output_tokens_per_s / r.output_tokens_per_s - 1) < SINGLE_RUN_NOISE]
    if tied:
        rows = ", ".join(f"**{r.name}** {r.output_tokens_per_s:.1f}" for r in [best, *tied])
        batching = (" (one request at a time among them), so this run does not show whether batching paid for "
                    "transformers" if one is not None and one in [best, *tied] else "")
        return (f"Of the transformers rows, none was clearly the fastest here: {rows} tokens/s are within one run's "
                f"noise ({SINGLE_RUN_NOISE:.0%}) of each other{batching}. " + source[0].upper() + source[1:])
    if len(ranked) == 1:
        return f"The one transformers row, **{best.name}**, served {best.output_tokens_per_s:.1f} tokens/s; " + source
    if one is None or best is one:
        runner_up = ranked[1]
        verdict = ": batching did not pay for transformers on this run, though " if best is one else "; "
        return (f"Of the transformers rows, **{best.name}** was the fastest here ({best.output_tokens_per_s:.1f} "
                f"tokens/s, {best.output_tokens_per_s / runner_up.output_tokens_per_s:.2f}× the next, "
                f"{runner_up.name}){verdict}" + source)
    return (f"Of the transformers rows, **{best.name}** was the fastest here ({best.output_tokens_per_s:.1f} "
            f"tokens/s, {_versus(best.output_tokens_per_s / one.output_tokens_per_s)} {one.name}): "
            + source)


def batching_text(result: BatchingResult, machine: MachineLoad | None = None) -> str:
    """The verdict (continuous batching fastest?) with the machine's load (``machine``, else a check
    taken now, right after the run), then the contenders against the slowest, every number from
    ``result``."""
    rows = sorted(result.rows, key=lambda r: r.output_tokens_per_s)
    base = rows[0]
    machine = machine or check_machine()
    lines = [finding(batching_outcome(result), "the engine's continuous batching serves this workload faster "
                     "than every other contender", machine, "one run per contender"),
             f"Workload: {workload_text(result.workload)}. One run of each contender: a ratio within "
             f"{SINGLE_RUN_NOISE:.0%} of 1 is not a difference, and any ratio is this run's, "
             "not a constant (press the button again to see how much it moves)."]
    for r in rows[1:]:
        lines.append(f"**{r.name}** served it at **{r.output_tokens_per_s:.1f} output tokens/s**, "
                     f"{_versus(r.output_tokens_per_s / base.output_tokens_per_s)} {base.name} "
                     f"({base.output_tokens_per_s:.1f} tokens/s)"
                     + (f", with TTFT p90 {r.ttft_ms_p90:.0f} ms against {base.ttft_ms_p90:.0f} ms"
                        if r.ttft_ms_p90 is not None and base.ttft_ms_p90 is not None else "") + ".")
    hf = [r for r in result.rows if r.name.startswith("HF")]
    engine = next((r for r in result.rows if r.name == "continuous batching (engine)"), None)
    if hf:
        lines.append(hf_rows_text(hf))
    if hf and engine is not None:
        best = max(hf, key=lambda r: r.output_tokens_per_s)
        lines.append(f"Against the strongest transformers baseline here, **{best.name}** "
                     f"({best.output_tokens_per_s:.1f} tokens/s), the engine's continuous batching is "
                     f"**{_versus(engine.output_tokens_per_s / best.output_tokens_per_s)}** it on this run; against HF one request "
                     f"at a time it would look "
                     f"{engine.output_tokens_per_s / min(hf, key=lambda r: r.output_tokens_per_s).output_tokens_per_s:.1f}×, "
                     "which is the unfair comparison.")
    idle = [r for r in result.rows if r.mean_idle_slots is not None]
    if idle:
        lines.append("Idle batch slots per step (mean): " + ", ".join(f"{r.name} {r.mean_idle_slots:.2f}" for r in idle)
                     + ". TTFT is measured from the moment every request was submitted, so it includes the wait "
                     "for a slot; ITL is the gap between a request's consecutive tokens.")
    return " ".join(lines)


# ---------------------------------------------------------------------------------------------
# Table

NA = "— (not scheduled in slots)"
BATCHING_COLUMNS = [
    Column("name", "contender", "text"), Column("output_tokens_per_s", "output tokens/s"),
    Column("requests_per_s", "requests/s"),
    Column("ttft_ms_p50", "TTFT p50 (ms)"), Column("ttft_ms_p90", "TTFT p90 (ms)"), Column("ttft_ms_p99", "TTFT p99 (ms)"),
    Column("itl_ms_p50", "ITL p50 (ms)"), Column("itl_ms_p90", "ITL p90 (ms)"), Column("itl_ms_p99", "ITL p99 (ms)"),
    Column("mean_idle_slots", "idle slots per step (mean)", missing=NA),
    Column("steps", "engine steps", "int", missing=NA),
    Column("identical", "same tokens as the engine", "bool"),
]


def batching_table(batching: BatchingResult):
    return people_table(batching.rows, BATCHING_COLUMNS)


# ---------------------------------------------------------------------------------------------
# Figure


def batching_figure(batching: BatchingResult, source: str):
    """One bar per contender: throughput, idle slots, and TTFT / ITL at p50, p90, p99 (ms)."""
    rows = batching.rows
    names = [textwrap.fill(r.name, 24) for r in rows]
    colours = [matplotlib.colormaps["tab10"](i) for i in range(len(rows))]
    x = np.arange(len(rows))
    fig, axes = subplots(2, 2, figsize=(13, 8.5))
    axes = axes.ravel()
    axes[0].bar(x, [r.output_tokens_per_s for r in rows], color=colours)
    axes[0].set(ylabel="output tokens/s")
    idle = [r.mean_idle_slots if r.mean_idle_slots is not None else 0.0 for r in rows]
    axes[1].bar(x, idle, color=colours)
    for i, r in enumerate(rows):
        if r.mean_idle_slots is None:
            axes[1].text(i, 0, "n/a", ha="center", va="bottom", fontsize=8)
    axes[1].set(ylabel="idle batch slots per step (mean)")
    width = 0.8 / 3
    for ax, key in ((axes[2], "ttft_ms"), (axes[3], "itl_ms")):
        for j, q in enumerate(("p50", "p90", "p99")):
            values = [getattr(r, f"{key}_{q}") or 0.0 for r in rows]
            ax.bar(x + (j - 1) * width, values, width, label=q, color=matplotlib.colormaps["Greys"](0.4 + 0.25 * j))
        for i, r in enumerate(rows):
            if getattr(r, f"{key}_p50") is None:
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8)
        ax.set(ylabel=key.replace("_ms", "").upper() + " (ms)")
        ax.legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(x, names, fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
        ax.set_ylim(0, None)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(_wrap(f"Contenders on one workload ({workload_text(batching.workload)}): {source}", 150),
                 fontsize=10)
    finish(fig)
    return fig
