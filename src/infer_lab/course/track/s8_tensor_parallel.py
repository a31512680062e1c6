"""Stage 8's check: your split of a layer and your tensor-parallel layer, in the library's runtime on 2 processes.

1. ``shard_layer`` against the library's split, tensor by tensor: SmolLM2 on 2 ranks (KV heads
   2 + 1) and on 3 (1 + 1 + 1), the hidden model on 2 ranks and on 1 (a q/k/v bias), and a random
   shape drawn from the hidden seed (a bias, an uneven split of KV heads and MLP columns). A
   mismatch names the layer, the rank, the tensor and which rows or columns it should hold.
2. ``tp_decoder_layer`` with your split, on ranks simulated by threads of this process: the
   runtime's own step loop (:func:`~infer_lab.parallel.runtime.greedy_generate`) on the hidden
   prompts, with a communicator that sums the threads' tensors. What would crash or hang the real
   processes (an exception; all-reduces of different shapes, or a different number of them, on
   the ranks) fails here, with your line. On 3 ranks (SmolLM2), which no real run covers, the
   simulated run's tokens are the verdict.
3. The real thing: the library's runtime (:class:`~infer_lab.parallel.runtime.TPGroup`, 2 spawned
   processes joined by gloo) with your split cutting the weights and your layer as every worker's
   layer, on the hidden model and on SmolLM2: every token against transformers' greedy output,
   both ranks picking the same tokens, 2 all-reduces of ``tokens x hidden`` values per layer in
   every step.

The 2-process run's tokens are the verdict on a layer. On 2 ranks, a wrong token in step 2 and
the analysis of layer 0 (each all-reduce's sum against the unsplit layer's partial sums) only
explain a failure of the real run, as its hint; a layer written another way that gives
transformers' tokens passes whatever its all-reduces sum. Only with ``fail_fast`` (CI's near
misses) does a wrong token in step 2 end the check before the processes start.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from ...engine import SamplingParams
from ...engine.layers import LayerWeights, causal_attention, rms_norm, rope_cos_sin
from ...parallel.comm import CommStats
from ...parallel.layers import TPModel
from ...parallel.layers import tp_decoder_layer as library_layer
from ...parallel.runtime import StepTiming, TPGroup, greedy_generate, tp_engine_model
from ...parallel.shard import ShardPlan, plan_shards, shard_model
from ...parallel.shard import shard_layer as library_split
from ...shape import ModelShape
from ..exercises import load_file
from . import Stage, StageContext
from . import harness as h
from .boundary import BadResult, LearnerCodeError, as_tensor_like, describe, guard_function

TP_RANKS = 2  # the real runs' world size
TP_TOL = 1e-4  # relative (L2) difference two fp32 results may have and still be "the same sum"
SIM_TIMEOUT_S = 60.0  # a simulated rank waiting this long at an all-reduce: its partner never came
PROCESS_TIMEOUT_S = 120.0  # the real processes: start-up, loading, and one greedy run
FIELDS = tuple(f.name for f in fields(LayerWeights))
MODELS = {"smollm2": "SmolLM2", "hidden": "the hidden model"}
SIZES = {"smollm2": "9 heads over 3 KV heads of 64, hidden 576, intermediate 1536, no bias, 30 layers",
         "hidden": "6 heads over 2 KV heads of 16, hidden 96, intermediate 160, a q/k/v bias, 3 layers"}


# ---------------------------------------------------------------------------------------------
# The two models, as the runtime takes them


@lru_cache(maxsize=2)
def engine_model(which: str) -> Any:
    """The engine's model over ``which`` ("smollm2" or "hidden") weights (shared, not copied)."""
    return tp_engine_model(check_model(which).lm)


def check_model(which: str) -> h.CheckModel:
    return h.embedded() if which == "smollm2" else h.hidden()


def as_layer_weights(result: Any, args: tuple, kwargs: dict) -> LayerWeights:
    """A learner's split as the engine's :class:`LayerWeights` (any object with its fields), every
    tensor contiguous, as the library stores its shards."""
    missing = [f for f in FIELDS if not hasattr(result, f)]
    if missing:
        raise BadResult(f"expected a LayerWeights with the fields of w; it has no {', '.join(missing)}")
    values = []
    for f in FIELDS:
        value = getattr(result, f)
        if value is not None and not torch.is_tensor(value):
            raise BadResult(f"its {f} is {describe(value)}, not a tensor")
        values.append(value.contiguous() if value is not None else None)
    return LayerWeights(*values)


# ---------------------------------------------------------------------------------------------
# 1. The split, against the library's


@dataclass(frozen=True)
class SplitCase:
    """One layer of one model, cut for every rank of ``plan``."""

    label: str
    family: str  # "smollm2", "hidden" or "random"
    index: int
    layer: LayerWeights
    plan: ShardPlan


def _kv_split(plan: ShardPlan) -> str:
    return " + ".join(str(s.n_kv_heads) for s in plan.shares)


