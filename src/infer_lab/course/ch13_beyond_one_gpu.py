"""Chapter 13, "Beyond one GPU": tensor parallelism for real, a scaling model, disaggregation.

1. **Tensor parallelism, run**: the embedded model split over 2 CPU processes (gloo), token for
   token the same as one process and as transformers; every all-reduce counted and timed; the
   all-reduce cost fitted (latency + bandwidth) and held against the step time.
2. **Scaling on catalogued GPUs** (analytic): TP 1/2/4/8 ITL is sublinear; on PCIe replicas
   beat TP; the Pareto frontier of speed vs throughput per GPU with energy and $ per token; the
   "fast mode" a public talk on inference described (about 6x compute for 2x speed), computed.
3. **Serving a cluster** (the simulator): colocated vs prefill/decode disaggregated, for a
   prefill-heavy (summarize) and a decode-heavy (story) workload: TTFT/ITL percentiles, goodput
   per GPU, the best P:D, the tail ITL, and the throughput ceiling.
4. **Heterogeneous hardware** (prefill on compute, decode on bandwidth), the cited wafer-scale
   data point, and the attention/FFN split of a large MoE (analytic).
5. **The planner's answer** and the exact vLLM / SGLang launch commands for it.
6. **The simulator checked** against our engine's measured continuous-batching run.

Our engine does not pretend to be a distributed engine: part 1 is the mechanism, small enough
to read; the launch commands of part 5 are how to serve across GPUs for real.
"""

from __future__ import annotations

import os
import shlex
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.parallel import FastMode, FrontierPoint
from ..analysis.plausibility import caution, line_fit_flags
from ..cluster.attention_ffn import AFDPoint
from ..cluster.engine_check import TOLERANCES, SimVsEngine
from ..cluster.hetero import PhaseFitness
from ..cluster.report import SLO, ClusterReport
from ..figures import finish
from ..parallel.bench import AllReduceSweep
from ..units import human
from .chapter import ChapterResult, choose_size, run_parts
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "13"
SLUG = "beyond_one_gpu"
TITLE = "13 · Beyond one GPU: tensor parallelism, scaling, disaggregation"
NEEDS_MODEL = True
PARTS = {
    "tp": "Run tensor parallelism on 2 CPU processes",
    "scaling": "Scale TP on catalogued GPUs",
    "cluster": "Simulate colocated vs disaggregated serving",
    "hetero": "Heterogeneous hardware and the attention/FFN split",
    "plan": "The planner's answer and its launch command",
    "check": "Check the simulator against our engine",
}
# Parts that need no model and measure nothing here (computed or simulated): the saved-only deck keeps them.
ANALYTIC_PARTS = ("scaling", "cluster", "hetero", "plan")

# Claims quoted in a public talk on LLM inference, kept as cited numbers to compare the model with.
TALK_FAST_MODE_COMPUTE = 6.0  # "about 6x compute per token ..."
TALK_FAST_MODE_SPEEDUP = 2.0  # "... for about 2x speed"
TALK_TP_SPEEDUP_AT_4 = 2.0  # "4x GPUs gave about 2x speed"
TP_QUESTIONS = (
    "What is the capital of France?",
    "Explain a KV cache in one sentence.",
    "Give me three prime numbers.",
    "Why is the sky blue? Answer briefly.",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
    "What does a CPU do?",
    "Name a famous painting.",
)


@dataclass(frozen=True)
class Sizes:
    """What each part runs: prompts and tokens of the TP run, the all-reduce sweep, the
    simulated cluster and the engine check."""

    size: str
    world_size: int
    tp_prompts: int
    tp_new_tokens: int
    sweep_quick: bool
    sweep_repeats: int
    scaling_model: str
    scaling_batch: int
    scaling_context: int
    cluster_model: str
    cluster_gpu: str
    cluster_gpus: int
    cluster_requests: int
    check_prompts: int
    check_new_tokens: int
    check_slots: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Quick: a few prompts and tokens (about 20 s on 2 busy cores, mostly starting 2 processes)."""
    size = choose_size(device, size)
    common = dict(world_size=2, scaling_model="llama-3-70b", scaling_batch=16, scaling_context=8192,
                  cluster_model="llama-3-8b", cluster_gpu="H100-SXM")
    if size == "quick":
        return Sizes(size, tp_prompts=4, tp_new_tokens=6, sweep_quick=True, sweep_repeats=15, cluster_gpus=4,
                     cluster_requests=60, check_prompts=6, check_new_tokens=6, check_slots=3, **common)
    return Sizes(size, tp_prompts=8, tp_new_tokens=16, sweep_quick=False, sweep_repeats=40, cluster_gpus=8,
                 cluster_requests=300, check_prompts=12, check_new_tokens=12, check_slots=4, **common)


# ---------------------------------------------------------------------------------------------
# Part 1: tensor parallelism on CPU processes


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


def _tp_engine_model(lm: Any):
    """The model the TP part splits: ``lm`` when it is a Llama-family model on the CPU, else
    the embedded SmolLM2 (the demonstration runs on CPU processes)."""
    from ..models import load_model
    from ..parallel.runtime import tp_engine_model

    if lm is None or lm.device.type != "cpu" or lm.config.model_type not in ("llama", "mistral", "qwen2"):
        lm = load_model("smollm2-135m", device="cpu")
    return lm, tp_engine_model(lm)


@dataclass(frozen=True)
class SplitRow:
    """What one rank holds at one world size (the rule of :mod:`infer_lab.parallel.shard`)."""

    world_size: int
    rank: int
    kv_heads: str
    query_heads: str
    mlp_columns: str
    split_params: int
    busiest_work_share: float


def split_rows(model: str = "smollm2-135m") -> tuple[list[SplitRow], str]:
    """Every world size the rule allows for ``model``, rank by rank, and why the next one fails."""
    from ..analysis.memory import as_shape
    from ..parallel.shard import plan_shards

    shape = as_shape(model)
    rows = []
    for ws in range(1, shape.kv_heads + 1):
        plan = plan_shards(shape, ws)
        for sh in plan.shares:
            rows.append(SplitRow(ws, sh.rank, f"{sh.kv_heads[0]}..{sh.kv_heads[1] - 1}",
                                 f"{sh.q_heads[0]}..{sh.q_heads[1] - 1}", f"{sh.mlp[0]}..{sh.mlp[1] - 1}",
                                 plan.layers * plan.split_params_per_layer(sh), plan.busiest_work_share))
    try:
        plan_shards(shape, shape.kv_heads + 1)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    return rows, refused


def split_text(model: str = "smollm2-135m", world_size: int = 2) -> str:
    """The rule applied to ``model`` at ``world_size``, in words, every number from the shape."""
    from ..analysis.memory import as_shape
    from ..parallel.shard import plan_shards

    shape = as_shape(model)
    plan = plan_shards(shape, world_size)

    def each(attr: str) -> str:
        return " + ".join(str(getattr(sh, attr)) for sh in plan.shares)

    return (
        f"{model} has {shape.heads} query heads sharing {shape.kv_heads} KV heads (groups of "
        f"{shape.heads // shape.kv_heads}) and {shape.intermediate:,} MLP columns. The rule splits whole KV groups, "
        f"as evenly as possible: on {world_size} ranks that is {each('n_kv_heads')} KV heads, so "
        f"{each('n_heads')} query heads, and {each('n_mlp')} MLP columns."
    )


SPLIT_COLUMNS = [
    Column("world_size", "world size", "int"), Column("rank", "rank", "int"), Column("kv_heads", "KV heads", "text"),
    Column("query_heads", "query heads", "text"), Column("mlp_columns", "MLP columns", "text"),
    Column("split_params", "split parameters", "int"), Column("busiest_work_share", "busiest rank's work", "pct"),
]


def split_table(model: str = "smollm2-135m"):
    return people_table(split_rows(model)[0], SPLIT_COLUMNS)


def _prompts(lm: Any, n: int) -> list[list[int]]:
    if lm.tokenizer is None or lm.is_random:
        return [lm.random_ids(1, 12 + 5 * i, seed=i)[0].tolist() for i in range(n)]
    return [lm.chat_ids(TP_QUESTIONS[i % len(TP_QUESTIONS)])[0].tolist() for i in range(n)]


@torch.inference_mode()
def _hf_greedy(lm: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers ``generate`` per prompt, greedy, stopping at EOS (kept) like our loop."""
    out = []
    for p in prompts:
        ids = lm.model.generate(torch.tensor([p], device=lm.device), max_new_tokens=new_tokens, do_sample=False,
                                eos_token_id=lm.model.config.eos_token_id, pad_token_id=lm.model.config.eos_token_id)
        out.append(ids[0, len(p):].tolist())
    return out


