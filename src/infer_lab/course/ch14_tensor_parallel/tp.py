"""Part 1, run (``tp``): the notebook's ``tensor_parallel`` on 2 CPU processes, its result, tables and figure."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...analysis.parallel import ring_allreduce_s
from ...figures import finish, subplots
from ...models import load_model
from ...parallel.bench import AllReduceSweep
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, TP_QUESTIONS, TP_WORLD_SIZE, Sizes


@dataclass(frozen=True)
class StepRow:
    """The median decode step of one run (ms): in all-reduces, and the rest."""

    label: str
    world_size: int
    rank: int
    threads: int
    steps: int
    step_ms: float
    comm_ms: float
    compute_ms: float
    allreduces_per_step: int
    allreduce_bytes_per_step: int
    prefill_ms: float
    prefill_comm_ms: float

    @property
    def comm_share(self) -> float:
        return self.comm_ms / self.step_ms if self.step_ms else 0.0


@dataclass(frozen=True)
class TPResult:
    """World size 1 vs 2 on this machine, the all-reduce sweep and the model's prediction."""

    model: str
    device: str
    plan: str
    world_size: int
    layers: int
    hidden: int
    busiest_work_share: float
    largest_split_share: float
    prompt_tokens: list[int]
    new_tokens: int
    token_ids_ws1: list[list[int]]
    token_ids_tp: list[list[int]]
    token_ids_hf: list[list[int]]
    text_tp: list[str]
    runs: list[StepRow]
    sweep: AllReduceSweep
    message_bytes: int  # of one all-reduce in the median decode step
    predicted_comm_ms: float  # per decode step, from the fitted ring model
    predicted_tp_step_ms: float  # each rank its own memory (the GPU model): compute x busiest share + comm
    predicted_shared_bus_step_ms: float  # one shared memory bus (this CPU): compute unchanged + comm
    split_params: list[int]
    replicated_params: int
    n_params: int
    kv_bytes_per_rank: list[int]
    cores: int
    load_average: float  # 1-minute load average when the run ended (other programs on the cores)
    decode_steps: list[tuple[int, int, int]] = field(default_factory=list)  # rank 0: (tokens, all-reduces, bytes)
    single_allreduces: int = 0  # all-reduces of the world-size-1 runs (none to make)
    act_bytes: int = 4  # bytes per activation value in the messages (the model's dtype: fp32 here)

    @property
    def steps_matching_prediction(self) -> int:
        """Rank 0's decode steps with exactly 2 x layers all-reduces of tokens x hidden x act_bytes each."""
        return sum(calls == 2 * self.layers and nbytes == calls * tokens * self.hidden * self.act_bytes
                   for tokens, calls, nbytes in self.decode_steps)

    @property
    def identical_ws1(self) -> bool:
        return self.token_ids_tp == self.token_ids_ws1

    @property
    def identical_hf(self) -> bool:
        return self.token_ids_tp == self.token_ids_hf

    def run(self, world_size: int, rank: int = 0, threads: int | None = None) -> StepRow:
        rows = [r for r in self.runs if r.world_size == world_size and r.rank == rank
                and (threads is None or r.threads == threads)]
        return rows[0]

    @property
    def single_process_runs(self) -> list[StepRow]:
        return [r for r in self.runs if r.world_size == 1]

    @property
    def reference(self) -> StepRow:
        """The fastest world-size-1 run (all the ranks' threads, or one rank's): the strongest
        single-process baseline on this machine."""
        return min(self.single_process_runs, key=lambda r: r.step_ms)

    @property
    def one_rank(self) -> StepRow:
        """World size 1 with one rank's threads: the 'one GPU' of a GPU comparison."""
        tp_threads = self.run(self.world_size).threads
        return next(r for r in self.runs if r.world_size == 1 and r.threads == tp_threads)


def tp_model(lm: Any) -> Any:
    """The model the TP part splits: ``lm`` when it is a Llama-family model on the CPU, else the
    embedded SmolLM2 (the demonstration runs on CPU processes, whatever device the page uses)."""
    if lm is None or lm.device.type != "cpu" or lm.config.model_type not in ("llama", "mistral", "qwen2"):
        lm = load_model("smollm2-135m", device="cpu")
    return lm


def tp_prompts(lm: Any, sizes: Sizes) -> list[list[int]]:
    """The run's prompts: chat questions, or random ids when the model has no tokenizer."""
    n = sizes.tp_prompts
    if lm.tokenizer is None or lm.is_random:
        return [lm.random_ids(1, 12 + 5 * i, seed=i)[0].tolist() for i in range(n)]
    return [lm.chat_ids(TP_QUESTIONS[i % len(TP_QUESTIONS)])[0].tolist() for i in range(n)]