def random_shape(rng: random.Random) -> tuple[ModelShape, int]:
    """A small model shape unlike both models (a q/k/v bias, an odd MLP) and a world size that
    splits its KV heads unevenly where it can."""
    kv, group, d = rng.choice((3, 4, 5)), rng.choice((1, 2, 3)), rng.choice((4, 8, 12))
    hidden, inter = rng.randrange(16, 68, 4), rng.randrange(21, 91, 2)
    uneven = [n for n in range(2, kv + 1) if kv % n]
    ws = rng.choice(uneven or list(range(2, kv + 1)))
    shape = ModelShape(name="a random shape", model_type="qwen2", vocab=64, hidden=hidden, layers=1,
                       heads=kv * group, kv_heads=kv, head_dim=d, intermediate=inter, tied_embeddings=False,
                       qkv_bias=True, o_bias=False, mlp_bias=False)
    return shape, ws


def random_layer(shape: ModelShape, seed: int) -> LayerWeights:
    """Random weights of ``shape``'s layer: every entry different, so any wrong slice shows."""
    g = torch.Generator().manual_seed(seed)
    d, hd = shape.head_dim, shape.hidden
    qkv = (shape.heads + 2 * shape.kv_heads) * d

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=g)

    return LayerWeights(input_norm=randn(hd), qkv_proj=randn(qkv, hd), qkv_bias=randn(qkv),
                        o_proj=randn(hd, shape.heads * d), post_attention_norm=randn(hd),
                        gate_up_proj=randn(2 * shape.intermediate, hd), down_proj=randn(hd, shape.intermediate))


def split_cases(ctx: StageContext) -> list[SplitCase]:
    """The layers your split is held to, in order: SmolLM2 first (the course's model), then shapes
    and rank counts it does not have."""
    rng = ctx.rng("split")
    smol, hid = engine_model("smollm2"), engine_model("hidden")
    cases = []
    for index in sorted({0, rng.randrange(1, smol.shape.layers)}):
        cases.append(SplitCase(f"SmolLM2 on 2 ranks (KV heads {_kv_split(plan_shards(smol.shape, 2))})", "smollm2",
                               index, smol.layers[index], plan_shards(smol.shape, 2)))
    index = rng.randrange(smol.shape.layers)
    cases.append(SplitCase("SmolLM2 on 3 ranks (KV heads 1 + 1 + 1)", "smollm2", index, smol.layers[index],
                           plan_shards(smol.shape, 3)))
    index = rng.randrange(hid.shape.layers)
    cases.append(SplitCase("the hidden model on 2 ranks (KV heads 1 + 1, a q/k/v bias)", "hidden", index,
                           hid.layers[index], plan_shards(hid.shape, 2)))
    cases.append(SplitCase("the hidden model on 1 rank (all of it)", "hidden", 0, hid.layers[0],
                           plan_shards(hid.shape, 1)))
    for i in range(3 if ctx.full else 1):
        shape, ws = random_shape(rng)
        plan = plan_shards(shape, ws)
        cases.append(SplitCase(f"a random shape ({shape.heads} heads over {shape.kv_heads} KV heads of "
                               f"{shape.head_dim}, hidden {shape.hidden}, intermediate {shape.intermediate}, a q/k/v "
                               f"bias) on {ws} ranks (KV heads {_kv_split(plan)})", "random", 0,
                               random_layer(shape, ctx.subseed(f"layer{i}")), plan))
    return cases


def _span(what: str, r: tuple[int, int]) -> str:
    return f"{what} {r[0]}" if r[1] - r[0] == 1 else f"{what}s {r[0]}-{r[1] - 1}"


def split_expectation(field: str, plan: ShardPlan, share: Any) -> str:
    """What rank ``share.rank``'s slice of ``field`` is, in words, with the row or column numbers."""
    d, heads, kv = plan.head_dim, plan.heads, plan.kv_heads
    (qa, qb), (ka, kb), (ma, mb) = share.q_heads, share.kv_heads, share.mlp
    if field in ("qkv_proj", "qkv_bias"):
        k0, v0 = heads * d, (heads + kv) * d
        return (f"column-parallel: the q rows {qa * d}-{qb * d - 1} of its {_span('query head', share.q_heads)} "
                f"(whole KV groups: the {heads // kv} query head(s) that read each of its KV heads), then the k rows "
                f"{k0 + ka * d}-{k0 + kb * d - 1} and the v rows {v0 + ka * d}-{v0 + kb * d - 1} of its "
                f"{_span('KV head', share.kv_heads)} (k starts after all {heads} x {d} q rows, v after all {kv} x {d} "
                "k rows)")
    if field == "o_proj":
        return (f"row-parallel: the input columns {qa * d}-{qb * d - 1} of its {_span('query head', share.q_heads)}, "
                f"all {plan.hidden} output rows, so its output is a partial sum of the full hidden vector")
    if field == "gate_up_proj":
        return (f"column-parallel: the gate rows {ma}-{mb - 1} of its {_span('MLP column', share.mlp)}, then the "
                f"same columns of up, rows {plan.intermediate + ma}-{plan.intermediate + mb - 1} (up starts after "
                f"all {plan.intermediate} gate rows)")
    if field == "down_proj":
        return (f"row-parallel: the input columns {ma}-{mb - 1} of its {_span('MLP column', share.mlp)}, all "
                f"{plan.hidden} output rows")
    return "replicated: every rank normalizes the full h with the whole norm weight"


