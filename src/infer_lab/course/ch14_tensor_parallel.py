"""Chapter 14, "Tensor parallelism": one model split over two processes, for real, and scaled up.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/14_tensor_parallel.py`` that call :mod:`infer_lab.parallel` and
:mod:`infer_lab.analysis` directly, called from the page's visible cells. This module sizes them,
draws and describes what they return, and runs the very same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

1. **Tensor parallelism, run** (``tensor_parallel``): the embedded model split over 2 CPU
   processes (gloo), token for token the same as one process and as transformers; every
   all-reduce counted (2 x layers per step, tokens x hidden x 4 B each in fp32, as
   :func:`infer_lab.analysis.collectives.tp_allreduces` predicts) and timed; the all-reduce cost
   fitted (latency + bandwidth) and held against the step time.
2. **Scaling on catalogued GPUs** (``tp_scaling``, analytic): TP 1/2/4/8 ITL is sublinear; on
   PCIe replicas beat TP; the Pareto frontier of speed vs throughput per GPU with energy and $ per
   token; the "fast mode" a public talk on inference described (spending what seems to be about 6x the
   tokens, read as a price, for 2x speed), computed.

Serving many GPUs as a cluster (prefill/decode disaggregation, heterogeneous hardware, the
planner's launch commands, the simulator checked against the engine) is chapter 15. Our engine
does not pretend to be a distributed engine: part 1 is the mechanism, small enough to read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.collectives import TPComm, tp_allreduces
from ..analysis.parallel import FastMode, FrontierPoint, LayoutStep
from ..analysis.plausibility import caution, line_fit_flags
from ..figures import finish
from ..parallel.bench import AllReduceSweep, default_sizes
from ..units import human
from .chapter import NO_MODEL, ChapterResult, choose_size, run_parts
from .library_code import code_block
from .notebook_code import notebook_function
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "14"
SLUG = "tensor_parallel"
TITLE = "14 · Tensor parallelism: one model on two processes, and on many GPUs"
NEEDS_MODEL = True
PARTS = {
    "tp": "Run tensor parallelism on 2 CPU processes",
    "scaling": "Scale TP on catalogued GPUs",
}
# Parts that need no model and measure nothing here (computed): the saved-only deck keeps them.
ANALYTIC_PARTS = ("scaling",)
TP_WORLD_SIZE = 2  # the ranks of the notebook's experiment cell (``world_size = 2``)

# Claims quoted in a public talk on LLM inference, kept as cited numbers to compare the model with.
TALK_FAST_MODE_COMPUTE = 6.0  # "what seems to be 6 times as many tokens to process a single token" (read as a price) ...
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
    """What each part runs: prompts and tokens of the TP run, the all-reduce sweep, the scaling model."""

    size: str
    world_size: int
    tp_prompts: int
    tp_new_tokens: int
    sweep_quick: bool
    sweep_repeats: int
    scaling_model: str
    scaling_batch: int
    scaling_context: int

    @property
    def sweep_sizes(self) -> tuple[int, ...]:
        """The all-reduce message sizes timed (bytes)."""
        return default_sizes(self.sweep_quick)


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Quick: a few prompts and tokens (about 20 s on 2 busy cores, mostly starting 2 processes)."""
    size = choose_size(device, size)
    common = dict(world_size=TP_WORLD_SIZE, scaling_model="llama-3-70b", scaling_batch=16, scaling_context=8192)
    if size == "quick":
        return Sizes(size, tp_prompts=4, tp_new_tokens=6, sweep_quick=True, sweep_repeats=15, **common)
    return Sizes(size, tp_prompts=8, tp_new_tokens=16, sweep_quick=False, sweep_repeats=40, **common)


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
    from ..models import load_model

    if lm is None or lm.device.type != "cpu" or lm.config.model_type not in ("llama", "mistral", "qwen2"):
        lm = load_model("smollm2-135m", device="cpu")
    return lm


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


