"""Chapter 09, "Batching": who runs each step, how big the batch is, and what one step costs.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/09_batching.py`` that call the engine and :mod:`infer_lab.bench` directly, called
from the page's visible cells. This module sizes them, draws and describes what they return, and
runs the very same functions for the tour, the tests and the Jupyter edition (``run_*``, through
:mod:`infer_lab.course.notebook_code`).

1. **Static vs continuous, step by step** (counted; ``serve``): ``EngineConfig(policy=...,
   max_num_seqs=...)``, the requests, and the engine's own step records, for both policies, on
   requests with a few long answers among many short ones.
2. **Contenders on one workload** (measured; ``contenders``): the same requests, with varied
   output lengths, all arriving at t = 0, served by each contender of :data:`CONTENDERS`
   (transformers baselines of :mod:`infer_lab.bench.baselines` and the engine with either
   policy) at the same number of batch slots; every contender's tokens are checked against the
   engine's continuous batching.
3. **The Pareto frontier** (measured; ``concurrency_sweep``): total tokens/s vs tokens/s per user
   as concurrency grows.
4. **Predicted vs measured decode step** (measured; ``predicted_vs_measured``): the roofline on
   this machine's measured ceilings (:mod:`infer_lab.bench.predicted`) next to the engine's step.
5. **Decode paths** (measured; ``decode_paths``): the same decode through each path this device
   has, from one attention call per request to a CUDA-graph replay.

Every timed run goes through :mod:`infer_lab.bench.engine` (warm-up first, every request timed
from its arrival, percentiles). The saved view shows the H200 anchors (a naive CUDA-graph decode
and the HF eager step), labelled as saved.
"""

from __future__ import annotations

import dataclasses
import random
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..bench import baselines
from ..bench.engine import workload
from ..bench.predicted import CPU_BATCHES, GPU_BATCHES
from ..figures import finish, subplots
from ..timing import CONTRADICTED, INCONCLUSIVE, SUPPORTED, MachineLoad
from ..units import GB, count
from .chapter import (
    NO_MODEL,
    SINGLE_RUN_NOISE,
    ChapterResult,
    check_machine,
    choose_size,
    finding,
    run_parts,
)
from .library_code import code_block
from .notebook_code import notebook_function
from .saved import SavedResult, SavedView, load_saved
from .tables import Column, people_table

NUMBER = "09"
SLUG = "batching"
TITLE = "09 · Batching: static vs continuous, the Pareto frontier, the decode step"
NEEDS_MODEL = True
PARTS = {
    "steps": "Run static and continuous batching, step by step",
    "batching": "Serve the workload with every contender",
    "sweep": "Run the concurrency sweep",
    "predicted": "Measure predicted vs measured decode steps",
    "paths": "Run every decode path",
}
SOL_FILE = "h200-sol-decode-*.json"
HF_BASELINE_FILE = "h200-hf-baseline-*.json"