def _blocks(field: str, t: torch.Tensor, plan: ShardPlan, share: Any) -> list[tuple[str, torch.Tensor]]:
    """A rank's stacked slice cut back into its named blocks (q|k|v, gate|up)."""
    d = plan.head_dim
    if field in ("qkv_proj", "qkv_bias"):
        sizes = (share.n_heads * d, share.n_kv_heads * d, share.n_kv_heads * d)
        return list(zip(("q rows", "k rows", "v rows"), t.split(sizes), strict=True))
    if field == "gate_up_proj":
        return list(zip(("gate rows", "up rows"), t.split(share.n_mlp), strict=True))
    return [("values", t)]


def split_problem(split: Any, case: SplitCase) -> tuple[str, str] | None:
    """``(field, what differs)`` at the first place your split of ``case`` differs from the library's."""
    for share in case.plan.shares:
        where = f"{case.label}, layer {case.index}, rank {share.rank}"
        try:
            out = split(case.layer, case.plan, share)
        except LearnerCodeError as exc:
            return "", f"{where}: {exc}"
        want = library_split(case.layer, case.plan, share)
        for field in FIELDS:
            got, exp = getattr(out, field), getattr(want, field)
            if exp is None or got is None:
                if (exp is None) != (got is None):
                    return field, (f"{where}: your {field} is {describe(got)}, expected "
                                   f"{'None (this model has no bias)' if exp is None else 'a tensor'}")
                continue
            rule = split_expectation(field, case.plan, share)
            if tuple(got.shape) != tuple(exp.shape):
                full = tuple(getattr(case.layer, field).shape)
                layout = ", as (out_features, in_features)" if len(full) == 2 else ""
                return field, (f"{where}: your {field} is {tuple(got.shape)}, expected {tuple(exp.shape)} (the full "
                               f"one is {full}{layout}). Rank {share.rank} holds {rule}")
            if got.dtype != exp.dtype:
                return field, (f"{where}: your {field} is {str(got.dtype).replace('torch.', '')}, the weights are "
                               f"{str(exp.dtype).replace('torch.', '')}: slice them, do not convert (the engine "
                               "computes in the model's dtype)")
            if not torch.equal(got, exp):
                blocks = [name for (name, g), (_, e) in zip(_blocks(field, got, case.plan, share),
                                                            _blocks(field, exp, case.plan, share), strict=True)
                          if not torch.equal(g, e)]
                inside = f" in its {' and '.join(blocks)}" if blocks and blocks != ["values"] else ""
                return field, (f"{where}: your {field} has the right shape {tuple(exp.shape)} but other numbers"
                               f"{inside}. Rank {share.rank} holds {rule}")
    return None


def split_hint(field: str, case: SplitCase, passed: list[SplitCase]) -> str:
    """A hint that matches where the split first went wrong, given the cases that passed before it."""
    if field == "qkv_bias":
        return ("the q/k/v bias is stacked like the rows of qkv_proj (q, then k, then v): cut it with the same rows. "
                "SmolLM2 has no bias (None), so only a model with one shows this")
    if case.plan.world_size != 2 and any(p.plan.world_size == 2 and p.family == case.family for p in passed):
        return (f"your split is right on 2 ranks and wrong on {case.plan.world_size}: take each rank's ranges from "
                "share (share.q_heads, share.kv_heads, share.mlp), not from its rank number and a count of 2")
    if case.family != "smollm2" and any(p.family == "smollm2" for p in passed):
        return ("your split is right on SmolLM2 and wrong on this shape: is one of SmolLM2's sizes (9 heads, 3 KV heads, "
                "head_dim 64, intermediate 1536) written into your code? Take every size from plan (plan.heads, "
                "plan.kv_heads, plan.head_dim, plan.intermediate, plan.hidden)")
    return ""


def check_split(ctx: StageContext) -> bool:
    """Step 1; True when every case matched the library's split."""
    split = ctx.fn("shard_layer")
    cases = split_cases(ctx)
    shares = sum(len(c.plan.shares) for c in cases)
    name = (f"your shard_layer() against the library's split: {len(cases)} layers cut for {shares} ranks (SmolLM2 on "
            "2 and 3 ranks, the hidden model on 2 and 1, a random shape)")
    for i, case in enumerate(cases):
        found = split_problem(split, case)
        if found:
            field, text = found
            hint = split_hint(field, case, cases[:i])
            return ctx.report.record(name, False, text + (f"\n    hint: {hint}" if hint else "")
                                     + "\n    (your tp_decoder_layer() is checked once the split is right)")
    biased = sum(len(c.plan.shares) for c in cases if c.layer.qkv_bias is not None)
    smol2 = plan_shards(engine_model("smollm2").shape, 2)
    return ctx.report.record(name, True, f"every tensor identical, q/k/v bias included ({biased} ranks of models "
                                         f"with one); SmolLM2 on 2 ranks: {smol2.describe()}")


# ---------------------------------------------------------------------------------------------
# 2. Ranks simulated by threads


class PartnerGone(Exception):
    """A simulated rank waited at an all-reduce that another rank never reached."""


class ShapeMismatch(Exception):
    """The ranks all-reduced tensors of different shapes."""

    def __init__(self, shapes: list[tuple[int, ...]], call: int):
        super().__init__(f"all-reduce no. {call}: shapes {shapes}")
        self.shapes, self.call = shapes, call