# Production engines shard the vocabulary too, which costs two more collectives per step: vLLM's
# VocabParallelEmbedding all-reduces the embedding lookup, and its ParallelLMHead computes a slice of the
# logits that LogitsProcessor gathers (vllm/model_executor/layers/vocab_parallel_embedding.py and
# logits_processor.py; the first read at vLLM commit 00db011). Megatron-LM's VocabParallelEmbedding
# (megatron/core/tensor_parallel/layers.py) all-reduces its lookup the same way.
VOCAB_PARALLEL_COLLECTIVES = 2


def collectives_per_step(layers: int, vocab_parallel: bool) -> int:
    """Collectives one tensor-parallel decode step makes: 2 all-reduces per layer (after o_proj and
    down_proj), plus :data:`VOCAB_PARALLEL_COLLECTIVES` when the embedding and LM head are sharded by
    vocabulary (``vocab_parallel``) rather than replicated, as in this course's engine."""
    return 2 * layers + (VOCAB_PARALLEL_COLLECTIVES if vocab_parallel else 0)


def replicated_vocab_text(model: str = "smollm2-135m") -> str:
    """Why this engine's TP step makes no message besides the layers' all-reduces, and the two more a
    production engine makes because it shards the vocabulary; the counts from ``model``'s shape."""
    from ..analysis.memory import as_shape

    layers = as_shape(model).layers
    ours, theirs = collectives_per_step(layers, False), collectives_per_step(layers, True)
    return (f"The embedding, the LM head and the norms are **replicated** in this engine: every rank computes the "
            f"full logits and picks the same greedy token, so a step of {model} makes its {ours} all-reduces "
            f"(2 x {layers} layers) and no other message. Production engines shard the vocabulary as well, to "
            "keep one copy of the embedding and LM head across the ranks: vLLM's `VocabParallelEmbedding` adds "
            "an all-reduce after the embedding lookup (Megatron-LM's layer of that name does too) and its "
            "`ParallelLMHead` computes a slice of the logits that are then gathered, so a vLLM step of this "
            f"model makes {theirs} collectives (2 x {layers} + {VOCAB_PARALLEL_COLLECTIVES}).")


SPLIT_COLUMNS = [
    Column("world_size", "world size", "int"), Column("rank", "rank", "int"), Column("kv_heads", "KV heads", "text"),
    Column("query_heads", "query heads", "text"), Column("mlp_columns", "MLP columns", "text"),
    Column("split_params", "split parameters", "int"), Column("busiest_work_share", "busiest rank's work", "pct"),
]


def split_table(model: str = "smollm2-135m"):
    return people_table(split_rows(model)[0], SPLIT_COLUMNS)


def tp_prompts(lm: Any, sizes: Sizes) -> list[list[int]]:
    """The run's prompts: chat questions, or random ids when the model has no tokenizer."""
    n = sizes.tp_prompts
    if lm.tokenizer is None or lm.is_random:
        return [lm.random_ids(1, 12 + 5 * i, seed=i)[0].tolist() for i in range(n)]
    return [lm.chat_ids(TP_QUESTIONS[i % len(TP_QUESTIONS)])[0].tolist() for i in range(n)]


def layer_code() -> str:
    """The tensor-parallel decoder layer, the library's real code (its docstring left out: the
    words around it on the page say the same), as a markdown code block."""
    from ..parallel.layers import tp_decoder_layer

    return code_block(tp_decoder_layer)


def model_shape_of(model: Any) -> Any:
    """The shape of ``model``: a catalog name or shape as it is; a loaded model by its catalog entry,
    or by its own config when the catalog does not know it."""
    from ..analysis.memory import as_shape

    if not hasattr(model, "model"):
        return as_shape(model)
    try:
        return as_shape(model.name)
    except (KeyError, ValueError, FileNotFoundError):
        return as_shape(model.model.config.to_dict())