@dataclass(frozen=True)
class Sizes:
    """Requests and tokens of the four measurements."""

    size: str
    requests: int  # the contenders' workload
    concurrency: int  # batch slots
    prompt_len: int
    max_output: int  # the longest output (tokens): one in four answers this long, the rest 2 .. max_output // 4
    sweep_concurrencies: tuple[int, ...]
    sweep_waves: int  # each sweep point serves concurrency × waves requests
    sweep_output_len: int
    predicted_batches: tuple[int, ...]
    predicted_steps: int
    paths_batch: int
    paths_prompt_len: int
    paths_output_len: int
    seed: int = 0
    steps_requests: int = 16  # the step-by-step part: requests, all at t = 0
    steps_max_output: int = 24  # one in four answers this long, the rest 2 .. max // 4 tokens
    steps_slots: int = 4  # the step-by-step part's batch slots (max_num_seqs); the notebook's cell reads it


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` fits a 2-core CPU in a few seconds per part; ``full`` is what a GPU gets."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        if size == "quick":
            return Sizes(size, requests=64, concurrency=16, prompt_len=128, max_output=128,
                         sweep_concurrencies=(1, 4, 16, 64), sweep_waves=2, sweep_output_len=64,
                         predicted_batches=(1, 4, 16, 64), predicted_steps=8,
                         paths_batch=1, paths_prompt_len=128, paths_output_len=32)
        return Sizes(size, requests=256, concurrency=64, prompt_len=512, max_output=256,
                     sweep_concurrencies=(1, 2, 4, 8, 16, 32, 64, 128, 256), sweep_waves=2, sweep_output_len=128,
                     predicted_batches=GPU_BATCHES, predicted_steps=16,
                     paths_batch=1, paths_prompt_len=128, paths_output_len=64)
    if size == "quick":
        return Sizes(size, requests=8, concurrency=4, prompt_len=16, max_output=16,
                     sweep_concurrencies=(1, 2, 4, 8), sweep_waves=2, sweep_output_len=8,
                     predicted_batches=(1, 4, 16), predicted_steps=3,
                     paths_batch=1, paths_prompt_len=16, paths_output_len=6)
    return Sizes(size, requests=32, concurrency=8, prompt_len=16, max_output=64,
                 sweep_concurrencies=(1, 2, 4, 8, 16), sweep_waves=2, sweep_output_len=32,
                 predicted_batches=CPU_BATCHES, predicted_steps=8,
                 paths_batch=1, paths_prompt_len=128, paths_output_len=64,
                 steps_requests=32, steps_max_output=48)


# ---------------------------------------------------------------------------------------------
# Part 0: static vs continuous, step by step (the experiment is the notebook's `serve`)

POLICIES = ("static", "continuous")
LONG_SHARE = 0.25  # share of long answers in the step-by-step workload


def skewed_output_lens(n: int, top: int, seed: int) -> list[int]:
    """``n`` output lengths (tokens), seeded and skewed like real answers: most are short, a few long.

    One in four (:data:`LONG_SHARE`) gets ``top`` tokens and the rest 2 .. ``top // 4``. A static
    batch then runs as long as its longest member while its short ones sit done.
    """
    rng = random.Random(seed)
    return [top if rng.random() < LONG_SHARE else rng.randint(2, max(2, top // 4)) for _ in range(n)]


def steps_requests(lm: Any, sizes: Sizes) -> tuple[list[list[int]], list[int]]:
    """Prompt token ids and output lengths (:func:`skewed_output_lens`) for the step-by-step part, seeded."""
    lens = skewed_output_lens(sizes.steps_requests, sizes.steps_max_output, sizes.seed)
    prompts = workload(lm, sizes.steps_requests, sizes.prompt_len, seed=sizes.seed)
    return prompts, lens


@dataclass(frozen=True)
class StepsResult:
    """Both policies' step records (:class:`~infer_lab.engine.StepRecord`) on the same requests."""

    slots: int
    output_lens: tuple[int, ...]
    runs: dict[str, list[Any]]


def run_steps(lm: Any, sizes: Sizes, slots: int | None = None) -> StepsResult:
    """Run the notebook's own experiment (``serve`` of ``infer_lab/notebooks/09_batching.py``) for both
    policies, with ``slots`` batch slots (default ``sizes.steps_slots``, the number the notebook's cell starts at)."""
    serve = notebook_function(NUMBER, "serve")
    slots = slots or sizes.steps_slots
    prompts, lens = steps_requests(lm, sizes)
    runs = {policy: serve(lm, prompts, lens, policy, max_num_seqs=slots) for policy in POLICIES}
    return StepsResult(slots, tuple(lens), runs)


def idle_slot_steps(records: Sequence[Any]) -> int:
    """Slot-steps nobody used: the sum of each step's idle slots."""
    return sum(r.idle_slots for r in records)


def admission_code() -> str:
    """The scheduler's admission step, the library's real code (its docstring left out, the words
    around it on the page say the same), as a markdown code block."""
    from ..engine.scheduler import Scheduler

    return code_block(Scheduler.admit)


def steps_text(runs: dict[str, list[Any]], slots: int) -> str:
    """Steps and idle slots of both policies, every number from the engine's step records."""
    static, cont = runs["static"], runs["continuous"]
    s_idle, c_idle = idle_slot_steps(static), idle_slot_steps(cont)
    return (f"With **{slots} slots**, static batching took **{len(static)} steps** and continuous batching "
            f"**{len(cont)}**: static took **{len(static) / len(cont):.2f}×** the steps for the same tokens. "
            f"Static left {s_idle} of its {len(static) * slots} slot-steps idle ({s_idle / len(static):.2f} "
            f"slots per step), continuous {c_idle} of {len(cont) * slots} ({c_idle / len(cont):.2f} per step). "
            "A static batch runs as long as its longest request, so its short ones finish and wait; "
            "continuous batching gives a freed slot to the next request in the very next step. "
            "The gap needs more requests than slots: with as many slots as requests both policies admit "
            "everyone in the first step and take the same steps, and with one slot both serve one request "
            "at a time.")


def steps_figure(runs: dict[str, list[Any]], slots: int, source: str = ""):
    """Per step, the slots each policy filled and the ones it left idle (grey)."""
    fig, axes = subplots(len(runs), 1, figsize=(10, 1.9 * len(runs) + 0.6), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for ax, (policy, records) in zip(axes, runs.items(), strict=True):
        steps = range(len(records))
        busy = [r.num_seqs for r in records]
        ax.bar(steps, busy, width=1.0, color="tab:blue" if policy == "continuous" else "tab:orange",
               label="running requests")
        ax.bar(steps, [r.idle_slots for r in records], bottom=busy, width=1.0, color="0.85", label="idle slots")
        ax.set_ylim(0, slots)
        ax.set_ylabel("batch slots")
        ax.set_title(f"{policy} batching: {len(records)} steps, {idle_slot_steps(records)} idle slot-steps",
                     fontsize=10, loc="left")
    axes[-1].set_xlabel("engine step")
    fig.suptitle(f"Who ran each step, {slots} slots" + (f": {source}" if source else ""), fontsize=9,
                 x=0.01, ha="left")
    finish(fig)
    fig.subplots_adjust(top=0.86)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper right", fontsize=8, ncols=2, frameon=False)
    return fig




# ---------------------------------------------------------------------------------------------
# Part 1: contenders on one workload


@dataclass(frozen=True)
class BatchingWorkload:
    """The requests every contender serves: the same prompts and output lengths, all at t = 0."""

    requests: int
    concurrency: int  # batch slots a contender may use
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


def batching_workload(sizes: Sizes, concurrency: int | None = None) -> BatchingWorkload:
    """Output lengths skewed like real answers (:func:`skewed_output_lens`, up to ``max_output``, seeded);
    ``concurrency`` batch slots (default ``sizes.concurrency``)."""
    lens = tuple(skewed_output_lens(sizes.requests, sizes.max_output, sizes.seed))
    return BatchingWorkload(sizes.requests, concurrency or sizes.concurrency, sizes.prompt_len, lens, sizes.seed)


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
    def from_benchmark(cls, name: str, r: dict[str, Any], outputs: Any = None) -> ContenderRow:
        """A row from an engine run's summary (:func:`~infer_lab.bench.engine.summarize_run`)."""
        pct = {f"{key}_{q}": (r[key][q] if r[key] else None) for key in ("ttft_ms", "itl_ms")
               for q in ("p50", "p90", "p99")}
        tokens = tuple(tuple(o.token_ids) for o in outputs) if outputs is not None else None
        return cls(name, r["output_tokens_per_s"], r["requests_per_s"], mean_idle_slots=r["mean_idle_slots"],
                   steps=r["steps"], outputs=tokens, **pct)


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
    throughput) or an engine run's ``(summary, outputs)`` (:func:`~infer_lab.bench.engine.timed_engine_run`)."""
    name = CONTENDERS[key][0] if key in CONTENDERS else key
    if isinstance(run, baselines.ContenderRun):
        return ContenderRow(name, run.tokens_per_s, len(run.outputs) / run.elapsed_s,
                            outputs=tuple(tuple(o) for o in run.outputs))
    summary, outputs = run
    return ContenderRow.from_benchmark(name, summary, outputs)


def batching_result(runs: dict[str, Any], workload: BatchingWorkload) -> BatchingResult:
    """The notebook's ``contenders`` runs as rows, each contender's tokens checked against the
    engine's continuous batching, request by request (``identical``)."""
    rows = [contender_row(key, run) for key, run in runs.items()]
    reference = next((r.outputs for r in rows if r.name == ENGINE_CONTINUOUS), None)
    if reference is not None:
        rows = [dataclasses.replace(r, identical=None if r.outputs is None else r.outputs == reference)
                for r in rows]
    return BatchingResult(workload, rows)


def run_batching(lm: Any, sizes: Sizes, concurrency: int | None = None) -> BatchingResult:
    """Run the notebook's own experiment (``contenders`` of ``infer_lab/notebooks/09_batching.py``)."""
    contenders = notebook_function(NUMBER, "contenders")
    workload = batching_workload(sizes, concurrency)
    prompts, output_lens = batching_requests(lm, sizes)
    return batching_result(contenders(lm, prompts, output_lens, workload.concurrency), workload)


# ---------------------------------------------------------------------------------------------
# Part 2: the Pareto frontier


@dataclass(frozen=True)
class SweepPoint:
    """One concurrency level of continuous batching: total vs per-user speed (tokens/s), times in ms."""

    concurrency: int
    requests: int
    output_tokens_per_s: float
    tokens_per_s_per_user: float  # 1 / mean ITL
    ttft_ms_p50: float
    itl_ms_p50: float
    itl_ms_p99: float


def sweep_points(runs: dict[int, dict[str, Any]], waves: int) -> list[SweepPoint]:
    """The sweep's points from the notebook's ``concurrency_sweep``: one engine benchmark summary
    (:func:`~infer_lab.bench.engine.run_engine_benchmark`) per concurrency, of concurrency × ``waves`` requests."""
    return [SweepPoint(c, c * waves, r["output_tokens_per_s"], 1e3 / r["itl_ms"]["mean"], r["ttft_ms"]["p50"],
                       r["itl_ms"]["p50"], r["itl_ms"]["p99"]) for c, r in runs.items()]


def run_sweep(lm: Any, sizes: Sizes) -> list[SweepPoint]:
    """Run the notebook's own experiment (``concurrency_sweep`` of ``infer_lab/notebooks/09_batching.py``)."""
    sweep = notebook_function(NUMBER, "concurrency_sweep")
    runs = sweep(lm, sizes.sweep_concurrencies, sizes.sweep_waves, sizes.prompt_len, sizes.sweep_output_len)
    return sweep_points(runs, sizes.sweep_waves)


# ---------------------------------------------------------------------------------------------
# Part 3: predicted vs measured decode step


@dataclass(frozen=True)
class PredictedPoint:
    """The roofline's decode step and the engine's measured one (median of pure decode steps), ms."""

    batch: int
    context: int
    predicted_ms: float
    measured_ms: float
    predicted_bound: str
    flops: float
    bytes: float
    steps_timed: int

    @property
    def measured_over_predicted(self) -> float:
        return self.measured_ms / self.predicted_ms


@dataclass(frozen=True)
class PredictedResult:
    points: list[PredictedPoint]
    roof: str  # the ceilings the prediction used
    dtype: str


def predicted_result(rows: list[dict[str, Any]]) -> PredictedResult:
    """The points of the notebook's ``predicted_vs_measured``: rows of
    :func:`~infer_lab.bench.predicted.decode_step_predicted_vs_measured`, one per batch."""
    points = [PredictedPoint(r["batch"], r["context"], r["predicted_ms"], r["measured_ms"], r["predicted_bound"],
                             r["flops"], r["bytes"], r["steps_timed"]) for r in rows]
    return PredictedResult(points, rows[0]["roof"], rows[0]["dtype"])


def run_predicted(lm: Any, sizes: Sizes) -> PredictedResult:
    """Run the notebook's own experiment (``predicted_vs_measured`` of ``infer_lab/notebooks/09_batching.py``)."""
    experiment = notebook_function(NUMBER, "predicted_vs_measured")
    return predicted_result(experiment(lm, sizes.predicted_batches, sizes.prompt_len, sizes.predicted_steps,
                                       quick=sizes.size == "quick"))


# ---------------------------------------------------------------------------------------------
# Part 4: decode paths


@dataclass(frozen=True)
class PathRow:
    """One decode path on the same run: ITL p50 (ms), tokens/s per user and for the whole run."""

    path: str
    fused: bool
    compiled: bool
    batch: int
    itl_ms_p50: float
    tokens_per_s_per_user: float  # 1 / ITL p50
    output_tokens_per_s: float  # whole run, prefill included
    graphs_captured: int

    @property
    def label(self) -> str:
        return self.path + (" +fused" if self.fused else "") + (" +compile" if self.compiled else "")


def decode_path_variants(cuda: bool, compile_layers: bool = False) -> list[tuple[str, bool, bool]]:
    """(path, fused projections, compiled) to run, slowest idea first; CUDA graphs only on a GPU."""
    variants = [("per-sequence", False, False), ("batched", cuda, False), ("static", cuda, False)]
    if cuda:
        variants.append(("cuda-graphs", True, False))
    if compile_layers:
        variants.append((variants[-1][0], True, True))
    return variants


def path_rows(runs: dict[tuple[str, bool, bool], dict[str, Any]], batch: int) -> list[PathRow]:
    """The rows of the notebook's ``decode_paths``: one engine benchmark summary per (path, fused, compiled)."""
    return [PathRow(path, fused, compiled, batch, r["itl_ms"]["p50"], 1e3 / r["itl_ms"]["p50"],
                    r["output_tokens_per_s"], r["decode_path"]["graphs_captured"])
            for (path, fused, compiled), r in runs.items()]


def run_paths(lm: Any, sizes: Sizes, batch: int | None = None, compile_layers: bool = False) -> list[PathRow]:
    """Run the notebook's own experiment (``decode_paths`` of ``infer_lab/notebooks/09_batching.py``).

    The variants are :func:`decode_path_variants` of this device: ``per-sequence`` (one attention
    call per request), ``batched`` (one call for all), ``static`` (fixed padded shapes,
    preallocated buffers) and, on a GPU, ``cuda-graphs`` (the static step captured once, replayed
    with one launch); with ``compile_layers`` the fastest also with torch.compile's fused layers
    (compiled during the warm-up: tens of seconds on a CPU). ``batch`` overrides ``sizes.paths_batch``.
    """
    batch = batch or sizes.paths_batch
    experiment = notebook_function(NUMBER, "decode_paths")
    variants = decode_path_variants(lm.device.type == "cuda", compile_layers)
    return path_rows(experiment(lm, variants, batch, sizes.paths_prompt_len, sizes.paths_output_len), batch)


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


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "steps": lambda: run_steps(lm, sizes),
        "batching": lambda: run_batching(lm, sizes),
        "sweep": lambda: run_sweep(lm, sizes),
        "predicted": lambda: run_predicted(lm, sizes),
        "paths": lambda: run_paths(lm, sizes),
    })


# ---------------------------------------------------------------------------------------------
# Words


def workload_text(w: BatchingWorkload) -> str:
    return (f"{w.requests} requests of {w.prompt_len} prompt tokens, {min(w.output_lens)} to {max(w.output_lens)} "
            f"output tokens each ({w.output_tokens:,} in all, EOS ignored), all arriving at t = 0, "
            f"{w.concurrency} batch slots")


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


def dominated_points(sweep: Sequence[SweepPoint]) -> list[tuple[SweepPoint, SweepPoint]]:
    """(point, a point that beats it) for every point another one beats on both axes: at least as many
    tokens/s per user *and* in total, more on one. Such a point is off the Pareto frontier."""
    def beats(a: SweepPoint, b: SweepPoint) -> bool:
        return (a.tokens_per_s_per_user >= b.tokens_per_s_per_user and a.output_tokens_per_s >= b.output_tokens_per_s
                and (a.tokens_per_s_per_user, a.output_tokens_per_s) != (b.tokens_per_s_per_user, b.output_tokens_per_s))
    return [(p, next(q for q in sweep if beats(q, p))) for p in sweep if any(beats(q, p) for q in sweep)]


def _every_step(values: Sequence[float], rising: bool) -> bool:
    return all((b > a) if rising else (b < a) for a, b in zip(values, values[1:], strict=False))


def sweep_text(sweep: list[SweepPoint]) -> str:
    """What the sweep shows: the ends, whether each step traded per-user speed for total throughput,
    and which points are off the frontier (every number and word from ``sweep``)."""
    lo, hi = sweep[0], sweep[-1]
    text = (f"From concurrency {lo.concurrency} to {hi.concurrency}, total throughput went from "
            f"{lo.output_tokens_per_s:.1f} to **{hi.output_tokens_per_s:.1f} tokens/s** "
            f"({hi.output_tokens_per_s / lo.output_tokens_per_s:.1f}×), while each user's speed went from "
            f"{lo.tokens_per_s_per_user:.1f} to {hi.tokens_per_s_per_user:.1f} tokens/s.")
    if len(sweep) < 3:
        return text + (f" With {count(len(sweep), 'point')} this is a segment, not yet a curve: add "
                       "concurrencies to see the frontier's shape.")
    totals = [p.output_tokens_per_s for p in sweep]
    per_user = [p.tokens_per_s_per_user for p in sweep]
    if _every_step(totals, rising=True) and _every_step(per_user, rising=False):
        trade = (f"At each of the {len(sweep) - 1} steps up in concurrency, total throughput rose and each "
                 "user's speed fell: every point is a different trade, on one frontier.")
    else:
        trade = ("Not every step up in concurrency traded per-user speed for total throughput on this run "
                 "(one run per point: a busy machine bends the curve).")
    off = dominated_points(sweep)
    if off:
        trade += " Off the frontier: " + "; ".join(
            f"concurrency {p.concurrency} (concurrency {q.concurrency} was at least as fast for each user and in total)"
            for p, q in off) + "."
    return f"{text} {trade}"


def predicted_text(predicted: PredictedResult) -> str:
    first, last = predicted.points[0], predicted.points[-1]
    return (f"On {predicted.roof} ({predicted.dtype}), the engine's decode step took "
            f"{first.measured_over_predicted:.1f}× the roofline's prediction at batch {first.batch} "
            f"({first.measured_ms:.1f} ms vs {first.predicted_ms:.2f} ms) and {last.measured_over_predicted:.1f}× "
            f"at batch {last.batch} ({last.measured_ms:.1f} ms vs {last.predicted_ms:.2f} ms). The gap is the "
            "engine's software: Python and per-op overhead, GEMV efficiency, the gather of paged K/V.")


def paths_text(paths: list[PathRow]) -> str:
    fast = max(paths, key=lambda r: r.tokens_per_s_per_user)
    slow = min(paths, key=lambda r: r.tokens_per_s_per_user)
    return (f"At batch {fast.batch}, the fastest path here is **{fast.label}** at {fast.itl_ms_p50:.1f} ms per "
            f"token ({fast.tokens_per_s_per_user:.1f} tokens/s per user), the slowest **{slow.label}** at "
            f"{slow.itl_ms_p50:.1f} ms: {fast.tokens_per_s_per_user / slow.tokens_per_s_per_user:.2f}× apart.")


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {count(result.threads, 'torch thread')}."]
    if result.steps:
        lines.append(steps_text(result.steps.runs, result.steps.slots))
    if result.batching:
        lines.append(batching_text(result.batching))
    if result.sweep:
        lines.append(sweep_text(result.sweep))
    if result.predicted:
        lines.append(predicted_text(result.predicted))
    if result.paths:
        lines.append(paths_text(result.paths))
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Tables

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
SWEEP_COLUMNS = [
    Column("concurrency", "concurrency", "int"), Column("requests", "requests", "int"),
    Column("tokens_per_s_per_user", "tokens/s per user"), Column("output_tokens_per_s", "tokens/s total"),
    Column("ttft_ms_p50", "TTFT p50 (ms)"), Column("itl_ms_p50", "ITL p50 (ms)"), Column("itl_ms_p99", "ITL p99 (ms)"),
]
PREDICTED_COLUMNS = [
    Column("batch", "batch", "int"), Column("context", "context (tokens)", "int"),
    Column("predicted_ms", "predicted (ms)"), Column("measured_ms", "measured (ms)"),
    Column("measured_over_predicted", "measured / predicted", "ratio"),
    Column("predicted_bound", "predicted bound", "text"), Column("steps_timed", "steps timed", "int"),
]
PATHS_COLUMNS = [
    Column("label", "decode path", "text"), Column("batch", "batch", "int"),
    Column("itl_ms_p50", "ITL p50 (ms)"), Column("tokens_per_s_per_user", "tokens/s per user"),
    Column("output_tokens_per_s", "output tokens/s (whole run)"), Column("graphs_captured", "CUDA graphs", "int"),
]


def batching_table(batching: BatchingResult):
    return people_table(batching.rows, BATCHING_COLUMNS)


def sweep_table(sweep: list[SweepPoint]):
    return people_table(sweep, SWEEP_COLUMNS)


def predicted_table(predicted: PredictedResult):
    return people_table(predicted.points, PREDICTED_COLUMNS)


def paths_table(paths: list[PathRow]):
    return people_table(paths, PATHS_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.batching:
        out["Contenders on one workload"] = batching_table(result.batching)
    if result.sweep:
        out["Concurrency sweep (continuous batching)"] = sweep_table(result.sweep)
    if result.predicted:
        out["Decode step: predicted vs measured"] = predicted_table(result.predicted)
    if result.paths:
        out["Decode paths"] = paths_table(result.paths)
    return out


# ---------------------------------------------------------------------------------------------
# Figures


def _wrap(text: str, width: int = 90) -> str:
    return textwrap.fill(text, width, break_on_hyphens=False)


def batching_figure(batching: BatchingResult, source: str):
    """One bar per contender: throughput, idle slots, and TTFT / ITL at p50, p90, p99 (ms)."""
    import matplotlib
    import numpy as np

    from ..figures import subplots

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


def _log_if_wide(ax: Any, axis: str, values: list[float]) -> None:
    """Log scale on ``axis`` when the values span more than a decade and a half."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 30:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    else:
        (ax.set_xlim if axis == "x" else ax.set_ylim)(0, max(values) * 1.15)


def sweep_figure(sweep: list[SweepPoint], source: str):
    """Total output tokens/s vs tokens/s per user, one point per concurrency (the serving frontier)."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(6.5, 4))
    xs, ys = [p.tokens_per_s_per_user for p in sweep], [p.output_tokens_per_s for p in sweep]
    ax.plot(xs, ys, "o-")
    for p in sweep:
        ax.annotate(f" {p.concurrency}", (p.tokens_per_s_per_user, p.output_tokens_per_s), fontsize=9)
    _log_if_wide(ax, "x", xs)
    _log_if_wide(ax, "y", ys)
    ax.set(xlabel="tokens/s per user (1 / mean ITL)", ylabel="total output tokens/s")
    ax.grid(alpha=0.3)
    ax.set_title(f"Concurrency sweep (labels: concurrent requests)\n{_wrap(source, 70)}", fontsize=10)
    finish(fig)
    return fig


def _plain_log_ticks(ax: Any, batches: list[int]) -> None:
    """Log axes labelled with plain numbers: the batch sizes on x, ``0.5``/``20``/``400`` on y."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xticks(batches, [str(b) for b in batches])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))


def predicted_figure(predicted: PredictedResult, source: str):
    """Predicted (roofline) and measured engine decode step time vs batch size, log-log."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(6.5, 4))
    batches = [p.batch for p in predicted.points]
    ax.plot(batches, [p.predicted_ms for p in predicted.points], "*-",
            label=f"predicted (roofline on {predicted.roof})")
    ax.plot(batches, [p.measured_ms for p in predicted.points], "x-", label="measured (engine, p50 of decode steps)")
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences per decode step)", ylabel="decode step time (ms)")
    _plain_log_ticks(ax, batches)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"Decode step: predicted vs measured\n{_wrap(source, 70)}", fontsize=10)
    finish(fig)
    return fig


def paths_figure(paths: list[PathRow], source: str):
    """Tokens/s per user (1 / ITL p50) of each decode path, with the ITL in ms on each bar."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(7, 0.5 * len(paths) + 1.8))
    ax.barh([r.label for r in paths], [r.tokens_per_s_per_user for r in paths])
    for i, r in enumerate(paths):
        ax.text(r.tokens_per_s_per_user, i, f" {r.itl_ms_p50:.1f} ms", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set(xlabel="tokens/s per user (1 / ITL p50)", xlim=(0, max(r.tokens_per_s_per_user for r in paths) * 1.25))
    ax.grid(alpha=0.3, axis="x")
    ax.set_title(f"Decode paths, batch {paths[0].batch}\n{_wrap(source, 70)}", fontsize=10)
    finish(fig)
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.steps:
        out["steps"] = steps_figure(result.steps.runs, result.steps.slots, result.model)
    if result.batching:
        out["batching"] = batching_figure(result.batching, result.model)
    if result.sweep:
        out["sweep"] = sweep_figure(result.sweep, result.model)
    if result.predicted:
        out["predicted"] = predicted_figure(result.predicted, result.model)
    if result.paths:
        out["paths"] = paths_figure(result.paths, result.model)
    return out


# ---------------------------------------------------------------------------------------------
# The saved H200 anchors


@dataclass(frozen=True)
class AnchorRow:
    """One batch size of the saved H200 anchors: a naive CUDA-graph decode vs the HF eager step."""

    batch: int
    graph_step_ms: float
    graph_tokens_per_s: float
    weight_GBps: float
    bandwidth_share: float | None  # all bytes moved per second / measured copy bandwidth
    hf_step_ms: float | None

    @property
    def hf_over_graph(self) -> float | None:
        return self.hf_step_ms / self.graph_step_ms if self.hf_step_ms else None


def anchor_rows(sol: SavedResult, baseline: SavedResult | None) -> list[AnchorRow]:
    """Rows of the sol-decode anchor (``b1``, ``b8`` ...), with the HF step at the same batch when saved."""
    copy_Bps = baseline.data["copy_TBps"] * 1e12 if baseline else None
    hf = {r["batch"]: r["step_ms"] for r in baseline.data["batch_sweep"]} if baseline else {}
    rows = []
    for key, r in sorted(((k, v) for k, v in sol.data.items() if k.startswith("b") and k[1:].isdigit()),
                         key=lambda kv: int(kv[0][1:])):
        b = int(key[1:])
        rows.append(AnchorRow(b, r["step_ms"], r["tok_s"], r["GBps_weights"],
                              r["GBps_all"] * 1e9 / copy_Bps if copy_Bps else None, hf.get(b)))
    return rows


def launch_overhead_text() -> str:
    """Why a GPU decode step is launch-bound, with the saved H200 HF baseline's numbers (labelled)."""
    found = load_saved(HF_BASELINE_FILE)
    if not found:
        return ("On a GPU, the HF eager decode step of a 7B model takes many times its weight-streaming time: "
                "Python launches hundreds of kernels one by one and the GPU waits for each.")
    src = found[0]
    d = src.data
    from ..analysis.compare import saved_baseline_vs_roofline
    from ..analysis.params import param_counts
    from .ch02_feel_the_pain import saved_batch1_text

    model = str(src.raw.get("model"))
    counts = param_counts(model)
    # a token reads one row of the embedding table: every other weight is streamed each step
    read = d["weight_bytes"] - counts.embeddings * d["weight_bytes"] / counts.total
    # the roofline's batch-1 step at 512 tokens on that run's ceilings: the figure chapter 04 compares with
    stream_ms = next(r["predicted"] for r in saved_baseline_vs_roofline(src.raw)
                     if r["quantity"].startswith("decode") and r["batch"] == 1 and r["context"] == 512)
    return (
        f"At batch 1 a decode step of the {model} shape must stream {read / GB:.1f} GB of its "
        f"{d['weight_bytes'] / GB:.1f} GB of weights (the embedding table is looked up one row per token, not "
        f"streamed) plus the KV cache: {stream_ms:.1f} ms at 512 tokens on the roofline of the {d['copy_TBps']:.2f} "
        f"TB/s copy "
        f"bandwidth measured on an {src.device}. The HF eager step measured on that machine took "
        f"{saved_batch1_text(d, stream_ms)}: Python launches hundreds of kernels one by one and the GPU waits "
        f"for each. _{src.label}._"
    )


def _anchor_figure(rows: list[AnchorRow], device: str, model: str):
    from ..figures import subplots

    fig, ax = subplots(figsize=(6.5, 4))
    batches = [r.batch for r in rows]
    ax.plot(batches, [r.graph_step_ms for r in rows], "o-", label="naive decode in a CUDA graph")
    hf = [r for r in rows if r.hf_step_ms is not None]
    if hf:
        ax.plot([r.batch for r in hf], [r.hf_step_ms for r in hf], "s--", label="HF transformers eager (noisy run)")
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences per decode step)", ylabel="decode step (ms)")
    _plain_log_ticks(ax, batches)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(f"Saved, not measured here: decode step on {device}\n{model} shape, random bf16 weights",
                 fontsize=10)
    finish(fig)
    return fig


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
        from .ch02_feel_the_pain import saved_warning

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