class SimulatedGroup:
    """``world_size`` ranks as threads of this process: a rendezvous per all-reduce, a count of
    each rank's calls, and (``keep_sums``) every call's sum."""

    def __init__(self, world_size: int, keep_sums: bool = False):
        self.world_size, self.keep_sums = world_size, keep_sums
        self.cond = threading.Condition()
        self.arrived, self.generation, self.gone = 0, 0, False
        self.slots: list[torch.Tensor | None] = [None] * world_size
        self.calls = [0] * world_size
        self.sums: list[torch.Tensor] = []

    def rendezvous(self) -> None:
        with self.cond:
            generation = self.generation
            self.arrived += 1
            if self.arrived == self.world_size:
                self.arrived, self.generation = 0, self.generation + 1
                self.cond.notify_all()
                return
            while self.generation == generation:
                if self.gone or not self.cond.wait(timeout=SIM_TIMEOUT_S):
                    raise PartnerGone

    def leave(self) -> None:
        with self.cond:
            self.gone = True
            self.cond.notify_all()


class SimulatedComm:
    """What a simulated rank's layer sees as ``comm``: the runtime's Communicator, with all_reduce
    summing the threads' tensors in place (rank 0's + rank 1's + ..., as gloo adds two)."""

    def __init__(self, group: SimulatedGroup, rank: int):
        self.group, self.rank, self.world_size = group, rank, group.world_size
        self.device = torch.device("cpu")
        self._calls, self._bytes = 0, 0

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        g = self.group
        if not torch.is_tensor(t):
            raise TypeError(f"comm.all_reduce takes a tensor, got {describe(t)}")
        g.calls[self.rank] += 1
        g.slots[self.rank] = t
        g.rendezvous()
        shapes = [tuple(s.shape) for s in g.slots]
        if len(set(shapes)) > 1:
            raise ShapeMismatch(shapes, g.calls[self.rank])
        total = g.slots[0].detach().clone()
        for other in g.slots[1:]:
            total += other
        if self.rank == 0 and g.keep_sums:
            g.sums.append(total.clone())
        g.rendezvous()  # every rank has read every slot before any writes its own
        with torch.no_grad():
            t.copy_(total)
        self._calls += 1
        self._bytes += t.numel() * t.element_size()
        return t

    def barrier(self) -> None:
        self.group.rendezvous()

    def stats(self) -> CommStats:
        return CommStats(self._calls, self._bytes, 0.0)

    def reset(self) -> None:
        self._calls, self._bytes = 0, 0


def run_ranks(world_size: int, body: Any, keep_sums: bool = False
              ) -> tuple[list[Any], list[BaseException | None], SimulatedGroup]:
    """``body(rank, comm)`` on ``world_size`` threads at once: their results, errors and group."""
    group = SimulatedGroup(world_size, keep_sums)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def rank_main(rank: int) -> None:
        try:
            results[rank] = body(rank, SimulatedComm(group, rank))
        except BaseException as exc:  # reported by the caller, rank by rank
            errors[rank] = exc
        finally:
            group.leave()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True, name=f"sim-rank-{r}")
               for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # short waits: the check's time limit (a signal) can interrupt
    finally:
        group.leave()
    return results, errors, group