def allreduce_prediction(model: Any, world_size: int, batch: int) -> TPComm:
    """What analysis predicts for one decode step of ``batch`` sequences before anything runs:
    2 x layers all-reduces of batch x hidden fp32 values (the cost on the catalog's NVLink 4)."""
    return tp_allreduces(model_shape_of(model), world_size, batch, "nvlink4-nvswitch", act_dtype="fp32")


def prediction_text(model: Any, world_size: int, batch: int) -> str:
    """The prediction in words, every number from :func:`allreduce_prediction`."""
    p = allreduce_prediction(model, world_size, batch)
    shape = model_shape_of(model)
    return (f"**Predict first** (`analysis.collectives.tp_allreduces`): a decode step of {batch} sequences on "
            f"{world_size} ranks makes **2 x {shape.layers} layers = {p.count} all-reduces**, each of "
            f"{batch} tokens x {shape.hidden} x 4 B = **{p.message_bytes:,} B**, {p.total_bytes:,} B per step, "
            "whatever the world size. World size 1 makes none. On two H100s joined by NVLink 4 (catalog) one "
            f"such all-reduce would take {p.each.total_s * 1e6:,.0f} µs, almost all of it latency.")


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


def tp_paragraphs(tp: TPResult) -> dict[str, str]:
    """What part 1 found, one paragraph per point ('split', 'tokens', 'counted', 'caution', 'cost',
    'step', 'why'; an empty one is left out), every number from ``tp``."""
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
        f"**All-reduces, counted:** {r0.allreduces_per_step} per decode step = 2 x {tp.layers} layers, each of "
        f"{tp.message_bytes:,} bytes (tokens x {tp.hidden} x {tp.act_bytes} B) in the median step; "
        f"{tp.steps_matching_prediction} of rank 0's {len(tp.decode_steps)} decode steps made exactly the predicted "
        f"count and bytes (fewer tokens once a sequence stops at EOS, fewer bytes). World size 1 made "
        f"{tp.single_allreduces}. Nothing else crosses between ranks.",
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
    keys = ("split", "tokens", "counted", "caution", "cost", "step", "why")
    return {key: line for key, line in zip(keys, lines, strict=True) if line}


def tp_text(tp: TPResult) -> str:
    """Identity, the all-reduce count, and why two ranks are slower here, from the numbers."""
    return "\n\n".join(tp_paragraphs(tp).values())


def tp_finding(tp: TPResult) -> str:
    """Part 1's finding in one paragraph: the step time with ``world_size`` ranks against the best
    single process, and how much of it the all-reduces took."""
    ref, r0 = tp.reference, tp.run(tp.world_size, 0)
    slowest = max((tp.run(tp.world_size, r) for r in range(tp.world_size)), key=lambda r: r.step_ms)
    verdict = "slower" if slowest.step_ms > ref.step_ms else "faster"
    return (f"**The finding:** a decode step took {human(slowest.step_ms)} ms with {tp.world_size} ranks against "
            f"{human(ref.step_ms)} ms in the best single process ({human(slowest.step_ms / ref.step_ms)}x, "
            f"{verdict}); rank 0 spent {human(r0.comm_ms)} ms of its step ({r0.comm_share:.0%}) inside its "
            f"{r0.allreduces_per_step} all-reduces. The figure shows where the time went; the derivation below "
            "says why, and what changes on GPUs.")


def tp_lead(tp: TPResult) -> str:
    """What part 1 shows at a glance: the tokens, the all-reduces counted, the finding (and a
    caution when the all-reduce fit is not trustworthy). The rest is :func:`tp_derivation`."""
    parts = tp_paragraphs(tp)
    return "\n\n".join([parts[k] for k in ("tokens", "counted", "caution") if k in parts] + [tp_finding(tp)])


def tp_derivation(tp: TPResult) -> str:
    """The derivation behind part 1's finding: the split, the all-reduce cost, the step time, why."""
    parts = tp_paragraphs(tp)
    return "\n\n".join(parts[k] for k in ("split", "cost", "step", "why") if k in parts)


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