def _step_row(label: str, run: Any, rank: int) -> StepRow:
    split = run.decode_split(rank)
    pre = run.prefill_step(rank)
    return StepRow(label, run.world_size, rank, run.ranks[rank].threads, split.steps, split.wall_s * 1e3,
                   split.comm_s * 1e3, split.compute_s * 1e3, split.allreduce_calls, split.allreduce_bytes,
                   pre.wall_s * 1e3, pre.comm_s * 1e3)


def _threads_label(n: int) -> str:
    return f"{n} thread{'s' * (n > 1)}"


def tp_result(lm: Any, prompts: list[list[int]], new_tokens: int, single: list[Any], split: Any,
              sweep: AllReduceSweep, plan: Any, reference: list[list[int]]) -> TPResult:
    """What the notebook's ``tensor_parallel`` returned, with the predictions, as one result.

    ``single``: world-size-1 runs, the first with all this process's threads (then, when it differs,
    one with one rank's share); ``split``: the TP run; ``plan``: its split of the weights;
    ``reference``: transformers' greedy tokens."""
    ws, per_rank = split.world_size, split.threads
    runs = [_step_row(f"1 process, {_threads_label(r.threads)}", r, 0) for r in single[:1]]
    runs += [_step_row(f"1 process, {_threads_label(r.threads)} (one rank's share)", r, 0) for r in single[1:]]
    runs += [_step_row(f"{ws} processes, rank {r} ({_threads_label(per_rank)})", split, r) for r in range(ws)]
    tp_row = runs[-ws]
    message = tp_row.allreduce_bytes_per_step // max(1, tp_row.allreduces_per_step)
    predicted_comm = tp_row.allreduces_per_step * sweep.predicted_s(message) * 1e3
    one_rank = next((r for r in runs if r.world_size == 1 and r.threads == per_rank), runs[0])
    eos = lm.eos_token_ids
    texts = [lm.tokenizer.decode([t for t in ids if t not in eos]) if lm.tokenizer is not None else ""
             for ids in split.token_ids]
    decode = [s for s in split.steps if s.phase == "decode"]
    return TPResult(
        model=lm.describe(), device=f"{ws} CPU processes (gloo), {per_rank} thread(s) each",
        plan=plan.describe(), world_size=ws, layers=plan.layers, hidden=plan.hidden,
        busiest_work_share=plan.busiest_work_share, largest_split_share=plan.largest_share,
        prompt_tokens=[len(p) for p in prompts], new_tokens=new_tokens, token_ids_ws1=single[0].token_ids,
        token_ids_tp=split.token_ids, token_ids_hf=reference, text_tp=texts, runs=runs, sweep=sweep,
        message_bytes=message, predicted_comm_ms=predicted_comm,
        predicted_tp_step_ms=one_rank.compute_ms * plan.busiest_work_share + predicted_comm,
        predicted_shared_bus_step_ms=one_rank.compute_ms + predicted_comm,
        split_params=[r.split_params for r in split.ranks], replicated_params=split.ranks[0].replicated_params,
        n_params=lm.n_params, kv_bytes_per_rank=[r.kv_cache_bytes for r in split.ranks], cores=os.cpu_count() or 1,
        load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0,
        decode_steps=[(s.tokens, s.allreduce_calls, s.allreduce_bytes) for s in decode],
        single_allreduces=sum(s.allreduce_calls for r in single for s in r.steps),
        act_bytes=torch.empty((), dtype=lm.model.dtype).element_size(),
    )


def run_tp(lm: Any, sizes: Sizes, world_size: int = TP_WORLD_SIZE) -> TPResult:
    """Run the notebook's own experiment (``tensor_parallel`` of ``infer_lab/notebooks/14_tensor_parallel.py``)."""
    experiment = notebook_function(NUMBER, "tensor_parallel")
    lm = tp_model(lm)
    prompts = tp_prompts(lm, sizes)
    runs = experiment(lm, prompts, sizes.tp_new_tokens, world_size, sizes.sweep_sizes, sizes.sweep_repeats)
    return tp_result(lm, prompts, sizes.tp_new_tokens, *runs)


TP_STEP_COLUMNS = [
    Column("label", "run", "text"), Column("steps", "decode steps", "int"),
    Column("step_ms", "step p50 (ms)"), Column("compute_ms", "compute (ms)"), Column("comm_ms", "in all-reduces (ms)"),
    Column("comm_share", "all-reduce share", "pct"), Column("allreduces_per_step", "all-reduces / step", "int"),
    Column("allreduce_bytes_per_step", "bytes / step", "int"), Column("prefill_ms", "prefill step (ms)"),
]
SWEEP_COLUMNS = [
    Column("message_bytes", "message (bytes)", "int"), Column("p50_s", "p50 (µs)", scale=1e6),
    Column("p90_s", "p90 (µs)", scale=1e6), Column("min_s", "min (µs)", scale=1e6),
    Column("predicted_s", "fit (µs)", scale=1e6), Column("algorithm_bandwidth_Bps", "algbw (MB/s)", scale=1e-6),
]