def _cause(exc: BaseException | None) -> BaseException | None:
    """The exception behind the boundary's LearnerCodeError (the comm's own ones are raised inside your layer)."""
    while isinstance(exc, LearnerCodeError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def crash_problem(errors: list[BaseException | None], group: SimulatedGroup) -> str | None:
    """What would crash or hang the real processes, in words; None when every rank ran to the end."""
    ws = group.world_size
    causes = [_cause(e) for e in errors]  # the comm's own exceptions, raised inside the learner's layer
    for exc, cause in zip(errors, causes, strict=True):
        if isinstance(cause, ShapeMismatch):
            shapes = ", ".join(f"{s} on rank {r}" for r, s in enumerate(cause.shapes))
            line = f" (your line {exc.line})" if isinstance(exc, LearnerCodeError) and exc.line else ""
            return (f"all-reduce no. {cause.call}{line} got tensors of different shapes: {shapes}. The ranks must "
                    "all-reduce tensors of one shape, a partial sum of the full (tokens, hidden) output; q/k/v and "
                    "the attention output are each rank's own heads (with SmolLM2's 2 + 1 split, rank 0 has twice "
                    "as many), not partial sums. The real processes would fail or wait for each other forever")
    for rank, (exc, cause) in enumerate(zip(errors, causes, strict=True)):
        if exc is not None and not isinstance(cause, PartnerGone):
            text = str(exc) if isinstance(exc, LearnerCodeError) else f"{type(exc).__name__}: {exc}"
            return f"on rank {rank} of {ws}: {text}"
    if any(isinstance(c, PartnerGone) for c in causes) or len(set(group.calls)) > 1:
        made = ", ".join(f"rank {r} made {n}" for r, n in enumerate(group.calls))
        return (f"the ranks made different numbers of all-reduces ({made}): every rank must make the same all-reduces "
                "in the same order, since each waits at it for the others (an all-reduce under `if comm.rank == 0` "
                "leaves the other ranks waiting). The real processes would wait for each other forever")
    return None


@dataclass
class Simulated:
    """A greedy run on simulated ranks: each rank's tokens and steps, or what stopped it."""

    tokens: list[list[list[int]]]
    steps: list[list[StepTiming]]
    crash: str | None


def simulate(which: str, world_size: int, split: Any, layer: Any, prompts: list[list[int]],
             new_tokens: int) -> Simulated:
    """The runtime's step loop on ``world_size`` threads, your split and your layer."""
    em = engine_model(which)
    shards = shard_model(em, world_size, split)
    eos = em.shape.eos_token_id

    def body(rank: int, comm: SimulatedComm) -> tuple[list[list[int]], list[StepTiming]]:
        model = TPModel(shards[rank], comm)
        model.layer_fn = layer
        tokens, steps, _ = greedy_generate(model, prompts, new_tokens, eos, ignore_eos=True)
        return tokens, steps

    results, errors, group = run_ranks(world_size, body)
    crash = crash_problem(errors, group)
    if crash:
        return Simulated([], [], crash)
    return Simulated([r[0] for r in results], [r[1] for r in results], None)


# -- verdicts shared by the simulated and the real runs --------------------------------------


def token_problem(which: str, prompts: list[list[int]], new_tokens: int, outputs: list[list[int]]) -> str | None:
    """Where ``outputs`` first part from transformers' greedy tokens (a near tie of the reference
    excused), in words; None when they agree."""
    model = check_model(which)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    for i, (prompt, got) in enumerate(zip(prompts, outputs, strict=True)):
        ref = h.reference(model, prompt, params)
        want = list(ref.tokens)
        j = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        if j is None:
            if len(got) == len(want):
                continue
            j = min(len(got), len(want))
        if j < len(ref.margins) and ref.margins[j] < h.TIE_MARGIN:
            continue
        what = (f"expected {want[j]} {h.tokens_text(model, [want[j]])}, got {got[j]} {h.tokens_text(model, [got[j]])}"
                if j < len(got) and j < len(want) else f"{len(got)} tokens instead of {len(want)}")
        return (f"prompt {i} ({len(prompt)} tokens): first different token at output position {j} (the {j} before it "
                f"agree): {what}")
    return None


def agreement_problem(per_rank: list[list[list[int]]]) -> str | None:
    """Where a rank first picked another token than rank 0; None when they all agree."""
    for rank, other in enumerate(per_rank[1:], start=1):
        for i, (a, b) in enumerate(zip(per_rank[0], other, strict=True)):
            if a != b:
                j = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                return (f"rank {rank} parted from rank 0 at output position {j} of prompt {i}: every rank must end "
                        "each layer with the same full h (the all-reduced sums, not its own partial ones)")
    return None


def count_text(per_step: int, layers: int) -> str:
    """What a step's count of all-reduces means, for a message."""
    seen = f"{per_step} all-reduces in a step of {layers} layers"
    if per_step == 0:
        why = ("nothing adds up the ranks' partial sums: the row-parallel matmuls (o, down) give each rank a partial "
               "sum of the full hidden vector")
    elif per_step == layers:
        why = "one per layer: one of the two partial sums (after o, after down) is never added up across the ranks"
    elif per_step < 2 * layers:
        why = "some layers leave a partial sum that is never added up across the ranks"
    else:
        why = ("an all-reduce too many: only a row-parallel matmul's output is a partial sum; q/k/v, the attention "
               "output and gate/up are this rank's own heads and columns, and h is already the same on every rank")
    return f"{seen}, expected 2 per layer ({2 * layers}): {why}"


def count_problem(per_rank: list[list[StepTiming]], layers: int, hidden: int, value_bytes: int) -> str | None:
    """2 all-reduces per layer in every step, each of ``tokens x hidden`` values; what differs first."""
    for rank, steps in enumerate(per_rank):
        for s in steps:
            if s.allreduce_calls != 2 * layers:
                return f"rank {rank}, step {s.step} ({s.phase}): {count_text(s.allreduce_calls, layers)}"
            want = 2 * layers * s.tokens * hidden * value_bytes
            if s.allreduce_bytes != want:
                return (f"rank {rank}, step {s.step} ({s.phase}, {s.tokens} tokens): the all-reduces moved "
                        f"{s.allreduce_bytes:,} bytes, expected {want:,} (2 x {layers} layers x {s.tokens} tokens x "
                        f"{hidden} hidden x {value_bytes} bytes): all-reduce the (tokens, hidden) partial sums "
                        "themselves, in the model's dtype")
    return None


# -- why a layer is wrong: layer 0 on simulated ranks, against the unsplit layer ---------------


class Recorder:
    """One rank's comm that records what it is asked to all-reduce (and returns it unchanged)."""

    rank, world_size = 0, 1

    def __init__(self):
        self.inputs: list[torch.Tensor] = []

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        self.inputs.append(t.detach().clone())
        return t

    def barrier(self) -> None:
        pass


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a - b| / |b| (L2 over every element); inf when the shapes differ."""
    if a.shape != b.shape:
        return math.inf
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _residual_multiple(s: torch.Tensor, partial: torch.Tensor, before: torch.Tensor) -> float | None:
    """``k`` when ``s`` is the partial sums plus ``k x h`` (``before``); None when it is not of that form."""
    if s.shape != partial.shape:
        return None
    s, p, b = s.double(), partial.double(), before.double()
    k = float(((s - p) * b).sum() / (b * b).sum().clamp_min(1e-30))
    return k if _rel(s, p + k * b) < TP_TOL else None


def _attend(scale: float) -> Any:
    """Causal attention of one sequence over a rank's heads (what the runtime's prefill hands a layer)."""

    def attend(q, k, v):
        qi, ki, vi = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        return causal_attention(qi, ki, vi, scale)[0].transpose(0, 1).flatten(1)

    return attend


def explain(which: str, world_size: int, layer: Any, prompt: list[int]) -> str:
    """Why a layer gives other tokens, from layer 0 of a prefill of ``prompt`` on simulated ranks:
    each all-reduce's sum against the unsplit layer's two partial sums, and the layer's output."""
    em = engine_model(which)
    first = SimpleNamespace(shape=em.shape, embed=em.embed, final_norm=em.final_norm, lm_head=em.lm_head,
                            inv_freq=em.inv_freq, layers=em.layers[:1])  # layer 0 only: nothing else runs
    (full,) = shard_model(first, 1)
    shards = shard_model(first, world_size)
    ids = torch.tensor(prompt)
    h0 = em.embed[ids].clone()
    cos, sin = rope_cos_sin(torch.arange(len(ids)), em.inv_freq, em.embed.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]
    attend = _attend(em.shape.head_dim ** -0.5)
    with torch.inference_mode():
        rec = Recorder()
        ref_out = library_layer(h0.clone(), full.layers[0], attend, cos, sin, full, rec)
    partials = rec.inputs  # the unsplit layer's o output, then its down output
    befores = [h0, h0 + partials[0]]  # h before each of them

    def body(rank: int, comm: SimulatedComm) -> torch.Tensor:
        with torch.inference_mode():
            return layer(h0.clone(), shards[rank].layers[0], attend, cos, sin, shards[rank], comm)

    outs, errors, group = run_ranks(world_size, body, keep_sums=True)
    crash = crash_problem(errors, group)
    if crash:
        return f"layer 0 alone on {world_size} simulated ranks: {crash}"
    where = f"layer 0 of a {len(prompt)}-token prefill on {world_size} simulated ranks"
    diff = _rel(outs[0], ref_out)
    agree = all(torch.equal(o, outs[0]) for o in outs[1:])
    if agree and diff <= TP_TOL:
        return (f"{where} gives the unsplit layer's output on every rank (relative difference {diff:.1e}), so the "
                "difference comes from a later layer or a decode step: does your layer depend on anything but its "
                "arguments (a global, a count of its calls)?")
    ws, n = world_size, group.calls[0]
    what = ("o (attention)", "down (the MLP)")
    j, bad = 0, None
    for i, s in enumerate(group.sums):
        k = _residual_multiple(s, partials[j], befores[j]) if j < 2 else None
        if k is not None and (abs(k) < 1e-3 or abs(k - 1) < 1e-3):
            j += 1  # the partial sums, with the residual added once or not at all: both right
            continue
        if k is not None:
            return (f"{where}: all-reduce no. {i + 1} sums {what[j]}'s partial sums plus {k:.3g} x h: the residual h "
                    f"must be counted once in all (each of the {ws} ranks adding h counts it {ws} times; h on one "
                    f"rank, or h / comm.world_size on each, counts it once)")
        if j == 1 and _rel(s, _mlp(full, partials[0])) < TP_TOL:
            return (f"{where}: all-reduce no. {i + 1} sums the right partial sums of the MLP, but the MLP ran on the "
                    "attention's all-reduced sum alone: add the residual h to it first (the unsplit layer's "
                    "h + o(attention))")
        if bad is None:
            bad = i
    if n != 2:
        text = (f"{where}: {n} all-reduce(s), expected 2 (each row-parallel matmul, o and then down, leaves a partial "
                "sum to add up)")
        if n == 1 and j == 1:
            text += "; the one made sums the attention's partial sums: the MLP's (after down) are never added up"
        elif n == 1:
            text += "; the one made is neither the attention's partial sums nor the MLP's"
        elif n > 2 and bad is not None:
            text += f"; the extra one is no. {bad + 1}, a {tuple(group.sums[bad].shape)} tensor"
        return text + f". Its output differs from the unsplit layer's by {diff * 100:.3g}%"
    if bad is not None:
        j = min(j, 1)
        got, ref = tuple(group.sums[bad].shape), tuple(partials[j].shape)
        before = ("the input norm, q/k/v and their bias, RoPE, attention, o's columns" if j == 0 else
                  "the post-attention norm on h + attention, gate/up, SiLU, down's columns")
        off = (f"a {got} tensor; the partial sums to add are the {ref} output of {what[j]}, a row-parallel matmul"
               if got != ref else
               f"a {got} tensor that is not the unsplit layer's {what[j]} output summed over the ranks (off by "
               f"{_rel(group.sums[bad], partials[j]) * 100:.3g}%): either it is not that matmul's output itself, "
               f"or what comes before it differs ({before})")
        return f"{where}: all-reduce no. {bad + 1} sums {off}"
    if not agree:
        return (f"{where}: the ranks end the layer with different h: every rank must continue from the same full h "
                "(the all-reduced sums, not its own partial ones)")
    return (f"{where}: both all-reduces sum the right partial sums, but the layer's output differs from the unsplit "
            f"layer's by {diff * 100:.3g}%: add each sum to the residual h, as the unsplit layer does")