def tp_details(tp: TPResult) -> dict[str, list[Any]]:
    """What part 1 keeps one click away (the page shows them in closed accordions): the derivation,
    the decode steps in the columns the finding reads, every column and the all-reduce sweep."""
    return {
        "Why: the split, the all-reduce cost, the step time": [tp_derivation(tp)],
        "The decode steps, in numbers": [tp_steps_table(tp, lesson=True)],
        "Every column, and the all-reduce sweep": [tp_steps_table(tp), sweep_table(tp)],
    }


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


def _scaling_row(model: str, r: dict[str, Any]) -> ScalingRow:
    return ScalingRow(model, r["gpu"], r["tp"], r["fits"], r["itl_ms"], r["compute_ms"], r["allreduce_ms"],
                      r["allreduce_share"], r["speedup_vs_tp1"], r["ideal_speedup"])


def _scaling_rows(model: str, gpus: tuple[str, ...], batch: int, context: int, tps=(1, 2, 4, 8)) -> list[ScalingRow]:
    from ..analysis.parallel import scaling_table

    return [_scaling_row(model, r) for r in scaling_table(model, gpus, batch, context, tps)]


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


def _layout_step(model: str, p: FrontierPoint) -> LayoutStep:
    """The predicted decode step behind a frontier point (the frontier's own inputs: one TP group, bf16)."""
    from ..analysis.parallel import Layout, predict_layout_decode

    return predict_layout_decode(model, p.gpu, Layout(tp=p.tp, dp=p.replicas), p.batch, p.context)


def _by_batch(points: list[FrontierPoint], tp: int) -> dict[int, FrontierPoint]:
    return {p.batch: p for p in points if p.tp == tp}


def allreduce_reason_text(wide: LayoutStep, narrow: LayoutStep) -> str:
    """Where two TP groups' GPU time per step goes at the same batch, from their layout steps
    (:func:`infer_lab.analysis.parallel.predict_layout_decode`): how many all-reduces each makes, how long
    they take per step, and the GPU time (GPUs x seconds) in all-reduces and in compute."""
    w_name, n_name = wide.layout.label, narrow.layout.label
    tw, tn = wide.layout.tp, narrow.layout.tp

    def gpu_ms(tp: int, seconds: float) -> float:
        return tp * seconds * 1e3

    def compare(a: float, b: float) -> str:
        return "the same" if abs(a - b) <= 0.01 * max(a, b) else ("more" if a > b else "less")

    count = (f"Both make the same {wide.allreduce_count} all-reduces per step"
             if wide.allreduce_count == narrow.allreduce_count else
             f"{w_name} makes {wide.allreduce_count} all-reduces per step against {narrow.allreduce_count} for "
             f"{n_name}")
    ar_w, ar_n = gpu_ms(tw, wide.allreduce_s), gpu_ms(tn, narrow.allreduce_s)
    c_w, c_n = gpu_ms(tw, wide.compute_s), gpu_ms(tn, narrow.compute_s)
    return (f"{count}; at batch {wide.batch} they take {wide.allreduce_s * 1e3:.2f} ms of each {w_name} step "
            f"against {narrow.allreduce_s * 1e3:.2f} ms of each {n_name} step, with all {tw} GPUs waiting on them "
            f"against {tn}. Per step that is {compare(ar_w, ar_n)} GPU time in all-reduces ({ar_w:.1f} GPU-ms "
            f"against {ar_n:.1f}) and {compare(c_w, c_n)} in compute ({c_w:.1f} against {c_n:.1f}).")