TP_STEP_LESSON_COLUMNS = ("run", "step p50 (ms)", "compute (ms)", "in all-reduces (ms)", "all-reduce share",
                          "all-reduces / step")  # what the page shows; the rest is behind "every column"


def tp_steps_table(tp: TPResult, lesson: bool = False):
    """Every run's decode step (``lesson=True``: only the columns the page's finding reads)."""
    frame = people_table(tp.runs, TP_STEP_COLUMNS)
    return frame[list(TP_STEP_LESSON_COLUMNS)] if lesson else frame


def sweep_table(tp: TPResult):
    rows = [{"message_bytes": p.message_bytes, "p50_s": p.p50_s, "p90_s": p.p90_s, "min_s": p.min_s,
             "predicted_s": tp.sweep.predicted_s(p.message_bytes),
             "algorithm_bandwidth_Bps": p.algorithm_bandwidth_Bps} for p in tp.sweep.points]
    return people_table(rows, SWEEP_COLUMNS)


def tp_figure(tp: TPResult):
    """Left: all-reduce time vs message size (measured, fitted, and NVLink's model for scale).
    Right: the decode step split into compute and all-reduces, per run, and the prediction."""
    fig, (ax, bx) = subplots(1, 2, figsize=(11, 3.9))
    pts = tp.sweep.points
    x = np.array([p.message_bytes for p in pts], dtype=float)
    ax.errorbar(x, [p.p50_s * 1e6 for p in pts], yerr=[[0] * len(pts), [(p.p90_s - p.p50_s) * 1e6 for p in pts]],
                fmt="ko", capsize=3, label="measured p50 (bar to p90)")
    grid = np.geomspace(x.min(), x.max(), 60)
    ax.plot(grid, [tp.sweep.predicted_s(int(g)) * 1e6 for g in grid], "-", color="tab:red",
            label=f"fit: {tp.sweep.latency_s * 1e6:,.0f} µs + bytes / {tp.sweep.bus_bandwidth_Bps / 1e9:.2f} GB/s")
    ax.plot(grid, [ring_allreduce_s(2, int(g), "nvlink4-nvswitch") * 1e6 for g in grid], "--", color="tab:green",
            label="model: 2 x H100 SXM on NVLink 4 (catalog)")
    ax.axvline(tp.message_bytes, color="gray", ls=":", lw=1)
    ax.text(tp.message_bytes, 0.04, " a decode step's message", transform=ax.get_xaxis_transform(), fontsize=7,
            ha="left", va="bottom", color="gray")
    ax.set(xscale="log", yscale="log", xlabel="message (bytes, log)", ylabel="one all-reduce (µs, log)")
    ax.set_title(f"All-reduce, {tp.world_size} gloo processes on this CPU", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))  # below the axes: it hides no point
    labels = [r.label.replace(" (one rank's share)", "\n(one rank's share)").replace(", rank", "\nrank")
              for r in tp.runs]
    xs = np.arange(len(tp.runs))
    transfer = [min(r.comm_ms, tp.predicted_comm_ms) if r.world_size > 1 else 0.0 for r in tp.runs]
    waiting = [r.comm_ms - t for r, t in zip(tp.runs, transfer, strict=True)]
    bx.bar(xs, [r.compute_ms for r in tp.runs], color="tab:blue", label="compute")
    bx.bar(xs, transfer, bottom=[r.compute_ms for r in tp.runs], color="tab:orange",
           label="all-reduces: transfer (the fit)")
    bx.bar(xs, waiting, bottom=[r.compute_ms + t for r, t in zip(tp.runs, transfer, strict=True)],
           color="tab:orange", alpha=0.4, hatch="//", label="all-reduces: waiting")
    first_tp = next(i for i, r in enumerate(tp.runs) if r.world_size > 1)
    span = [first_tp - 0.4, len(tp.runs) - 0.6]
    bx.plot(span, [tp.predicted_tp_step_ms] * 2, "k--", lw=1, label="predicted: each rank its own memory (GPU)")
    bx.plot(span, [tp.predicted_shared_bus_step_ms] * 2, "k:", lw=1.2, label="predicted: one shared memory bus")
    bx.set_xticks(xs, labels, fontsize=7)
    tallest = max([r.compute_ms + r.comm_ms for r in tp.runs] + [tp.predicted_tp_step_ms, tp.predicted_shared_bus_step_ms])
    bx.set(ylabel="decode step p50 (ms)", ylim=(0, tallest * 1.75))  # headroom: the legend sits above the bars
    bx.set_title(f"Decode step: compute vs all-reduces (load average {tp.load_average:.1f})", fontsize=9)
    bx.legend(fontsize=7, loc="upper left", ncol=2)
    fig.suptitle(f"Tensor parallelism on this machine: {tp.model}", fontsize=10)
    finish(fig)
    return fig