def _mlp(full: Any, h_in: torch.Tensor) -> torch.Tensor:
    """The unsplit layer 0's MLP (post-attention norm, SiLU-gated, down) on ``h_in``."""
    w, eps = full.layers[0], full.shape.rms_norm_eps
    with torch.inference_mode():
        gate, up = F.linear(rms_norm(h_in, w.post_attention_norm, eps), w.gate_up_proj).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w.down_proj)


# ---------------------------------------------------------------------------------------------
# The check's runs


@dataclass(frozen=True)
class Workload:
    which: str
    world_size: int
    prompts: list[list[int]]
    new_tokens: int

    def describe(self) -> str:
        lens = [len(p) for p in self.prompts]
        span = f"{min(lens)}-{max(lens)}" if min(lens) != max(lens) else f"{lens[0]}"
        return (f"{MODELS[self.which]} ({SIZES[self.which]}): {len(lens)} hidden prompt(s) of {span} tokens, "
                f"{self.new_tokens} greedy tokens each")


def workloads(ctx: StageContext) -> dict[str, Workload]:
    """The hidden prompts: random tokens, lengths and counts from the hidden seed. The hidden model is
    cheap, so its simulated run is its real run's workload; SmolLM2's simulated runs are short (a
    prefill and a few decode steps: enough to find what would crash or hang the processes)."""
    full = ctx.full
    plan = {"smollm2": ("smollm2", 2, 3 if full else 2, (5, 16), 10 if full else 5),  # the real run
            "smollm2-sim": ("smollm2", 2, 2 if full else 1, (5, 16), 6 if full else 3),
            "hidden": ("hidden", 2, 6 if full else 4, (3, 24), 12 if full else 8),  # simulated, then real
            "smollm2-3": ("smollm2", 3, 2 if full else 1, (4, 12), 6 if full else 3)}
    out = {}
    for key, (which, ws, n, lens, new) in plan.items():
        rng = ctx.rng(f"prompts-{key}")
        vocab = check_model(which).vocab
        out[key] = Workload(which, ws, [h.random_prompt(rng, vocab, rng.randint(*lens)) for _ in range(n)], new)
    return out