def _step_row(label: str, run: Any, rank: int) -> StepRow:
    split = run.decode_split(rank)
    pre = run.prefill_step(rank)
    return StepRow(label, run.world_size, rank, run.ranks[rank].threads, split.steps, split.wall_s * 1e3,
                   split.comm_s * 1e3, split.compute_s * 1e3, split.allreduce_calls, split.allreduce_bytes,
                   pre.wall_s * 1e3, pre.comm_s * 1e3)


def measure_tp(lm: Any, sizes: Sizes) -> TPResult:
    """World size 1 in this process and world size 2 in two gloo processes, same prompts, greedy."""
    from ..parallel.bench import default_sizes
    from ..parallel.runtime import TPGroup, run_local

    lm, em = _tp_engine_model(lm)
    prompts = _prompts(lm, sizes.tp_prompts)
    new = sizes.tp_new_tokens
    threads = torch.get_num_threads()
    per_rank = max(1, threads // sizes.world_size)
    ws1 = run_local(em, prompts, new, threads=threads)
    runs = [_step_row(f"1 process, {threads} thread{'s' * (threads > 1)}", ws1, 0)]
    if per_rank != threads:
        one = run_local(em, prompts, new, threads=per_rank)
        runs.append(_step_row(f"1 process, {per_rank} thread{'s' * (per_rank > 1)} (one rank's share)", one, 0))
    with TPGroup(em, sizes.world_size, backend="gloo", threads_per_rank=per_rank) as group:
        tp = group.generate(prompts, new)
        sweep = group.allreduce_sweep(default_sizes(sizes.sweep_quick), repeats=sizes.sweep_repeats)
        plan = group.plan
    runs += [_step_row(f"{sizes.world_size} processes, rank {r} ({per_rank} thread{'s' * (per_rank > 1)})", tp, r)
             for r in range(sizes.world_size)]
    hf = _hf_greedy(lm, prompts, new)
    tp_row = runs[-sizes.world_size]
    calls = max(1, tp_row.allreduces_per_step)
    message = tp_row.allreduce_bytes_per_step // calls
    predicted_comm = tp_row.allreduces_per_step * sweep.predicted_s(message) * 1e3
    one_rank = next(r for r in runs if r.world_size == 1 and r.threads == per_rank)
    eos = lm.eos_token_ids
    texts = [lm.tokenizer.decode([t for t in ids if t not in eos]) if lm.tokenizer is not None else ""
             for ids in tp.token_ids]
    split_params = [r.split_params for r in tp.ranks]
    return TPResult(
        model=lm.describe(), device=f"{sizes.world_size} CPU processes (gloo), {per_rank} thread(s) each",
        plan=plan.describe(), world_size=sizes.world_size, layers=em.shape.layers, hidden=em.shape.hidden,
        busiest_work_share=plan.busiest_work_share, largest_split_share=plan.largest_share,
        prompt_tokens=[len(p) for p in prompts], new_tokens=new, token_ids_ws1=ws1.token_ids,
        token_ids_tp=tp.token_ids, token_ids_hf=hf, text_tp=texts, runs=runs, sweep=sweep, message_bytes=message,
        predicted_comm_ms=predicted_comm,
        predicted_tp_step_ms=one_rank.compute_ms * plan.busiest_work_share + predicted_comm,
        predicted_shared_bus_step_ms=one_rank.compute_ms + predicted_comm,
        split_params=split_params, replicated_params=tp.ranks[0].replicated_params, n_params=lm.n_params,
        kv_bytes_per_rank=[r.kv_cache_bytes for r in tp.ranks], cores=os.cpu_count() or 1,
        load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0,
    )


def tp_text(tp: TPResult) -> str:
    """Identity, the all-reduce count, and why two ranks are slower here, from the numbers."""
    ref, one = tp.reference, tp.one_rank
    r0 = tp.run(tp.world_size, 0)
    slowest = max((tp.run(tp.world_size, r) for r in range(tp.world_size)), key=lambda r: r.step_ms)
    same = "identical" if tp.identical_ws1 and tp.identical_hf else "NOT identical"
    lines = [
        f"**Split:** {tp.plan}. Embedding, LM head and norms are replicated on every rank.",
        f"**Tokens:** world size {tp.world_size} picked {same} greedy tokens to world size 1 "
        f"({'same' if tp.identical_ws1 else 'different'}) and to transformers "
        f"({'same' if tp.identical_hf else 'different'}) on {len(tp.prompt_tokens)} prompts x "
        f"{tp.new_tokens} tokens.",
        f"**All-reduces:** {r0.allreduces_per_step} per decode step = 2 x {tp.layers} layers, each of "
        f"{tp.message_bytes:,} bytes (tokens x {tp.hidden} x 4 B); nothing else crosses between ranks.",
        caution(line_fit_flags("the all-reduce time", tp.sweep.latency_s, 1 / tp.sweep.bus_bandwidth_Bps,
                               unit="µs", scale=1e6)),
        f"**All-reduce cost here:** the fit (to each size's {tp.sweep.fitted_on} time) gives "
        f"{tp.sweep.latency_s * 1e6:,.0f} µs per call plus "
        f"{tp.sweep.bus_bandwidth_Bps / 1e9:.2f} GB/s of bus bandwidth, so one decode step's "
        f"{r0.allreduces_per_step} calls are predicted at {tp.predicted_comm_ms:.1f} ms; rank 0 measured "
        f"{r0.comm_ms:.1f} ms inside them ({r0.comm_ms / max(1, r0.allreduces_per_step) * 1e3:,.0f} µs per call "
        f"vs {tp.sweep.predicted_s(tp.message_bytes) * 1e6:,.0f} µs in the sweep, where both ranks start "
        "together). The difference is waiting: for the rank with more heads, and, "
        f"when the cores are oversubscribed (load average {tp.load_average:.1f} on {tp.cores} cores during this "
        "run), for the operating system to schedule the other rank at all.",
        f"**Step time:** {ref.step_ms:.0f} ms on 1 process with {ref.threads} thread(s)"
        + "".join(f" ({r.step_ms:.0f} ms with {r.threads} thread(s))" for r in tp.single_process_runs if r is not ref)
        + f", {slowest.step_ms:.0f} ms with {tp.world_size} ranks ({slowest.step_ms / ref.step_ms:.2f}x the best "
        "single process). "
        f"The GPU model (each rank reads its own memory) predicts {tp.predicted_tp_step_ms:.0f} ms: one rank's "
        f"compute ({one.compute_ms:.0f} ms at {one.threads} thread(s)) x {tp.busiest_work_share:.2f} (the busiest "
        f"rank's share of the weights: {tp.largest_split_share:.0%} of the split layers plus the whole "
        f"replicated LM head) + {tp.predicted_comm_ms:.1f} ms of all-reduces; measured / predicted "
        f"{r0.step_ms / tp.predicted_tp_step_ms:.2f}x. With one memory bus shared by the ranks, as on this CPU, "
        f"the compute would not shrink: {tp.predicted_shared_bus_step_ms:.0f} ms "
        f"({r0.step_ms / tp.predicted_shared_bus_step_ms:.2f}x).",
    ]
    if slowest.step_ms > ref.step_ms:
        lines.append(
            f"**Why {tp.world_size} ranks are slower here:** they run on the same {tp.cores} CPU cores as the "
            f"single process (its fastest run used {ref.threads} thread(s); each rank uses {r0.threads}), and other "
            "programs share those cores too. A decode step is mostly reading weights, and both ranks read theirs "
            "through the same memory bus and caches, so halving each rank's weights need not halve its time: rank 0's "
            f"compute went from {one.compute_ms:.0f} to {r0.compute_ms:.0f} ms ({r0.compute_ms / one.compute_ms:.2f}x; "
            f"with memory of its own, as a GPU has, the split's ideal is {tp.busiest_work_share:.2f}x). And it added {r0.comm_ms:.0f} ms inside {r0.allreduces_per_step} "
            f"all-reduces ({r0.comm_share:.0%} of rank 0's step), each paying about "
            f"{tp.sweep.latency_s * 1e6:,.0f} µs of gloo latency for a few kilobytes. That is the all-reduce "
            "tax, made visible. On GPUs each rank brings its own memory bandwidth and NVLink makes a call a few "
            "microseconds: part 2 scales the same arithmetic up."
        )
    else:
        lines.append(
            f"Here {tp.world_size} ranks were faster than the best single process: the split cut rank 0's "
            f"compute from {one.compute_ms:.0f} to {r0.compute_ms:.0f} ms, and the all-reduces "
            f"({r0.comm_share:.0%} of its step) cost less than that saved."
        )
    return "\n\n".join(line for line in lines if line)


TP_STEP_COLUMNS = [
    Column("label", "run", "text"), Column("steps", "decode steps", "int"),
    Column("step_ms", "step p50 (ms)"), Column("compute_ms", "compute (ms)"), Column("comm_ms", "in all-reduces (ms)"),
    Column("comm_share", "all-reduce share", "pct"), Column("allreduces_per_step", "all-reduces / step", "int"),
    Column("allreduce_bytes_per_step", "bytes / step", "int"), Column("prefill_ms", "prefill step (ms)"),
]
SWEEP_COLUMNS = [
    Column("message_bytes", "message (bytes)", "int"), Column("p50_s", "p50 (µs)", scale=1e6),
    Column("p90_s", "p90 (µs)", scale=1e6), Column("min_s", "min (µs)", scale=1e6),
    Column("predicted_s", "fit (µs)", scale=1e6), Column("algorithm_bandwidth_Bps", "algbw (GB/s)", scale=1e-9),
]


def tp_steps_table(tp: TPResult):
    return people_table(tp.runs, TP_STEP_COLUMNS)


def sweep_table(tp: TPResult):
    rows = [{"message_bytes": p.message_bytes, "p50_s": p.p50_s, "p90_s": p.p90_s, "min_s": p.min_s,
             "predicted_s": tp.sweep.predicted_s(p.message_bytes),
             "algorithm_bandwidth_Bps": p.algorithm_bandwidth_Bps} for p in tp.sweep.points]
    return people_table(rows, SWEEP_COLUMNS)


def tp_figure(tp: TPResult):
    """Left: all-reduce time vs message size (measured, fitted, and NVLink's model for scale).
    Right: the decode step split into compute and all-reduces, per run, and the prediction."""
    import numpy as np

    from ..analysis.parallel import ring_allreduce_s
    from ..figures import subplots

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
    ax.legend(fontsize=7, loc="upper left")
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


# ---------------------------------------------------------------------------------------------
# Part 2: scaling on catalogued GPUs (analytic)


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


def _scaling_rows(model: str, gpus: tuple[str, ...], batch: int, context: int, tps=(1, 2, 4, 8)) -> list[ScalingRow]:
    from ..analysis.parallel import scaling_table

    return [ScalingRow(model, r["gpu"], r["tp"], r["fits"], r["itl_ms"], r["compute_ms"], r["allreduce_ms"],
                       r["allreduce_share"], r["speedup_vs_tp1"], r["ideal_speedup"])
            for r in scaling_table(model, gpus, batch, context, tps)]


def _layout_rows(model: str, gpu: str, n: int, context: int, slo: float) -> list[LayoutRow]:
    from ..analysis.capacity import plan_layouts

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


def measure_scaling(lm: Any, sizes: Sizes) -> ScalingResult:
    """The scaling model on catalogued GPUs (no measurement: the roofline + ring all-reduce)."""
    return scaling_result(sizes.scaling_model, sizes.scaling_batch, sizes.scaling_context)


def scaling_result(model: str = "llama-3-70b", batch: int = 16, context: int = 8192) -> ScalingResult:
    """TP 1/2/4/8 on H100 SXM and PCIe, a small model, TP vs replicas, the frontier, fast mode."""
    from ..analysis.parallel import fast_mode, parallelism_frontier

    gpus = ("H100-SXM", "H100-PCIe")
    rows = _scaling_rows(model, gpus, batch, context)
    from ..analysis.memory import as_shape

    small_model, small_batch, small_context = "smollm2-135m", 4, 256
    small = _scaling_rows(small_model, ("H100-SXM",), small_batch, small_context, tps=(1, 2))
    layouts = _layout_rows("llama-3-8b", "H100-PCIe", 4, 4096, 50.0) + _layout_rows("llama-3-8b", "H100-SXM", 4,
                                                                                   4096, 50.0)
    points = parallelism_frontier(model, "H100-SXM", context)
    fast = fast_mode(points, TALK_FAST_MODE_SPEEDUP)
    return ScalingResult(model, batch, context, rows, small_model,
                         small_batch, small_context, 2 * as_shape(small_model).layers, small,
                         "llama-3-8b", 4096, 50.0, layouts, points, fast, talk_compute_point(points, fast))


def scaling_text(s: ScalingResult) -> str:
    from ..analysis.capacity import ENERGY_ASSUMPTION

    sxm1, sxm4, sxm8 = s.row("H100-SXM", 1), s.row("H100-SXM", 4), s.row("H100-SXM", 8)
    pcie4 = s.row("H100-PCIe", 4)
    small1, small2 = s.small_model_rows[0], s.small_model_rows[1]
    pcie = {r.parallelism: r for r in s.layouts if r.gpu == "H100-PCIe"}
    nvl = {r.parallelism: r for r in s.layouts if r.gpu == "H100-SXM"}
    lines = [
        f"**Sublinear:** {s.model} at {s.batch} users x {s.context:,} tokens on H100 SXM: ITL "
        f"{sxm1.itl_ms:.1f} ms at TP1{'' if sxm1.fits else ' (a reference: it does not fit one GPU)'}, "
        f"{sxm4.itl_ms:.1f} ms at TP4 "
        f"({sxm4.speedup_vs_tp1:.2f}x for 4x the GPUs; all-reduces are {sxm4.allreduce_share:.0%} of the step), "
        f"{sxm8.itl_ms:.1f} ms at TP8 ({sxm8.speedup_vs_tp1:.2f}x). On PCIe TP4 gives {pcie4.speedup_vs_tp1:.2f}x. "
        f"A public talk on inference reported that 4x GPUs gave about {TALK_TP_SPEEDUP_AT_4:.0f}x the speed: this model is more optimistic, because "
        "it assumes every GPU runs at its roofline and NCCL's best latencies; real kernels at small per-GPU "
        "batches lose more.",
        f"**A small model {'is slower' if small2.itl_ms > small1.itl_ms else 'gains little'} with TP:** "
        f"{s.small_model} at batch {s.small_batch} x {s.small_context} tokens on H100 SXM: "
        f"{small1.itl_ms * 1e3:.0f} µs at TP1, {small2.itl_ms * 1e3:.0f} µs at TP2, of which "
        f"{small2.allreduce_ms * 1e3:.0f} µs are its {s.small_allreduces} all-reduces: per-call latency, not "
        "bandwidth, sets their cost, the same tax part 1 measured on this CPU.",
    ]
    if "DP4" in pcie and "TP4" in pcie and "TP4" in nvl and "DP4" in nvl:
        best_pcie = max(pcie.values(), key=lambda r: r.tokens_per_s)
        best_nvl = max(nvl.values(), key=lambda r: r.tokens_per_s)
        lines.append(
            f"**PCIe: replicas beat pure TP.** {s.layouts_model} on 4 x H100 PCIe within {s.itl_slo_ms:.0f} ms ITL: "
            f"DP4 serves {pcie['DP4'].tokens_per_s:,.0f} output tok/s, TP4 {pcie['TP4'].tokens_per_s:,.0f} "
            f"(its all-reduces: {pcie['TP4'].allreduce_ms_per_step:.1f} ms per step). On NVLink TP4 serves "
            f"{nvl['TP4'].tokens_per_s:,.0f} vs DP4 {nvl['DP4'].tokens_per_s:,.0f}. Neither extreme is the best "
            f"layout, though: the most output tokens/s on PCIe come from **{best_pcie.parallelism}** "
            f"({best_pcie.tokens_per_s:,.0f} tok/s) and on NVLink from **{best_nvl.parallelism}** "
            f"({best_nvl.tokens_per_s:,.0f} tok/s): a little TP for the memory, replicas for the rest (the table "
            "has every layout)."
        )
    if s.fast is not None:
        f = s.fast
        lines.append(
            f"**Fast mode, computed:** from the most economical frontier point within 50 ms ITL "
            f"({f.baseline.layout}, batch {f.baseline.batch}, {f.baseline.tokens_per_s_per_user:.0f} tok/s per user), "
            f"the cheapest point at least {TALK_FAST_MODE_SPEEDUP:.0f}x faster per user is {f.fast.layout} at batch "
            f"{f.fast.batch}: **{f.speedup:.2f}x the speed for {f.compute_ratio:.2f}x the GPU time per token** "
            f"(energy {f.fast.joules_per_token / f.baseline.joules_per_token:.2f}x, $ per million tokens "
            f"{f.fast.usd_per_m_tokens:.2f} vs {f.baseline.usd_per_m_tokens:.2f}). {ENERGY_ASSUMPTION}"
        )
        t = s.at_talk_compute
        reach = (f"the model reaches the quoted {TALK_FAST_MODE_COMPUTE:.0f}x compute only at {t.speedup:.2f}x speed "
                 f"({t.layout}, batch {t.batch})" if t else
                 f"no point on this frontier costs the quoted {TALK_FAST_MODE_COMPUTE:.0f}x compute")
        on_frontier = sorted({p.layout for p in s.frontier if p.on_frontier})
        how = ("the same layout at a smaller batch" if f.fast.layout == f.baseline.layout
               else f"{f.fast.layout} instead of {f.baseline.layout}, at batch {f.fast.batch}")
        lines.append(
            f"**What the model shows, and where it differs from the quote:** a public talk on inference described a provider's \"fast mode\" that spends about "
            f"{TALK_FAST_MODE_COMPUTE:.0f}x compute for about {TALK_FAST_MODE_SPEEDUP:.0f}x speed, by giving each user "
            f"more GPUs. This model does not reproduce that mechanism. Its frontier is made of "
            f"{', '.join(on_frontier)} only"
            + (": at a fixed batch the widest TP group is never the dearer per token here, because the all-reduce "
               "tax it adds is small next to the weight reads each GPU saves. " if len(on_frontier) == 1 else ". ")
            + "Its fast point is "
            f"**{how}**: speed bought mostly by serving fewer users at once, and {reach}. What is real in both: speed "
            "per user costs GPU time per token, at an increasing rate. What the model leaves out, and a product pays: "
            "kernels far from the roofline at batch 1-8, all-reduce latencies worse than NCCL's best, a tail-latency "
            "SLO. The quote does not say which model, GPU or batch it meant; read its 6x as a claim about one product."
        )
    return "\n\n".join(lines)


SCALING_COLUMNS = [
    Column("gpu", "GPU", "text"), Column("tp", "TP", "int"), Column("fits", "fits", "bool"),
    Column("itl_ms", "ITL (ms)"), Column("compute_ms", "compute + memory (ms)"),
    Column("allreduce_ms", "all-reduces (ms)"), Column("allreduce_share", "all-reduce share", "pct"),
    Column("speedup_vs_tp1", "speed-up vs TP1", "ratio"), Column("ideal_speedup", "ideal", "ratio"),
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


def scaling_figures(s: ScalingResult) -> dict[str, Any]:
    from ..analysis.parallel_figures import plot_frontier, plot_tp_scaling

    rows = [vars(r) for r in s.rows]
    return {
        "tp_scaling": plot_tp_scaling(rows, title=f"analytic: {s.model}, {s.batch} users x {s.context:,} tokens: "
                                                  "N GPUs are not N x faster"),
        "frontier": plot_frontier(s.frontier, s.fast, title=f"analytic: {s.model} on H100 SXM, {s.context:,}-token "
                                                            "context: speed vs throughput per GPU"),
    }


# ---------------------------------------------------------------------------------------------
# Part 3: the cluster simulator


@dataclass(frozen=True)
class ModeRow:
    """One way to serve a workload on the same GPUs (ClusterReport, the columns shown)."""

    workload: str
    mode: str
    layout: str
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    itl_ms_max: float | None
    output_tokens_per_s_per_gpu: float
    goodput_rps_per_gpu: float
    slo_attainment: float


def _mode_row(workload: str, label: str, r: ClusterReport) -> ModeRow:
    return ModeRow(workload, label, r.layout, r.ttft_ms_p50, r.ttft_ms_p99, r.itl_ms_p50, r.itl_ms_p99,
                   r.itl_ms_max, r.output_tokens_per_s_per_gpu, r.goodput_rps_per_gpu, r.slo_attainment)


@dataclass(frozen=True)
class WorkloadRun:
    """One workload: the colocated, chunked and best disaggregated runs, every P:D, ITL quantiles."""

    workload: str
    mean_prompt_tokens: float
    mean_output_tokens: float
    rate_per_s: float
    modes: list[ModeRow]  # colocated, chunked, best P:D
    splits: list[ModeRow]  # every P:D
    best_pd: str
    itl_quantiles_ms: dict[str, list[float]]  # mode -> ITL at quantiles 0..1 (for the CDF)

    def mode(self, name: str) -> ModeRow:
        return next(m for m in self.modes if m.mode == name)


@dataclass(frozen=True)
class ClusterResult:
    model: str
    gpu: str
    n_gpus: int
    slo: SLO
    workloads: list[WorkloadRun]
    saturation_tokens_per_s_per_gpu: dict[str, float]
    colocated_over_best_disaggregated: float

    def workload(self, name: str) -> WorkloadRun:
        return next(w for w in self.workloads if w.workload == name)


QUANTILES = 101


def _itl_quantiles(res: Any) -> list[float]:
    import numpy as np

    gaps = [g * 1e3 for r in res.requests for g in r.itl_s]
    return [float(v) for v in np.quantile(gaps, np.linspace(0, 1, QUANTILES))] if gaps else []


def measure_cluster(lm: Any, sizes: Sizes) -> ClusterResult:
    """Summarize (prefill-heavy) and story (decode-heavy) traces through the simulator on the
    same GPUs: colocated, colocated with chunked prefill, and every P:D split."""
    from ..cluster import scenarios
    from ..cluster.report import summarize

    model, gpu, n = sizes.cluster_model, sizes.cluster_gpu, sizes.cluster_gpus
    slo = SLO(2000.0, 50.0)
    runs = []
    for wl in ("summarize", "story"):
        trace = scenarios.trace_for(model, wl, gpu, n, sizes.cluster_requests, load=0.7)
        plain = scenarios.run_colocated(model, trace, gpu, n, 1, False)
        chunked = scenarios.run_colocated(model, trace, gpu, n, 1, True)
        ratios = [(p, n - p) for p in range(1, n)]
        best, reports = scenarios.best_pd_ratio(model, trace, gpu, n, 1, slo, ratios)
        p, d = ratios[reports.index(best)]
        best_run = scenarios.run_disaggregated(model, trace, p, d, gpu)
        span = trace[-1].arrival_s - trace[0].arrival_s
        runs.append(WorkloadRun(
            workload=wl,
            mean_prompt_tokens=statistics.mean(t.prompt_tokens for t in trace),
            mean_output_tokens=statistics.mean(t.output_tokens for t in trace),
            rate_per_s=(len(trace) - 1) / span if span > 0 else 0.0,
            modes=[_mode_row(wl, "colocated", summarize(plain, slo)),
                   _mode_row(wl, "colocated, chunked prefill", summarize(chunked, slo)),
                   _mode_row(wl, "disaggregated (best P:D)", best)],
            splits=[_mode_row(wl, "disaggregated", r) for r in reports],
            best_pd=best.layout,
            itl_quantiles_ms={"colocated": _itl_quantiles(plain), "colocated, chunked prefill": _itl_quantiles(chunked),
                              f"disaggregated {best.layout}": _itl_quantiles(best_run)},
        ))
    sat = scenarios.saturation(model, "chat", gpu, n, requests=2 * sizes.cluster_requests)
    return ClusterResult(model, gpu, n, slo, runs, {
        "colocated": sat["colocated"].output_tokens_per_s_per_gpu,
        "colocated, chunked prefill": sat["colocated_chunked"].output_tokens_per_s_per_gpu,
        f"disaggregated {sat['best_disaggregated'].layout}": sat["best_disaggregated"].output_tokens_per_s_per_gpu,
    }, sat["colocated_over_best_disaggregated"])


def _pd_counts(layout: str) -> tuple[int, int] | None:
    """(prefill GPUs, decode GPUs) of a simulator layout such as '1P:3D TP1' (None if it has none)."""
    import re

    m = re.search(r"(\d+)P\s*(?:\S+\s*)?:\s*(\d+)D", layout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def pools_text(best: dict[str, str]) -> str:
    """The talk's P/D story with the simulator's splits: why each pool grows or shrinks with the mix."""
    summ, story = _pd_counts(best.get("summarize", "")), _pd_counts(best.get("story", ""))
    if not summ or not story:
        return ""
    return (
        f"**Why the pools differ.** A summary reads a long document and writes a few lines: its GPU time is prefill, "
        f"and its best split here gives prefill {summ[0]} of {sum(summ)} GPUs. A story starts from a short prompt "
        f"and writes pages: its time is decode, and its best split gives prefill {story[0]} of {sum(story)}. A fleet "
        "serving both sizes each pool to its own work: when summaries arrive faster, it adds prefill GPUs; when "
        "stories do, decode GPUs; and the KV cache of each prompt crosses from one pool to the other once."
        + ("" if summ[0] / sum(summ) > story[0] / sum(story) else
           " (In this run the splits do not differ in the expected direction: read the table before the story.)")
    )


def cluster_text(c: ClusterResult) -> str:
    lines = []
    for w in c.workloads:
        col, chk, dis = w.mode("colocated"), w.mode("colocated, chunked prefill"), w.mode("disaggregated (best P:D)")
        lines.append(
            f"**{w.workload}** ({w.mean_prompt_tokens:,.0f} prompt / {w.mean_output_tokens:,.0f} output tokens on "
            f"average, {w.rate_per_s:.2f} requests/s on {c.n_gpus} x {c.gpu}): best split {w.best_pd}. ITL p99 "
            f"{col.itl_ms_p99:.1f} ms colocated, {chk.itl_ms_p99:.1f} ms with chunked prefill, {dis.itl_ms_p99:.1f} ms "
            f"disaggregated (worst gap {col.itl_ms_max:.0f} vs {dis.itl_ms_max:.0f} ms); TTFT p50 "
            f"{col.ttft_ms_p50:.0f} vs {dis.ttft_ms_p50:.0f} ms; goodput per GPU {col.goodput_rps_per_gpu:.3f} vs "
            f"{dis.goodput_rps_per_gpu:.3f} requests/s (SLO: TTFT {c.slo.ttft_ms:.0f} ms, TPOT {c.slo.tpot_ms:.0f} ms)."
        )
    best = {w.workload: w.best_pd for w in c.workloads}
    lines.append(
        f"Prefill-heavy and decode-heavy work want different splits ({best['summarize']} for summarize, "
        f"{best['story']} for story): that is what separate pools are for."
    )
    lines.append(pools_text(best))
    sat = c.saturation_tokens_per_s_per_gpu
    lines.append(
        "**Throughput ceiling** (chat, far past capacity): "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sat.items())
        + f" output tok/s per GPU: colocated serving's ceiling is {c.colocated_over_best_disaggregated:.2f}x the best "
        "split's. As vLLM's documentation says, disaggregation does not raise throughput; it decouples TTFT from ITL "
        "(each pool sized for its own SLO) and takes prefill out of the decode steps, which removes the ITL spikes."
    )
    return "\n\n".join(lines)


MODE_COLUMNS = [
    Column("workload", "workload", "text"), Column("mode", "serving", "text"), Column("layout", "instances", "text"),
    Column("ttft_ms_p50", "TTFT p50 (ms)"), Column("ttft_ms_p99", "TTFT p99 (ms)"), Column("itl_ms_p50", "ITL p50 (ms)"),
    Column("itl_ms_p99", "ITL p99 (ms)"), Column("itl_ms_max", "ITL max (ms)"),
    Column("output_tokens_per_s_per_gpu", "output tok/s per GPU"), Column("goodput_rps_per_gpu", "goodput / GPU (req/s)"),
    Column("slo_attainment", "within SLO", "pct"),
]


def cluster_figure(c: ClusterResult):
    """ITL CDFs per workload and mode: prefill interference is the tail."""
    import numpy as np

    from ..figures import subplots

    fig, axes = subplots(1, len(c.workloads), figsize=(11, 3.8))
    q = np.linspace(0, 1, QUANTILES)
    for ax, w in zip(np.atleast_1d(axes), c.workloads, strict=True):
        for mode, values in w.itl_quantiles_ms.items():
            if values:
                ax.plot(values, q, label=mode)
        ax.set_xscale("log")
        ax.axhline(0.99, color="gray", lw=0.6, ls=":")
        ax.set(xlabel="inter-token latency (ms, log)", ylabel="share of gaps at or below", ylim=(0, 1.01),
               title=f"{w.workload}: {w.mean_prompt_tokens:,.0f} in / {w.mean_output_tokens:,.0f} out")
        ax.legend(fontsize=7)
    fig.suptitle(f"Simulated (roofline costs): {c.model} on {c.n_gpus} x {c.gpu}", fontsize=10)
    finish(fig)
    return fig


# ---------------------------------------------------------------------------------------------
# Part 4: heterogeneous hardware, the wafer-scale data point, attention/FFN split


@dataclass(frozen=True)
class WaferPoint:
    """The quoted wafer-scale claims next to what the vendor's figures compute (cited, not catalogued)."""

    chip: str
    label: str
    source: str
    claimed_tokens_per_s: float
    claimed_h100_tokens_per_s: float
    claimed_speedup: float
    bandwidth_ratio: float
    bandwidth_ratio_claimed: float
    model: str
    chips_to_hold_weights: int
    batch1_bound_tokens_per_s: dict[str, float]


@dataclass(frozen=True)
class HeteroResult:
    model: str
    prefill_gpu: str
    decode_gpu: str
    fitness: list[PhaseFitness]
    reports: list[ModeRow]
    wafer: WaferPoint
    afd_model: str
    afd_colocated: AFDPoint
    afd_split: AFDPoint
    afd_gain: float


def measure_hetero(lm: Any, sizes: Sizes) -> HeteroResult:
    from ..cluster import attention_ffn, hetero, scenarios
    from ..cluster.report import SLO

    model = sizes.cluster_model
    pick = hetero.heterogeneous_pick(model, gpus=["H100-SXM", "H200"], by="usd")
    trace = scenarios.trace_for(model, "chat", pick.prefill_gpu, 4, sizes.cluster_requests, load=0.6)
    reports = hetero.compare_heterogeneous(model, trace, pick.prefill_gpu, pick.decode_gpu, 1, 3, SLO(2000.0, 50.0))
    labels = ("heterogeneous P:D", "P:D, all prefill GPU", "P:D, all decode GPU", "colocated chunked, decode GPU")
    w = hetero.wafer_scale_data_point("llama-3-70b")
    claims = w["talk_claims"]
    wafer = WaferPoint(w["chip"], w["label"], w["source"], claims["tokens_per_s"], claims["h100_tokens_per_s"],
                       w["claimed_speedup"], w["bandwidth_ratio"], w["bandwidth_ratio_claimed"], w["model"],
                       w["chips_to_hold_weights"], w["batch1_bound_tokens_per_s"])
    afd = attention_ffn.compare_attention_ffn("deepseek-v3", "H100-SXM", 16, context=8192)
    return HeteroResult(model, pick.prefill_gpu, pick.decode_gpu, list(pick.fitness),
                        [_mode_row("chat", lab, r) for lab, r in zip(labels, reports, strict=True)], wafer,
                        "deepseek-v3", afd["colocated"], afd["best_split"], afd["gain"])


def cited_pairing_text(chip: str = "Cerebras-WSE-3", gpu: str = "H100-SXM") -> str:
    """The talk's heterogeneous claims (cited, from ``data/cited_chips.json``) beside what the course computes."""
    from ..catalog import get_cited_chip

    c = get_cited_chip(chip)
    claims = c.talk_claims
    pair, (lo, hi) = claims["pairing"], claims["speedup_at_equal_power_range"]
    return (
        f"**Cited, not computed:** the talk paired {pair['prefill']} for prefill with {pair['decode']} for decode, "
        f"the KV cache moved over {pair['link']}, at about {pair['speedup']:.0f}× ({pair['source']}), and claimed "
        f"{lo:.0f}–{hi:.0f}× speed at equal power for the SRAM chip. **Computed here:** the chip's memory bandwidth "
        f"is {c.bandwidth_ratio_vs(gpu):,.0f}× an {gpu}'s HBM, so a bandwidth-bound batch-1 decode could be that "
        "much faster per chip, and the talk's own tokens/s give "
        f"{c.claimed_speedup():.0f}×. The catalog has no power figure for the chip, so 'at equal power' cannot be "
        "checked here: treat the range as the talk's claim, and the pairing as the shape of the idea (each phase "
        "on the chip whose roofline suits it), not as a measured result."
    )


def cluster_usd_per_hour(gpus: dict[str, int]) -> float:
    """$ per hour of a cluster of ``{gpu: count}`` at the catalog's indicative prices."""
    from ..catalog import get_gpu

    return sum(get_gpu(g).price_usd_per_hour * n for g, n in gpus.items())


def hetero_text(h: HeteroResult) -> str:
    fit = {f.gpu: f for f in h.fitness}
    pre, dec = fit[h.prefill_gpu], fit[h.decode_gpu]
    het, homo_p, homo_d = h.reports[0], h.reports[1], h.reports[2]
    w = h.wafer
    c, s = h.afd_colocated, h.afd_split
    n_p, n_d = 1, 3  # the P:D of measure_hetero
    usd = {"mix": cluster_usd_per_hour({h.prefill_gpu: n_p, h.decode_gpu: n_d}) if h.prefill_gpu != h.decode_gpu
           else cluster_usd_per_hour({h.prefill_gpu: n_p + n_d}),
           "all_p": cluster_usd_per_hour({h.prefill_gpu: n_p + n_d}),
           "all_d": cluster_usd_per_hour({h.decode_gpu: n_p + n_d})}
    seq_tps = s.tokens_per_s_per_gpu * s.step_ms / s.sequential_step_ms
    return "\n\n".join([
        f"**Heterogeneous pick** for {h.model}, by tokens per dollar-hour: prefill on {h.prefill_gpu} "
        f"({pre.prefill_tokens_per_s_per_usd_hour:,.0f} prefill tok/s per $/h; ridge point {pre.ridge_point:.0f} "
        f"FLOP/byte), decode on {h.decode_gpu} ({dec.decode_tokens_per_s_per_usd_hour:,.0f} decode tok/s per $/h at "
        f"batch {dec.decode_batch}; ridge point {dec.ridge_point:.0f}). Simulated on chat, {n_p} prefill + {n_d} decode "
        f"GPUs, the whole comparison: the mix has ITL p50 {het.itl_ms_p50:.1f} ms and goodput "
        f"{human(het.goodput_rps_per_gpu, 3)} req/s per GPU at ${usd['mix']:.2f}/h; all {h.prefill_gpu}: "
        f"{homo_p.itl_ms_p50:.1f} ms, {human(homo_p.goodput_rps_per_gpu, 3)} req/s per GPU, ${usd['all_p']:.2f}/h; all "
        f"{h.decode_gpu}: {homo_d.itl_ms_p50:.1f} ms, {human(homo_d.goodput_rps_per_gpu, 3)} req/s per GPU, "
        f"${usd['all_d']:.2f}/h. "
        + (f"The decode GPUs set ITL and goodput, so against all {h.decode_gpu} the mix changes only the price: "
           f"{1 - usd['mix'] / usd['all_d']:.0%} less per hour, and nothing else. "
           if abs((het.itl_ms_p50 or 0) - (homo_d.itl_ms_p50 or 0)) < 0.05 * (homo_d.itl_ms_p50 or 1) else "")
        + "The quoted case, compute-dense prefill chips with SRAM/bandwidth-dense decode chips, needs two chips "
        "that differ in kind: the cited pairing below, not this pair.",
        f"**Cited data point, not a catalog GPU:** {w.chip} ({w.label}). Quoted in a public talk on inference: about "
        f"{w.claimed_tokens_per_s:,.0f} tok/s vs {w.claimed_h100_tokens_per_s:,.0f} on an H100 ({w.claimed_speedup:.0f}x), "
        f"and on-chip bandwidth '{w.bandwidth_ratio_claimed:,.0f}x' an H100's HBM. The vendor's own 21 PB/s over the "
        f"catalog's H100 HBM is **{w.bandwidth_ratio:,.0f}x**, not {w.bandwidth_ratio_claimed:,.0f}x. A {w.model} needs "
        f"{w.chips_to_hold_weights} wafers just to hold its weights in SRAM, and a {w.bandwidth_ratio:,.0f}x bandwidth "
        f"ratio buys a claimed {w.claimed_speedup:.0f}x, so something other than memory bandwidth sets its speed. "
        f"Source: {w.source}.",
        cited_pairing_text(w.chip),
        f"**Attention/FFN split** for {h.afd_model} on H100 SXM (analytic, fp8 weights as DeepSeek serves them): "
        f"colocated, each GPU fits {c.batch_per_attention_gpu} users next to its share of the experts; split, an "
        f"attention GPU holds only attention weights and KV and fits {s.batch_per_attention_gpu}, so the expert FFN "
        f"sees {s.ffn_tokens:,} tokens per step (arithmetic intensity {s.ffn_intensity:.0f} vs {c.ffn_intensity:.0f} "
        f"FLOP/byte), with {s.n_attention_gpus} attention + {s.n_ffn_gpus} FFN GPUs. Both bounds of the split: if "
        f"attention, FFN and the {s.transfer_ms:.1f} ms token exchange overlap completely (ping-pong micro-batches), "
        f"a step takes {s.step_ms:.1f} ms and each GPU serves {s.tokens_per_s_per_gpu:,.0f} tok/s, **{h.afd_gain:.2f}x** "
        f"the colocated {c.tokens_per_s_per_gpu:,.0f}; with no overlap it takes {s.sequential_step_ms:.1f} ms and "
        f"serves {seq_tps:,.0f} tok/s, **{seq_tps / c.tokens_per_s_per_gpu:.2f}x**"
        + (": worse than not splitting. The split pays only as far as the exchange hides behind compute."
           if seq_tps < c.tokens_per_s_per_gpu else "."),
    ])


FITNESS_COLUMNS = [
    Column("gpu", "GPU", "text"), Column("ridge_point", "ridge (FLOP/byte)"),
    Column("prefill_tokens_per_s", "prefill tok/s"), Column("prefill_tokens_per_s_per_usd_hour", "prefill tok/s per $/h"),
    Column("decode_batch", "decode batch", "int"), Column("decode_tokens_per_s", "decode tok/s"),
    Column("decode_tokens_per_s_per_usd_hour", "decode tok/s per $/h"), Column("usd_per_hour", "$/h"),
]
AFD_COLUMNS = [
    Column("mode", "attention/FFN", "text"), Column("n_attention_gpus", "attention GPUs", "int"),
    Column("n_ffn_gpus", "FFN GPUs", "int"), Column("batch_per_attention_gpu", "users per attention GPU", "int"),
    Column("attention_ms", "attention (ms)"), Column("ffn_ms", "FFN (ms)"), Column("transfer_ms", "transfer (ms)"),
    Column("step_ms", "step (ms)"), Column("ffn_intensity", "FFN FLOP/byte"),
    Column("tokens_per_s_per_gpu", "tok/s per GPU"), Column("usd_per_m_tokens", "$ / M tokens"),
]


def wafer_rows(w: WaferPoint) -> list[dict[str, Any]]:
    rows = [{"what": "quoted: tokens/s (wafer vs H100)", "value": f"{w.claimed_tokens_per_s:,.0f} vs "
             f"{w.claimed_h100_tokens_per_s:,.0f}", "source": "cited (a public talk)"},
            {"what": "quoted: bandwidth vs H100 HBM", "value": f"{w.bandwidth_ratio_claimed:,.0f}x", "source": "cited (a public talk)"},
            {"what": "vendor 21 PB/s / catalog H100 3.35 TB/s", "value": f"{w.bandwidth_ratio:,.0f}x", "source": "computed"},
            {"what": f"wafers to hold {w.model} in SRAM", "value": f"{w.chips_to_hold_weights}", "source": "computed"}]
    rows += [{"what": f"batch-1 bandwidth bound, {chip}", "value": f"{v:,.0f} tok/s", "source": "computed (a bound)"}
             for chip, v in w.batch1_bound_tokens_per_s.items()]
    return rows


# ---------------------------------------------------------------------------------------------
# Part 5: the planner's answer and its launch commands


@dataclass(frozen=True)
class PlanResult:
    model: str
    hub_id: str
    gpu: str
    context: int
    itl_slo_ms: float
    min_users: int
    chosen: int | None
    parallelism: str | None
    reason: str
    considered: list[LayoutRow]
    vllm: str
    sglang: str
    infer_lab: str
    disaggregated: dict[str, str]  # role -> command
    pointers: dict[str, str]


def measure_plan(lm: Any, sizes: Sizes) -> PlanResult:
    from .. import launchers
    from ..analysis.capacity import recommend
    from ..catalog import load_model_config

    model, gpu, ctx, slo, users = sizes.scaling_model, "H100-SXM", sizes.scaling_context, 30.0, sizes.scaling_batch
    out = launchers.scale_out(model, gpu, context=ctx, itl_slo_ms=slo, min_users=users)
    rec = recommend(model, gpu, context=ctx, itl_slo_ms=slo, min_users=users)
    hub = load_model_config(model).get("_infer_lab", {}).get("hf_id", model)
    tp = rec.plan.tp if rec.plan else 8
    dp = rec.plan.dp if rec.plan else 1
    ours = shlex.join(["infer-lab", "engines", "launch", "vllm", "--model", hub, "--tp", str(tp)]
                      + (["--dp", str(dp)] if dp > 1 else []) + ["--max-model-len", str(ctx)])
    pd = {}
    for role in launchers.DISAGGREGATION_ROLES:
        for eng in launchers.ENGINES:
            opts = launchers.EngineOptions(hub, tensor_parallel=tp, max_model_len=ctx, disaggregation=role,
                                         port=8100 if role == "prefill" else 8200)
            pd[f"{eng} {role}"] = shlex.join(launchers.build_command(eng, opts, python="python"))
    pd["sglang router"] = shlex.join(launchers.pd_router_command("sglang", ["http://prefill-host:8100"],
                                                               ["http://decode-host:8200"]))
    considered = [LayoutRow(p.gpu, p.parallelism, p.n_gpus, p.interconnect or "—", p.itl_ms, p.tokens_per_s,
                            p.input_tokens_per_s, p.allreduce_ms_per_step, p.meets_slo, p.usd_per_m_output_tokens,
                            p.joules_per_output_token) for p in rec.considered]
    return PlanResult(model, hub, gpu, ctx, slo, users, out["chosen"], out["parallelism"], out["reason"], considered,
                      shlex.join(out["vllm"]), shlex.join(out["sglang"]), ours, pd, dict(launchers.DISTRIBUTED_POINTERS))


def plan_text(p: PlanResult) -> str:
    head = (f"**The planner:** {p.model} for {p.min_users} users at {p.context:,} tokens within {p.itl_slo_ms:.0f} ms "
            f"ITL on {p.gpu}: " + (f"**{p.chosen} GPUs, {p.parallelism}** ({p.reason})." if p.chosen
                                   else f"nothing fits ({p.reason}); the commands are for 8 GPUs."))
    return "\n\n".join([
        head,
        f"Launch it with vLLM:\n\n```\n{p.vllm}\n```\n\nor SGLang:\n\n```\n{p.sglang}\n```\n\nor through this "
        f"course's launcher (same flags, health check, logs):\n\n```\n{p.infer_lab}\n```",
        "Disaggregated prefill/decode, one server per role (vLLM's KV-transfer connector; SGLang's PD mode and "
        "its router):\n\n```\n" + "\n".join(p.disaggregated.values()) + "\n```",
        "Across nodes, with KV-aware routing and autoscaled pools: " + "; ".join(p.pointers.values()) + ".",
        "Our engine stays on one device: it is the from-scratch demonstration of the mechanism, not a distributed "
        "server.",
    ])


# ---------------------------------------------------------------------------------------------
# Part 6: the simulator against our engine


def _cpu_model(lm: Any):
    if lm is not None and lm.device.type == "cpu":
        return lm
    from ..models import load_model

    return load_model("smollm2-135m", device="cpu")


def measure_check(lm: Any, sizes: Sizes) -> SimVsEngine:
    """Our engine's continuous batching, measured; the simulator on its fitted step costs."""
    from ..cluster.engine_check import compare_with_engine

    cpu = _cpu_model(lm)
    return compare_with_engine(cpu, _prompts(cpu, sizes.check_prompts), sizes.check_new_tokens, sizes.check_slots)


def check_text(c: SimVsEngine) -> str:
    r = c.ratios()
    verdict = "agree" if c.within() else "DO NOT agree"
    return (
        f"Our engine served {c.requests} requests with {c.max_num_seqs} slots in {len(c.engine_step_tokens)} steps "
        f"({c.threads} torch thread(s)); its steps fit `{c.fit.a_s * 1e3:.1f} ms + {c.fit.b_s_per_token * 1e3:.2f} ms "
        f"x tokens` (R² {c.fit.r2:.2f}). The simulator on that fit ran "
        f"{'the same' if c.same_schedule else 'a DIFFERENT'} schedule step for step. Simulated / measured: makespan "
        f"{r['makespan']:.3f}, mean ITL {r['mean_itl']:.3f}, mean first-token time {r['mean_first_token']:.3f} "
        f"(tolerances {', '.join(f'{k} ±{v:.0%}' for k, v in TOLERANCES.items())}): they **{verdict}**. The busy "
        f"time ratio is {c.busy_ratio:.4f}: a least-squares fit's residuals sum to zero over the same steps, so "
        "what is left is the engine's bookkeeping between steps and the weight of single noisy steps."
    )


CHECK_COLUMNS = [
    Column("what", "quantity", "text"), Column("engine", "engine, measured (ms)"),
    Column("sim", "simulator (ms)"), Column("ratio", "sim / engine", "ratio", digits=4),
]


def check_table(c: SimVsEngine):
    rows = [{"what": "makespan", "engine": c.engine_wall_s * 1e3, "sim": c.sim_makespan_s * 1e3,
             "ratio": c.makespan_ratio},
            {"what": "busy time (sum of steps)", "engine": c.engine_busy_s * 1e3, "sim": c.sim_makespan_s * 1e3,
             "ratio": c.busy_ratio},
            {"what": "mean ITL", "engine": c.engine_mean_itl_s * 1e3, "sim": c.sim_mean_itl_s * 1e3,
             "ratio": c.itl_ratio},
            {"what": "mean first token since start", "engine": c.engine_mean_first_token_s * 1e3,
             "sim": c.sim_mean_first_token_s * 1e3, "ratio": c.first_token_ratio}]
    return people_table(rows, CHECK_COLUMNS)


# ---------------------------------------------------------------------------------------------
# The chapter surface


@dataclass
class Result(ChapterResult):
    """Chapter 13's parts; a part not run is ``None``."""

    model: str = ""
    tp: TPResult | None = None
    scaling: ScalingResult | None = None
    cluster: ClusterResult | None = None
    hetero: HeteroResult | None = None
    plan: PlanResult | None = None
    check: SimVsEngine | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else "")
    return run_parts(result, parts, PARTS, {
        "tp": lambda: measure_tp(lm, sizes),
        "scaling": lambda: measure_scaling(lm, sizes),
        "cluster": lambda: measure_cluster(lm, sizes),
        "hetero": lambda: measure_hetero(lm, sizes),
        "plan": lambda: measure_plan(lm, sizes),
        "check": lambda: measure_check(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {result.threads} torch thread(s)."]
    texts = [(result.tp, tp_text), (result.scaling, scaling_text), (result.cluster, cluster_text),
             (result.hetero, hetero_text), (result.plan, plan_text), (result.check, check_text)]
    lines += [fn(part) for part, fn in texts if part is not None]
    return "\n\n".join(lines)


def scaling_tables(s: ScalingResult) -> dict[str, Any]:
    return {
        f"TP scaling (analytic): {s.model}, {s.batch} users x {s.context:,} tokens": people_table(s.rows, SCALING_COLUMNS),
        "A small model on NVLink (analytic): SmolLM2-135M, batch 4": people_table(s.small_model_rows, SCALING_COLUMNS),
        f"TP vs replicas on 4 GPUs (analytic): {s.layouts_model}, {s.layouts_context:,} tokens, "
        f"ITL SLO {s.itl_slo_ms:.0f} ms": people_table(s.layouts, LAYOUT_COLUMNS),
        f"Pareto frontier (analytic): {s.model} on H100 SXM": people_table(
            [p for p in s.frontier if p.on_frontier], FRONTIER_COLUMNS),
    }


def tables(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.tp:
        out["Decode step, world size 1 vs 2 (this machine)"] = tp_steps_table(result.tp)
        out["All-reduce vs message size (this machine)"] = sweep_table(result.tp)
    if result.scaling:
        out.update(scaling_tables(result.scaling))
    if result.cluster:
        c = result.cluster
        out[f"Serving modes (simulated): {c.model} on {c.n_gpus} x {c.gpu}"] = people_table(
            [m for w in c.workloads for m in w.modes], MODE_COLUMNS)
        out["Every P:D split (simulated)"] = people_table([m for w in c.workloads for m in w.splits], MODE_COLUMNS)
    if result.hetero:
        h = result.hetero
        out[f"Phase fitness per GPU (analytic): {h.model}"] = people_table(h.fitness, FITNESS_COLUMNS)
        out["Heterogeneous vs homogeneous (simulated, chat)"] = people_table(h.reports, MODE_COLUMNS)
        out["Wafer-scale chip: cited claims vs computed"] = people_table(wafer_rows(h.wafer), [
            Column("what", "quantity", "text"), Column("value", "value", "text"), Column("source", "source", "text")])
        out[f"Attention/FFN split (analytic): {h.afd_model}"] = people_table([h.afd_colocated, h.afd_split], AFD_COLUMNS)
    if result.plan:
        out[f"Layouts the planner considered: {result.plan.model} on {result.plan.gpu}"] = people_table(
            result.plan.considered, LAYOUT_COLUMNS)
    if result.check:
        out["Simulator vs our engine (this machine)"] = check_table(result.check)
    return out


def figures(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.tp:
        out["tp"] = tp_figure(result.tp)
    if result.scaling:
        out.update(scaling_figures(result.scaling))
    if result.cluster:
        out["cluster_itl"] = cluster_figure(result.cluster)
    return out


def saved() -> SavedView | None:
    """TP runs saved from a multi-GPU machine (nccl), when there are any."""
    found = load_saved("*-tensor-parallel-*.json")
    if not found:
        return None
    src = found[0]
    rows = src.data.get("runs", [])
    return SavedView(
        title=f"Tensor parallelism on {src.device}",
        source=src,
        tables={"Decode step by world size": people_table(rows, TP_STEP_COLUMNS)},
        notes=[f"Measured by: {src.command}"],
    )