def fixed_batch_text(points: list[FrontierPoint], model: str | None = None) -> str:
    """The widest TP group against the next narrower one at the same batch per group, in words: which
    is dearer per token (tokens/s per GPU, hence J and $ per token) at the batches both run, and,
    when the widest group alone makes the frontier, the point of the narrower one it beats on both.
    With ``model`` (the frontier's), why, at the smallest batch both run: :func:`allreduce_reason_text`
    of the two layouts' predicted decode steps."""
    tps = sorted({p.tp for p in points})
    if len(tps) < 2:
        return ""
    wide, narrow = _by_batch(points, tps[-1]), _by_batch(points, tps[-2])
    shared = sorted(set(wide) & set(narrow))
    if not shared:
        return ""
    dearer = [b for b in shared if wide[b].tokens_per_s_per_gpu < narrow[b].tokens_per_s_per_gpu]
    w_name, n_name = wide[shared[0]].layout, narrow[shared[0]].layout

    def pair(b: int) -> str:
        w, n = wide[b], narrow[b]
        return (f"at batch {b} it costs {w.joules_per_token:.1f} J/token against {n.joules_per_token:.1f} "
                f"({w.tokens_per_s_per_gpu:,.1f} vs {n.tokens_per_s_per_gpu:,.1f} tok/s per GPU)")

    ends = pair(shared[0]) + (f", and {pair(shared[-1])}" if len(shared) > 1 else "")
    if len(dearer) == len(shared):
        verdict = (f"At a fixed batch per TP group the widest group, {w_name}, is the **dearer** per token at every "
                   f"batch both run: against {n_name}, {ends}.")
    elif not dearer:
        verdict = (f"At a fixed batch per TP group the widest group, {w_name}, is the **cheaper** per token at every "
                   f"batch both run: against {n_name}, {ends}.")
    else:
        cheaper = [b for b in shared if b not in dearer]
        verdict = (f"At a fixed batch per TP group the widest group, {w_name}, is the dearer per token at batch "
                   f"{', '.join(map(str, dearer))} and the cheaper at batch {', '.join(map(str, cheaper))} against "
                   f"{n_name}: {ends}.")
    if model is not None:
        verdict += " " + allreduce_reason_text(*(_layout_step(model, side[shared[0]]) for side in (wide, narrow)))
    front = [p for p in points if p.on_frontier]
    if not front or any(p.tp != tps[-1] for p in front):
        return verdict
    best = max(narrow.values(), key=lambda p: p.tokens_per_s_per_gpu)
    beats = [p for p in front if p.tokens_per_s_per_user >= best.tokens_per_s_per_user
             and p.tokens_per_s_per_gpu >= best.tokens_per_s_per_gpu]
    if not beats:
        return verdict
    win = max(beats, key=lambda p: p.tokens_per_s_per_gpu)
    return (verdict + f" It still makes the whole frontier because it fits bigger batches: up to {max(wide)} users "
            f"per group against {max(narrow)} for {n_name}, whose most economical point (batch {best.batch}: "
            f"{best.tokens_per_s_per_user:.1f} tok/s per user, {best.tokens_per_s_per_gpu:,.0f} tok/s per GPU) is "
            f"beaten on both by {w_name} at batch {win.batch} ({win.tokens_per_s_per_user:.1f} and "
            f"{win.tokens_per_s_per_gpu:,.0f}).")


def run_scaling(lm: Any, sizes: Sizes) -> ScalingResult:
    """Run the notebook's own experiment (``tp_scaling`` of ``infer_lab/notebooks/14_tensor_parallel.py``;
    no measurement: the roofline + ring all-reduce on catalogued GPUs)."""
    return scaling_result(sizes.scaling_model, sizes.scaling_batch, sizes.scaling_context)


SCALING_GPUS = ("H100-SXM", "H100-PCIe")


def scaling_result(model: str = "llama-3-70b", batch: int = 16, context: int = 8192,
                   computed: tuple[list[dict[str, Any]], list[FrontierPoint]] | None = None) -> ScalingResult:
    """TP 1/2/4/8 on H100 SXM and PCIe (``computed``: what the notebook's ``tp_scaling`` returned;
    run here when not given), next to the fixed references: a small model, TP vs replicas, fast mode."""
    from ..analysis.memory import as_shape
    from ..analysis.parallel import fast_mode

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