def check_simulated(ctx: StageContext, work: Workload, decisive: bool, passed: set[str]) -> tuple[bool, str]:
    """Step 2 on one workload: ``(the real processes may start, a hint for the real run)``.

    What would crash or hang the processes is recorded here. Wrong tokens (or all-reduce counts) are
    recorded here when no real run covers the workload (3 ranks) or with ``fail_fast``; otherwise
    the explanation becomes the real run's hint and the real run decides."""
    layer, split = ctx.fn("tp_decoder_layer"), ctx.fn("shard_layer")
    case = (f"your tp_decoder_layer() on {work.world_size} ranks simulated by threads of this process, "
            f"{work.describe()}")
    em = engine_model(work.which)
    sim = simulate(work.which, work.world_size, split, layer, work.prompts, work.new_tokens)
    if sim.crash:
        hint = ""
        if work.which == "hidden" and "smollm2-2" in passed:
            hint = (f"\n    hint: right on SmolLM2 and not on the hidden model ({SIZES['hidden']}): is every size "
                    "taken from shard (shard.share, shard.shape), none of SmolLM2's written in?")
        ctx.report.record(case, False, sim.crash + hint + "\n    (the processes start once your layer runs to the end "
                                                          "here)")
        return False, ""
    wrong = token_problem(work.which, work.prompts, work.new_tokens, sim.tokens[0]) or agreement_problem(sim.tokens)
    problem = wrong or count_problem(sim.steps, em.shape.layers, em.shape.hidden, em.embed.element_size())
    if problem is None:
        passed.add(f"{work.which}-{work.world_size}")
        n = sum(map(len, sim.tokens[0]))
        ctx.report.record(case, True, f"{n} tokens identical to transformers' greedy output on every rank, "
                                      f"{sum(s.allreduce_calls for s in sim.steps[0])} all-reduces in "
                                      f"{len(sim.steps[0])} steps")
        return True, ""
    hints = []
    if wrong:
        if work.which == "hidden" and "smollm2-2" in passed:
            hints.append(f"right on SmolLM2 and not on the hidden model ({SIZES['hidden']}): is w.qkv_bias passed "
                         "on, and is every size taken from shard (shard.share, shard.shape), none of SmolLM2's written in?")
        if work.world_size != 2 and f"{work.which}-2" in passed:
            hints.append(f"right on 2 ranks and not on {work.world_size}: does your layer assume 2 ranks (a / 2, rank 0 "
                         "against rank 1)? comm.world_size is the number of ranks")
        hints.append(explain(work.which, work.world_size, layer, work.prompts[0]))
    if decisive or getattr(ctx.report, "fail_fast", False):
        ctx.report.record(case, False, problem + "".join(f"\n    hint: {x}" for x in hints))
    return True, "\n    hint: ".join(hints)  # the real run's hint (compare() says "hint: " before the first)