def scaling_text(s: ScalingResult) -> str:
    """Part 2's findings, every number from ``s``."""
    return "\n\n".join(scaling_paragraphs(s).values())


def scaling_paragraphs(s: ScalingResult) -> dict[str, str]:
    """Part 2's findings, one paragraph each: 'sublinear', 'small', then 'replicas', 'fast' and
    'quote' when the layouts and the frontier allow them."""
    from ..analysis.capacity import ENERGY_ASSUMPTION

    sxm1, sxm4, sxm8 = s.row("H100-SXM", 1), s.row("H100-SXM", 4), s.row("H100-SXM", 8)
    pcie4 = s.row("H100-PCIe", 4)
    small1, small2 = s.small_model_rows[0], s.small_model_rows[1]
    pcie = {r.parallelism: r for r in s.layouts if r.gpu == "H100-PCIe"}
    nvl = {r.parallelism: r for r in s.layouts if r.gpu == "H100-SXM"}
    lines = {}
    lines["sublinear"], lines["small"] = (
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
    )
    if "DP4" in pcie and "TP4" in pcie and "TP4" in nvl and "DP4" in nvl:
        best_pcie = max(pcie.values(), key=lambda r: r.tokens_per_s)
        best_nvl = max(nvl.values(), key=lambda r: r.tokens_per_s)
        lines["replicas"] = (
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
        lines["fast"] = (
            "**Fast mode, computed:** a fast mode sells each user more speed at a higher GPU cost per token (a "
            f"public talk on inference described one spending what seems to be about {TALK_FAST_MODE_COMPUTE:.0f}x the "
            "tokens (read as a price) for about "
            f"{TALK_FAST_MODE_SPEEDUP:.0f}x the speed; how this model compares is below). "
            f"From the most economical frontier point within 50 ms ITL "
            f"({f.baseline.layout}, batch {f.baseline.batch}, {f.baseline.tokens_per_s_per_user:.0f} tok/s per user), "
            f"the cheapest point at least {TALK_FAST_MODE_SPEEDUP:.0f}x faster per user is {f.fast.layout} at batch "
            f"{f.fast.batch}: **{f.speedup:.2f}x the speed for {f.compute_ratio:.2f}x the GPU time per token** "
            f"(energy {f.fast.joules_per_token / f.baseline.joules_per_token:.2f}x, $ per million tokens "
            f"{f.fast.usd_per_m_tokens:.2f} vs {f.baseline.usd_per_m_tokens:.2f}). {ENERGY_ASSUMPTION}"
        )
        t = s.at_talk_compute
        reach = (f"the model reaches {TALK_FAST_MODE_COMPUTE:.0f}x the GPU time per token (the quote's ratio, read "
                 f"as cost) only at {t.speedup:.2f}x speed "
                 f"({t.layout}, batch {t.batch})" if t else
                 f"no point on this frontier costs {TALK_FAST_MODE_COMPUTE:.0f}x the GPU time per token")
        on_frontier = sorted({p.layout for p in s.frontier if p.on_frontier})
        how = ("the same layout at a smaller batch" if f.fast.layout == f.baseline.layout
               else f"{f.fast.layout} instead of {f.baseline.layout}, at batch {f.fast.batch}")
        lines["quote"] = (
            f"**What the model shows, and where it differs from the quote:** a public talk on inference described a provider's \"fast mode\" that spends what seems to be about "
            f"{TALK_FAST_MODE_COMPUTE:.0f}x as many tokens per token as the regular mode for about "
            f"{TALK_FAST_MODE_SPEEDUP:.0f}x the speed (read as a price ratio), with no mechanism named beyond sitting at the "
            f"fast end of the frontier. This model's frontier is made of {', '.join(on_frontier)} only. "
            + "".join(t + " " for t in [fixed_batch_text(s.frontier, s.model)] if t)
            + "The model's fast point is "
            f"**{how}**: speed bought mostly by serving fewer users at once, and {reach}. What is real in both: speed "
            "per user costs GPU time per token, at an increasing rate. What the model leaves out, and a product pays: "
            "kernels far from the roofline at batch 1-8, all-reduce latencies worse than NCCL's best, a tail-latency "
            "SLO. The quote does not say which model, GPU or batch it meant; read its "
            f"{TALK_FAST_MODE_COMPUTE:.0f}x as a claim about one product."
        )
    return lines


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


NOT_FITTING_ALPHA = 0.25  # how faint a bar of a layout that does not fit is drawn


def tp_scaling_title(s: ScalingResult) -> str:
    """The scaling figure's title: what it shows, and which TP sizes do not fit (their bars are faint and
    labelled: a reference for the speed-up, not a configuration that runs)."""
    title = f"analytic: {s.model}, {s.batch} users x {s.context:,} tokens: N GPUs are not N x faster"
    missing = sorted({r.tp for r in s.rows if not r.fits})
    if not missing:
        return title
    verb = "does" if len(missing) == 1 else "do"
    return title + (f"\nfaint: TP{', TP'.join(map(str, missing))} {verb} not fit (weights + KV), "
                    "the speed-up's reference")


def tp_scaling_figure(s: ScalingResult):
    """ITL per TP size and GPU (:func:`~infer_lab.analysis.parallel_figures.plot_tp_scaling`), with the bars
    of layouts that do not fit their memory drawn faint and labelled "does not fit"."""
    from ..analysis.parallel_figures import plot_tp_scaling
    from ..figures import finish

    fig = plot_tp_scaling([vars(r) for r in s.rows], title=tp_scaling_title(s))
    ax = fig.axes[0]
    ax.title.set_fontsize(9)
    finish(fig)  # lay out again with the title's final size, so both of its lines stay inside the figure
    gpus = list(dict.fromkeys(r.gpu for r in s.rows))
    bars = [c for c in ax.containers if hasattr(c, "patches")]  # per GPU: compute bars, then all-reduce bars
    ideal = [line for line in ax.lines if line.get_linestyle() == "--"]  # the ideal 1/N lines
    for i, gpu in enumerate(gpus):
        rows = [r for r in s.rows if r.gpu == gpu]
        compute, allreduce = bars[2 * i], bars[2 * i + 1]
        for row, low, high in zip(rows, compute.patches, allreduce.patches, strict=True):
            if row.fits:
                continue
            for patch in (low, high):
                patch.set_alpha(NOT_FITTING_ALPHA)
            label = ax.text(low.get_x() + low.get_width() / 2, 0, "does not fit", rotation=90, ha="center",
                            va="center", fontsize=7, color="0.25")
            _place_clear_of_lines(ax, label, high.get_y() + high.get_height(), ideal)
    return fig


def _line_span(line: Any, x0: float, x1: float) -> tuple[float, float] | None:
    """The lowest and highest y of a polyline over x0..x1 (data units); ``None`` where it does not reach there."""
    import numpy as np

    xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    lo, hi = max(x0, xs.min()), min(x1, xs.max())
    if lo > hi:
        return None
    inside = ys[(xs >= lo) & (xs <= hi)]
    values = np.concatenate([np.interp([lo, hi], xs, ys), inside])
    return float(values.min()), float(values.max())


def _place_clear_of_lines(ax: Any, label: Any, top: float, lines: list[Any]) -> None:
    """Move the vertical ``label`` (centred on its bar) to a height where no line of ``lines`` crosses it:
    inside its bar (0 to ``top``, data units), nearest the bar's middle, if it fits there; else the lowest
    clear place above the bar."""
    import numpy as np

    renderer = ax.figure.canvas.get_renderer()
    box = label.get_window_extent(renderer).transformed(ax.transData.inverted())
    half, pad = box.height / 2, box.height * 0.05
    x0, x1 = box.x0, box.x1
    spans = [span for line in lines if (span := _line_span(line, x0, x1)) is not None]

    def clear(y: float) -> bool:
        return all(hi < y - half - pad or lo > y + half + pad for lo, hi in spans)

    inside = sorted(np.linspace(half + pad, top - half - pad, 60), key=lambda y: abs(y - top / 2)) \
        if top > 2 * (half + pad) else []
    above = np.linspace(top + half + pad, ax.get_ylim()[1] - half, 60)
    y = next((float(y) for y in (*inside, *above) if clear(y)), top + half + pad)
    label.set_y(y)


def frontier_figure(s: ScalingResult):
    from ..analysis.parallel_figures import plot_frontier

    return plot_frontier(s.frontier, s.fast, title=f"analytic: {s.model} on H100 SXM, {s.context:,}-token "
                                                   "context: speed vs throughput per GPU")


def scaling_figures(s: ScalingResult) -> dict[str, Any]:
    return {"tp_scaling": tp_scaling_figure(s), "frontier": frontier_figure(s)}


# ---------------------------------------------------------------------------------------------
# The chapter surface


@dataclass
class Result(ChapterResult):
    """Chapter 14's parts; a part not run is ``None``."""

    model: str = ""
    tp: TPResult | None = None
    scaling: ScalingResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "tp": lambda: run_tp(lm, sizes),
        "scaling": lambda: run_scaling(lm, sizes),
    })


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    lines = [f"Model: {result.model}; {result.threads} torch thread(s)."]
    texts = [(result.tp, tp_text), (result.scaling, scaling_text)]
    lines += [fn(part) for part, fn in texts if part is not None]
    return "\n\n".join(lines)


def scaling_tables(s: ScalingResult) -> dict[str, Any]:
    return {
        f"TP scaling (analytic): {s.model}, {s.batch} users x {s.context:,} tokens": people_table(s.rows, SCALING_COLUMNS),
        "A small model on NVLink (analytic): SmolLM2-135M, batch 4": people_table(s.small_model_rows, SMALL_MODEL_COLUMNS),
        f"TP vs replicas on 4 GPUs (analytic): {s.layouts_model}, {s.layouts_context:,} tokens, "
        f"ITL SLO {s.itl_slo_ms:.0f} ms": people_table(s.layouts, LAYOUT_COLUMNS),
        f"Pareto frontier (analytic): {s.model} on H100 SXM": people_table(
            [p for p in s.frontier if p.on_frontier], FRONTIER_COLUMNS),
    }


SCALING_FINDINGS = {"sublinear": SCALING_LESSON, "small": SMALL_MODEL_LESSON, "replicas": LAYOUT_LESSON,
                    "fast": None}  # in the order of scaling_tables; None: the figure is the lesson


def scaling_finding(s: ScalingResult, key: str) -> tuple[str, Any, str, Any]:
    """One of part 2's findings as the page shows it: (its paragraph, its table with only the
    columns it reads or None, the full table's title, the full table)."""
    if key not in SCALING_FINDINGS:
        raise ValueError(f"key must be one of {', '.join(SCALING_FINDINGS)}, got {key!r}")
    title, full = list(scaling_tables(s).items())[list(SCALING_FINDINGS).index(key)]
    columns = SCALING_FINDINGS[key]
    return (scaling_paragraphs(s).get(key, ""), lesson_columns(full, columns) if columns else None, title, full)


def tables(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.tp:
        out["Decode step, world size 1 vs 2 (this machine)"] = tp_steps_table(result.tp)
        out["All-reduce vs message size (this machine)"] = sweep_table(result.tp)
    if result.scaling:
        out.update(scaling_tables(result.scaling))
    return out


def figures(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.tp:
        out["tp"] = tp_figure(result.tp)
    if result.scaling:
        out.update(scaling_figures(result.scaling))
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