_WORKER_LAYERS: dict[str, Any] = {}  # in a worker process: the learner's layer, loaded once


@dataclass(frozen=True)
class LearnerLayer:
    """Your tp_decoder_layer as a worker process loads it: pickled as your file's path, loaded (and
    guarded, so an error names your line) where it is first called."""

    path: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = _WORKER_LAYERS.get(self.path)
        if fn is None:
            path = Path(self.path)
            fn = guard_function(load_file(path).tp_decoder_layer, "your tp_decoder_layer", path, as_tensor_like(0))
            _WORKER_LAYERS[self.path] = fn
        return fn(*args, **kwargs)


def worker_error(text: str) -> str:
    """The learner's error out of a worker's traceback (the runtime sends it whole)."""
    marker = "LearnerCodeError: "
    at = text.rfind(marker)
    head = text.strip().splitlines()[0] if text.strip() else "a TP worker failed"
    if at >= 0:
        return f"{head.rstrip(':')}: {text[at + len(marker):].strip()}"
    tail = [line for line in text.strip().splitlines() if line.strip()]
    return f"{head.rstrip(':')}: {tail[-1].strip()}" if len(tail) > 1 else head


def check_processes(ctx: StageContext, work: Workload, hint: str) -> None:
    """Step 3 on one model: the library's runtime on 2 processes with your split and your layer."""
    em, model = engine_model(work.which), check_model(work.which)
    case = f"tensor parallelism on {TP_RANKS} processes (gloo) with your split and your layer, {work.describe()}"
    run, crash = None, None
    try:
        with TPGroup(em, world_size=TP_RANKS, backend="gloo", timeout_s=PROCESS_TIMEOUT_S,
                     split=ctx.fn("shard_layer"), layer=LearnerLayer(str(ctx.path.resolve()))) as group:
            run = group.generate([list(p) for p in work.prompts], work.new_tokens, ignore_eos=True, warmup=False,
                                 require_agreement=False)
    except LearnerCodeError as exc:
        crash = str(exc)
    except RuntimeError as exc:
        crash = worker_error(str(exc))
    params = SamplingParams(max_tokens=work.new_tokens, ignore_eos=True)
    trace = h.Trace(f"{len(work.prompts)} hidden prompts", [list(p) for p in work.prompts],
                    [params] * len(work.prompts))
    n = len(work.prompts)
    counted = count_problem([r.steps for r in run.ranks], em.shape.layers, em.shape.hidden,
                            em.embed.element_size()) if run else None
    result = h.Run(model, trace, None, None, outputs=run.token_ids if run else [[] for _ in range(n)],
                   finish_reasons=["length"] * n, errors=[None] * n, steps=len(run.steps) if run else 0,
                   finished=run is not None, crash=crash)
    if not hint and run is not None:
        wrong = token_problem(work.which, work.prompts, work.new_tokens, run.token_ids)
        hint = explain(work.which, TP_RANKS, ctx.fn("tp_decoder_layer"), work.prompts[0]) if wrong else counted or ""
    h.compare(ctx.report, case, result, hint=hint)
    if run is None:
        return
    disagree = agreement_problem([r.token_ids for r in run.ranks])
    ctx.report.record(f"both ranks picked the same tokens ({MODELS[work.which]})", disagree is None,
                      disagree or f"{len(run.ranks)} ranks, the same {sum(map(len, run.token_ids))} tokens")
    ctx.report.record(f"2 x {em.shape.layers} layers = {2 * em.shape.layers} all-reduces of tokens x hidden values in "
                      f"every step, on every rank ({MODELS[work.which]})", counted is None,
                      counted or f"{run.allreduce_count} all-reduces in {len(run.steps)} steps "
                                 f"({run.allreduce_bytes:,} bytes on rank 0)")


def check(ctx: StageContext) -> None:
    if not check_split(ctx):
        return
    work = workloads(ctx)
    hints: dict[str, str] = {}
    passed: set[str] = set()
    for key in ("smollm2-sim", "hidden", "smollm2-3"):
        w = work[key]
        may_start, hints[f"{w.which}-{w.world_size}"] = check_simulated(ctx, w, decisive=w.world_size != TP_RANKS,
                                                                          passed=passed)
        if not may_start:
            return
    for key in ("hidden", "smollm2"):
        check_processes(ctx, work[key], hints[f"{key}-{TP_RANKS}"])


STAGE = Stage(
    number=8, key="tp", title="Tensor parallelism on two processes", file="08_tensor_parallel.py",
    components={"tp": "tp_decoder_layer"}, requires=("shard_layer",), chapter="14", minutes=90,
    task="Split each decoder layer over the ranks (q/k/v and gate/up by output rows, whole KV groups per rank; o and "
         "down by input columns) and write one rank's layer, all-reducing where a rank holds a partial sum; run in "
         "the library's tensor-parallel runtime on 2 processes, token for token against transformers.",
    check=check, adapters={"shard_layer": as_layer_weights, "tp_decoder_layer": as_tensor_like(0)},
    symbol="src/infer_lab/parallel/shard.py::shard_layer, src/infer_lab/parallel/layers.py::tp_decoder_layer",
)
