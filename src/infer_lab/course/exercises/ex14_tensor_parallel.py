"""Chapter 14's exercises: the ring all-reduce term, a TP step's all-reduces, KV copies under TP, and (build)
the column/row-parallel split of a layer and its all-reduces, run on 2 processes."""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import pickle
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from ...analysis.memory import kv_bytes_per_element
from ...analysis.parallel import allreduce_cost, kv_replication, tp_allreduces
from ...catalog import get_interconnect
from ...engine.layers import LayerWeights, causal_attention, rms_norm, rope_cos_sin
from ...parallel.layers import tp_decoder_layer
from ...parallel.runtime import TPGroup, tp_engine_model
from ...parallel.shard import (
    RankShare,
    ShardPlan,
    plan_shards,
    shard_layer,
    shard_model,
    split_evenly,
)
from ...shape import model_shape
from ...units import human
from . import Exercise, build
from .checking import Mistake, NotDoneYet, factor_of_2, short_repr

NUMBER = "14"
SLUG = "tensor_parallel"
TITLE = "14 · Tensor parallelism"

RING_CASES = (("nvlink4-nvswitch", 8, 1_000_000_000), ("nvlink4-nvswitch", 8, 262_144), ("nvlink4-nvswitch", 2, 64 << 20),
              ("pcie4-x16", 4, 16 << 20), ("nvlink3-nvswitch", 4, 8_192), ("infiniband-ndr400", 16, 512 << 20),
              ("nvlink4-nvswitch", 1, 1 << 20))


def check_ring(fns, r) -> None:
    for link_name, n, size in RING_CASES:
        link = get_interconnect(link_name)
        busbw = link.bus_bandwidth_Bps(n)
        case = (f"{n} ranks on {link_name}, {size:,} B each: bus bandwidth {busbw / 1e9:g} GB/s, hop "
                f"{link.hop_latency_s * 1e6:g} us, launch {link.base_latency_s * 1e6:g} us")
        got = r.call(fns.ring_allreduce_s, n, size, busbw, link.hop_latency_s, link.base_latency_s, case=case)
        cost = allreduce_cost(n, size, link)
        wrong = None
        if n > 1:
            wrong = {"S / B: each rank sends 2(N-1)/N x S over the ring, not S": cost.base_s + cost.latency_s
                     + size / busbw,
                     "the bandwidth term alone: every step of the ring also pays a hop's latency, and the "
                     "collective its launch": cost.bandwidth_s,
                     "(N-1) steps: a ring all-reduce is a reduce-scatter AND an all-gather, 2(N-1) steps":
                     cost.base_s + cost.latency_s / 2 + cost.bandwidth_s / 2,
                     "the bidirectional bandwidth: a rank sends and receives at once, so the per-direction "
                     "(bus) bandwidth is the ceiling": cost.base_s + cost.latency_s + cost.bandwidth_s / 2}
        if n == 1:
            r.close(case, got, 0.0, abs_tol=1e-15, unit="s", hint="one rank has nothing to reduce: 0 s")
            continue
        r.close(case, got, cost.total_s, rel_tol=1e-9, unit="s", wrong=wrong)


TP_CASES = (("llama-3-70b", 8, 16, "bf16"), ("llama-3-70b", 4, 1, "bf16"), ("mistral-7b", 2, 64, "fp32"),
            ("qwen2.5-7b", 4, 8, "bf16"))


def check_tp_allreduces(fns, r) -> None:
    for model, tp, batch, dtype in TP_CASES:
        s = model_shape(model)
        comm = tp_allreduces(s, tp, batch, "nvlink4-nvswitch", dtype)
        case = f"{model} at TP{tp}: {s.layers} layers, hidden {s.hidden}, decode batch {batch}, {dtype} activations"
        got = r.call(fns.tp_decode_allreduces, s.layers, s.hidden, batch, kv_bytes_per_element(dtype), case=case)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            r.record(case, False, f"return (count, bytes each), got {got!r:.60}")
            continue
        r.close(case + ": all-reduces per step", got[0], comm.count,
                mistakes=[Mistake(0.5, "half of them: each layer all-reduces twice, after attention AND after the MLP")])
        mistakes = factor_of_2()
        if batch > 1:
            mistakes.append(Mistake(1 / batch, f"off by the batch ({batch}): every token of the step has its own "
                                               "hidden vector"))
        r.close(case + ": bytes of each", got[1], comm.message_bytes, unit="B", mistakes=mistakes)


KV_CASES = (("llama-3-70b", 8), ("llama-3-70b", 16), ("mistral-7b", 4), ("smollm2-135m", 2), ("smollm2-135m", 3),
            ("deepseek-v3", 8), ("qwen2.5-7b", 8), ("llama-3-8b", 1))


def check_kv_copies(fns, r) -> None:
    for model, tp in KV_CASES:
        s = model_shape(model)
        note = ""
        if not s.mla and tp <= s.kv_heads and s.kv_heads % tp:
            shares = [b - a for a, b in split_evenly(s.kv_heads, tp)]
            note = f": the chapter's TP engine splits them {' + '.join(map(str, shares))}"
        case = f"{model} ({'MLA' if s.mla else f'{s.kv_heads} KV heads'}) at TP{tp}{note}"
        got = r.call(fns.kv_copies, s.kv_heads, tp, bool(s.mla), case=case)
        expected = kv_replication(s, tp)
        wrong = {}
        if not s.mla and s.kv_heads % tp and tp < s.kv_heads:
            wrong["ceil(kv_heads / tp) heads on EVERY rank: the ranks hold whole heads but need not hold the "
                  "same number, so an uneven split copies nothing"] = tp * math.ceil(s.kv_heads / tp) / s.kv_heads
        if s.mla:
            hint = "an MLA latent is not split by heads: every rank caches all of it"
        elif tp > s.kv_heads:
            hint = "with more ranks than KV heads, each rank must hold one whole KV head: tp / kv_heads copies"
        else:
            hint = "up to one rank per KV head, the heads are split among the ranks and nothing is copied"
        r.close(case, got, expected, rel_tol=1e-9, unit="copies", hint=hint, wrong=wrong or None)


EXERCISES = [
    Exercise("ring_allreduce_s", "The all-reduce term", "implement",
             "Write the ring all-reduce time from the ranks, the message, the bus bandwidth and the "
             "latencies; checked against analysis.parallel on the catalog's interconnects.", check_ring),
    Exercise("tp_decode_allreduces", "A TP step's all-reduces", "predict",
             "Predict how many all-reduces a tensor-parallel decode step makes and how big each is; checked "
             "against analysis.parallel.tp_allreduces.", check_tp_allreduces),
    Exercise("kv_copies", "KV copies under tensor parallelism", "predict",
             "Predict how many copies of the KV cache a TP group holds; checked against "
             "analysis.parallel.kv_replication, which splits whole KV heads as the chapter's TP engine does "
             "(GQA, more ranks than KV heads, MLA).", check_kv_copies),
]


# ---------------------------------------------------------------------------------------------
# Build it: your split of a layer and your TP decoder layer, on 2 processes
#
# The check runs the chapter's TP runtime (parallel/runtime.py: 2 spawned worker processes joined
# by gloo) with your shard_layer() cutting the weights (shard_model's ``split``) and your
# tp_decoder_layer() as every worker's TPModel.layer_fn, and holds the tokens against transformers
# greedy and the all-reduces against 2 per layer per step. Starting two processes costs seconds,
# so two cheap checks come first, in this process: your split against the library's, tensor by
# tensor, and your layer 0 on two ranks simulated by two threads (their all-reduce sums the two
# threads' tensors), held against the unsplit layer. Where either finds the mistake, it names it
# and the processes are not started (a mismatched all-reduce could only crash or hang them).

TP_RANKS = 2
TP_TOL = 1e-4  # relative (L2) difference two fp32 results may have and still be "the same sum"
SIM_TIMEOUT_S = 60.0  # a simulated rank waiting this long at an all-reduce: its partner never came
FIELDS = ("qkv_proj", "qkv_bias", "o_proj", "gate_up_proj", "down_proj", "input_norm", "post_attention_norm")


@lru_cache(maxsize=1)
def _engine_model():
    """The engine's model over the embedded model's weights (shared, not copied)."""
    return tp_engine_model(build.loaded())


@dataclass(frozen=True)
class FileFunction:
    """A function named by its file and name: it pickles as those two strings and loads the file where
    it is first called, so a spawned TP worker can run a learner's layer from ``infer-lab check 14``."""

    path: str
    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = (self.path, self.name)
        if key not in _LOADED:
            from . import load_file

            _LOADED[key] = getattr(load_file(Path(self.path)), self.name)
        return _LOADED[key](*args, **kwargs)


_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}


def _names(code: Any) -> set[str]:
    """The global names a code object (and the functions and comprehensions inside it) may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


@dataclass(frozen=True)
class SourceFunction:
    """A function defined in a notebook cell, sent as its source (decorators left out) with the globals
    it reads: modules by name, other objects by pickle. A spawned TP worker rebuilds it from these."""

    source: str
    name: str
    modules: tuple[tuple[str, str], ...]  # (global name, module name)
    values: bytes  # the other globals it reads, pickled

    @classmethod
    def of(cls, fn: Any) -> SourceFunction | None:
        """``fn`` as source and globals, or None when it cannot travel that way (a closure, no source)."""
        try:
            if fn.__closure__:
                return None
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
            node = tree.body[0]
            if not isinstance(node, ast.FunctionDef):
                return None
            node.decorator_list = []
            modules, values = [], {}
            for name in sorted(_names(fn.__code__)):
                if name not in fn.__globals__:
                    continue  # a builtin, or an attribute name
                value = fn.__globals__[name]
                if isinstance(value, ModuleType):
                    modules.append((name, value.__name__))
                else:
                    values[name] = value
            return cls(ast.unparse(tree), node.name, tuple(modules), pickle.dumps(values))
        except Exception:
            return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = (self.source, self.name)
        if key not in _LOADED:
            namespace: dict[str, Any] = {"__name__": "infer_lab_cell"}
            namespace.update({name: importlib.import_module(module) for name, module in self.modules})
            namespace.update(pickle.loads(self.values))
            exec(compile(self.source, f"<your {self.name}>", "exec"), namespace)
            _LOADED[key] = namespace[self.name]
        return _LOADED[key](*args, **kwargs)


def _layer_for_workers(fns: Any) -> Any:
    """Your tp_decoder_layer() in a form the worker processes can load, or None."""
    path = getattr(fns, "__file__", None)
    if path and Path(path).is_file():
        return FileFunction(str(Path(path).resolve()), "tp_decoder_layer")
    fn = fns.tp_decoder_layer
    try:  # a function of an importable module pickles by reference; one of a notebook cell does not
        if fn.__module__ != "__main__" and pickle.loads(pickle.dumps(fn)) is fn:
            return fn
    except Exception:
        pass
    return SourceFunction.of(fn)


def _as_layer_weights(out: Any) -> LayerWeights:
    """Your split's result as the engine's LayerWeights, every tensor stored contiguously (as the library does)."""
    values = [getattr(out, f) for f in LayerWeights.__dataclass_fields__]  # any object with the fields
    return LayerWeights(*(v.contiguous() if torch.is_tensor(v) else v for v in values))


def _span(what: str, r: tuple[int, int]) -> str:
    return f"{what} {r[0]}" if r[1] - r[0] == 1 else f"{what}s {r[0]}-{r[1] - 1}"


def _split_expectation(field: str, plan: ShardPlan, share: RankShare) -> str:
    """What rank ``share.rank``'s slice of ``field`` is, in words, with the row or column numbers."""
    d, heads, kv = plan.head_dim, plan.heads, plan.kv_heads
    (qa, qb), (ka, kb), (ma, mb) = share.q_heads, share.kv_heads, share.mlp
    if field in ("qkv_proj", "qkv_bias"):
        k0, v0 = heads * d, (heads + kv) * d
        group = heads // kv
        return (f"column-parallel: the q rows {qa * d}-{qb * d - 1} of its {_span('query head', share.q_heads)} "
                f"(whole KV groups: the {group} query heads that read each of its KV heads), "
                f"then the k rows {k0 + ka * d}-{k0 + kb * d - 1} and the v rows {v0 + ka * d}-{v0 + kb * d - 1} of "
                f"its {_span('KV head', share.kv_heads)} (k starts after all {heads} x {d} q rows, v after all "
                f"{kv} x {d} k rows)")
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


def _parts(field: str, t: torch.Tensor, plan: ShardPlan, share: RankShare) -> list[tuple[str, torch.Tensor]]:
    """A rank's stacked slice cut back into its named blocks (q|k|v, gate|up)."""
    d = plan.head_dim
    if field in ("qkv_proj", "qkv_bias"):
        sizes = (share.n_heads * d, share.n_kv_heads * d, share.n_kv_heads * d)
        return list(zip(("q rows", "k rows", "v rows"), t.split(sizes), strict=True))
    if field == "gate_up_proj":
        return list(zip(("gate rows", "up rows"), t.split(share.n_mlp), strict=True))
    return [("values", t)]


def _split_problem(fns: Any, model: Any, plan: ShardPlan, layers: tuple[int, ...] = (0,)) -> str | None:
    """The first place where your split of ``layers`` differs from the library's, in words; None when none
    does. Layer 0 is enough here: the split is the same for every layer, and the 2-process run uses
    your split of all of them."""
    for share in plan.shares:
        for index in layers:
            w = model.layers[index]
            where = f"layer {index}, rank {share.rank}"
            try:
                out = fns.shard_layer(w, plan, share)
            except NotImplementedError:
                raise NotDoneYet("shard_layer() still raises NotImplementedError") from None
            except Exception as exc:
                return f"{where}: shard_layer() raised {type(exc).__name__}: {exc}"
            missing = [f for f in FIELDS if not hasattr(out, f)]
            if missing:
                return (f"{where}: shard_layer() returned {short_repr(out, 40)}, which has no {', '.join(missing)}: "
                        "return a LayerWeights with the same fields as w")
            want = shard_layer(w, plan, share)
            for field in FIELDS:
                got, exp = getattr(out, field), getattr(want, field)
                if exp is None or got is None:
                    if (exp is None) != (got is None):
                        return f"{where}: {field} is {short_repr(got, 40)}, expected {'None' if exp is None else 'a tensor'}"
                    continue
                if not torch.is_tensor(got):
                    return f"{where}: {field} is {short_repr(got, 40)}, not a tensor"
                rule = _split_expectation(field, plan, share)
                if tuple(got.shape) != tuple(exp.shape):
                    full = tuple(getattr(w, field).shape)
                    return (f"{where}: your {field} is {tuple(got.shape)}, expected {tuple(exp.shape)} (the full "
                            f"matrix is {full}, as (out_features, in_features)). Rank {share.rank} holds {rule}")
                if not torch.equal(got, exp):
                    blocks = [name for (name, g), (_, e) in zip(_parts(field, got, plan, share),
                                                                _parts(field, exp, plan, share), strict=True)
                              if not torch.equal(g, e)]
                    return (f"{where}: your {field} has the right shape {tuple(exp.shape)} but other numbers"
                            f"{' in its ' + ' and '.join(blocks) if blocks and blocks != ['values'] else ''}. "
                            f"Rank {share.rank} holds {rule}")
            del out, want
    return None


# -- layer 0 on two ranks simulated by two threads ------------------------------------------


class _PartnerGone(Exception):
    """A simulated rank waited at an all-reduce that the other rank never reached."""


class _ShapeMismatch(Exception):
    """The ranks all-reduced tensors of different shapes."""


class _SimulatedGroup:
    """Two ranks as threads of this process: a rendezvous per all-reduce, and a record of each call."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.cond = threading.Condition()
        self.arrived, self.generation, self.gone = 0, 0, False
        self.slots: list[torch.Tensor | None] = [None] * world_size
        self.inputs: list[list[torch.Tensor]] = [[] for _ in range(world_size)]  # per rank: what it sent
        self.sums: list[torch.Tensor] = []  # per call: the sum

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
                    raise _PartnerGone

    def leave(self) -> None:
        with self.cond:
            self.gone = True
            self.cond.notify_all()


class _SimulatedComm:
    """What the layer sees as ``comm``: all_reduce sums the threads' tensors in place (like the real one)."""

    def __init__(self, group: _SimulatedGroup, rank: int):
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        g = self.group
        g.inputs[self.rank].append(t.detach().clone())
        g.slots[self.rank] = t
        g.rendezvous()
        shapes = [tuple(s.shape) for s in g.slots]
        if len(set(shapes)) > 1:
            raise _ShapeMismatch(shapes)
        total = g.slots[0].detach().clone()
        for other in g.slots[1:]:
            total += other
        if self.rank == 0:
            g.sums.append(total.clone())
        g.rendezvous()  # everyone has read every slot before anyone writes its own
        with torch.no_grad():
            t.copy_(total)
        return t

    def barrier(self) -> None:
        self.group.rendezvous()


class _Recorder:
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


@lru_cache(maxsize=1)
def _layer_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer 0's input on a chat prompt: h (tokens, hidden) from the embedding, and RoPE's cos, sin."""
    model = _engine_model()
    ids = torch.tensor(build.chat_prompts()[1])
    cos, sin = rope_cos_sin(torch.arange(len(ids)), model.inv_freq, model.embed.dtype)
    return model.embed[ids].clone(), cos[:, None, :], sin[:, None, :]


def _attend(scale: float):
    """Causal attention of one sequence over this rank's heads (what the runtime's prefill hands a layer)."""

    def attend(q, k, v):
        qi, ki, vi = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        return causal_attention(qi, ki, vi, scale)[0].transpose(0, 1).flatten(1)

    return attend


def _mlp(full: Any, h: torch.Tensor) -> torch.Tensor:
    """The unsplit layer 0's MLP (post-attention norm, SiLU-gated, down) on ``h``."""
    w, eps = full.layers[0], full.shape.rms_norm_eps
    with torch.inference_mode():
        gate, up = F.linear(rms_norm(h, w.post_attention_norm, eps), w.gate_up_proj).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w.down_proj)


def _count_text(per_step: int, layers: int) -> str:
    """What a step's count of all-reduces means, for a message."""
    per_layer = per_step / layers
    shown = human(per_layer)
    seen = f"{per_step} all-reduces per step ({shown} per layer)"
    if per_step == 2 * layers:
        return seen
    if per_step == 0:
        why = ("nothing adds up the ranks' partial sums: the row-parallel matmuls (o, down) give each rank a "
               "partial sum of the full hidden vector")
    elif per_step == layers:
        why = "one partial sum per layer is never added up across the ranks"
    elif per_step < 2 * layers:
        why = "some layers leave a partial sum that is never added up across the ranks"
    else:
        why = ("an all-reduce too many: only a row-parallel matmul's output is a partial sum; q/k/v, the attention "
               "output and gate/up are this rank's own heads and columns, and h is already the same on every rank")
    return f"{seen}, expected 2 per layer ({2 * layers} per step): {why}"


def _layer_problem(fns: Any) -> tuple[str | None, str]:
    """(what is wrong with your layer 0 on two simulated ranks, or None; what was seen)."""
    model = _engine_model()
    layer0 = SimpleNamespace(**{k: getattr(model, k) for k in ("shape", "embed", "final_norm", "lm_head", "inv_freq")},
                             layers=model.layers[:1])  # the shards of layer 0 only: nothing else runs here
    (full,) = shard_model(layer0, 1)
    shards = shard_model(layer0, TP_RANKS)
    h0, cos, sin = _layer_inputs()
    attend, layers = _attend(model.shape.head_dim ** -0.5), model.shape.layers
    with torch.inference_mode():
        rec = _Recorder()
        ref_out = tp_decoder_layer(h0.clone(), full.layers[0], attend, cos, sin, full, rec)
    ref_sums = rec.inputs  # the unsplit layer's o output, then its down output
    befores = [h0, h0 + ref_sums[0]]  # h before each of them

    group = _SimulatedGroup(TP_RANKS)
    outs: list[Any] = [None] * TP_RANKS
    errors: list[BaseException | None] = [None] * TP_RANKS

    def rank_main(rank: int) -> None:
        try:
            with torch.inference_mode():
                s = shards[rank]
                outs[rank] = fns.tp_decoder_layer(h0.clone(), s.layers[0], attend, cos, sin, s,
                                                  _SimulatedComm(group, rank))
        except BaseException as exc:  # reported below, rank by rank
            errors[rank] = exc
        finally:
            group.leave()

    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in range(TP_RANKS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        group.leave()

    T, hidden = h0.shape
    calls = [len(x) for x in group.inputs]
    for rank, exc in enumerate(errors):
        if isinstance(exc, _ShapeMismatch):
            shapes = exc.args[0]
            i = calls[rank]
            return (f"all-reduce no. {i} got a {shapes[0]} tensor on rank 0 and a {shapes[1]} tensor on rank 1: the "
                    f"ranks must all-reduce tensors of one shape, a partial sum of the full ({T}, {hidden}) output; "
                    "q/k/v and the attention output are this rank's own heads (rank 0 has more of them), not "
                    "partial sums", "")
        if isinstance(exc, NotImplementedError):
            raise NotDoneYet("tp_decoder_layer() still raises NotImplementedError")
    real = [(rank, exc) for rank, exc in enumerate(errors) if exc is not None and not isinstance(exc, _PartnerGone)]
    if real:
        rank, exc = real[0]
        return f"your layer raised on rank {rank}: {type(exc).__name__}: {exc}", ""
    if calls[0] != calls[1] or any(isinstance(e, _PartnerGone) for e in errors):
        return (f"rank 0 made {calls[0]} all-reduce(s) and rank 1 made {calls[1]}: every rank must make the same "
                "all-reduces in the same order (each waits for the others)", "")
    n = calls[0]
    for rank, out in enumerate(outs):
        if not torch.is_tensor(out) or tuple(out.shape) != (T, hidden):
            return (f"rank {rank}'s layer returned {short_repr(out, 50) if not torch.is_tensor(out) else tuple(out.shape)}: "
                    f"return the new h, ({T}, {hidden})", "")
    sums = group.sums
    # match the calls to the unsplit layer's two partial sums, in order
    j, matched, bad = 0, [], None
    for i, s in enumerate(sums):
        if j < len(ref_sums) and _rel(s, ref_sums[j]) < TP_TOL:
            matched.append(i)
            j += 1
        elif j < len(ref_sums) and _rel(s, ref_sums[j] + TP_RANKS * befores[j]) < TP_TOL:
            what = "o (attention)" if j == 0 else "down (the MLP)"
            return (f"all-reduce no. {i + 1} summed h + the partial sum on every rank, after {what}: the residual h "
                    f"is counted {TP_RANKS} times (once per rank, the world size). Layer 0's output differs from the "
                    f"unsplit layer's by {human(_rel(outs[0], ref_out) * 100)}%", "")
        elif j == 1 and _rel(s, _mlp(full, ref_sums[0])) < TP_TOL:
            return ("all-reduce no. 1 sums the right partial sums, but the MLP then ran on that sum alone: the "
                    "residual h was not added to it (the unsplit layer's h + o(attention))", "")
        elif bad is None:
            bad = i
    if n != 2:
        text = _count_text(n * layers, layers)
        if n == 1:
            which = ("after down (the MLP's partial sums)" if matched == [0] else "after o (the attention's partial sums)")
            text += f"; the one missing is {which}"
        elif n > 2 and bad is not None:
            text += f"; the extra one is no. {bad + 1}, a {tuple(group.inputs[0][bad].shape)} tensor"
        return text + f". Layer 0's output differs from the unsplit layer's by {human(_rel(outs[0], ref_out) * 100)}%", ""
    if bad is not None:
        want = "o (attention)" if j == 0 else "down (the MLP)"
        got, ref = tuple(sums[bad].shape), tuple(ref_sums[j].shape)
        off = (f"a {got} tensor; the partial sums to add are the {ref} output of {want}, a row-parallel matmul"
               if got != ref else f"a {got} tensor that is not the full layer's {want} output (off by "
               f"{human(_rel(sums[bad], ref_sums[j]) * 100)}%): all-reduce the row-parallel matmul's output itself")
        return f"all-reduce no. {bad + 1} sums {off}", ""
    if _rel(outs[1], outs[0]) > 0:
        return ("the two ranks end the layer with different h: every rank must continue from the same full h "
                "(the all-reduced sums, not its own partial ones)", "")
    diff = _rel(outs[0], ref_out)
    if diff > TP_TOL:
        return (f"both all-reduces sum the right partial sums, but layer 0's output differs from the unsplit "
                f"layer's by {human(diff * 100)}%: add each sum to the residual h, as the unsplit layer does", "")
    return None, f"2 all-reduces, output equal to the unsplit layer's (relative difference {human(diff)})"


def _run_problem(run: Any, layers: int) -> str | None:
    """The real run's all-reduce count, step by step and rank by rank; None when every step made 2 per layer."""
    for rank in run.ranks:
        for s in rank.steps:
            if s.allreduce_calls != 2 * layers:
                return f"rank {rank.rank}, step {s.step} ({s.phase}): {_count_text(s.allreduce_calls, layers)}"
    return None


def _agreement(run: Any, prompts: Any) -> tuple[bool, str]:
    """Whether every rank picked rank 0's tokens; where the first one parted, in words."""
    for other in run.ranks[1:]:
        for i, (a, b) in enumerate(zip(run.ranks[0].token_ids, other.token_ids, strict=True)):
            if a != b:
                j = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                return False, (f"rank {other.rank} parted from rank 0 at output position {j} of prompt "
                               f"{build.describe(prompts[i])}: every rank must end each layer with the same full h")
    return True, f"{len(run.ranks)} ranks, the same {sum(map(len, run.token_ids))} tokens"


def check_tp_engine(fns, r) -> None:
    model = _engine_model()
    plan = plan_shards(model.shape, TP_RANKS)
    r.call(fns.shard_layer, model.layers[0], plan, plan.shares[0], case="setup")
    h0, cos, sin = _layer_inputs()
    (full,) = shard_model(model, 1)
    with torch.inference_mode():
        r.call(fns.tp_decoder_layer, h0.clone(), full.layers[0], _attend(model.shape.head_dim ** -0.5), cos, sin,
               full, _Recorder(), case="setup")

    split = _split_problem(fns, model, plan)
    r.record(f"your shard_layer() of layer 0 on {TP_RANKS} ranks, against the library's "
             f"split ({plan.describe()})", split is None, split or "every tensor identical")
    layer, seen = _layer_problem(fns)
    r.record(f"your tp_decoder_layer(), layer 0 on {TP_RANKS} ranks simulated by two threads of this process, "
             f"against the unsplit layer ({len(h0)} prompt tokens)", layer is None, layer or seen)
    if split or layer:
        r.record(f"tensor parallelism on {TP_RANKS} processes", False,
                 "not started: the processes start once the two cases above pass")
        return

    worker_layer = _layer_for_workers(fns)
    if worker_layer is None:
        r.record(f"tensor parallelism on {TP_RANKS} processes", False,
                 "your tp_decoder_layer() runs in worker processes, which rebuild it from its source and the "
                 "globals it reads; this one cannot travel so (a closure, or a global that does not pickle): put "
                 "it in a file and run `infer-lab check 14 --only tp_engine`")
        return
    prompts = build.chat_prompts()[:2]
    case = (f"tensor parallelism on {TP_RANKS} processes (gloo) with your split and your layer: {len(prompts)} chat "
            f"prompts, {build.NEW_TOKENS} greedy tokens each, against transformers greedy")
    expected = build.reference(prompts)
    run, crash = None, None
    try:
        with TPGroup(model, world_size=TP_RANKS, backend="gloo", timeout_s=120.0,
                     split=lambda w, p, s: _as_layer_weights(fns.shard_layer(w, p, s)), layer=worker_layer) as group:
            run = group.generate([list(p) for p in prompts], build.NEW_TOKENS, warmup=False,
                                 require_agreement=False)
    except RuntimeError as exc:
        crash = str(exc).strip().splitlines()[-1]
    steps = len(run.steps) if run else 0
    outputs = run.token_ids if run else [[] for _ in prompts]
    engine_run = build.EngineRun(None, prompts, outputs, [None] * len(prompts), steps, run is not None, crash)
    problem = _run_problem(run, model.shape.layers) if run else None
    build.compare(r, case, engine_run, expected, hint=problem or "")
    if run is None:
        return
    r.record("invariant: both ranks picked the same tokens", *_agreement(run, prompts))
    r.record(f"invariant: 2 x {model.shape.layers} layers = {2 * model.shape.layers} all-reduces in every step, on "
             "every rank", problem is None,
             problem or f"{run.allreduce_count} all-reduces in {len(run.steps)} steps "
                        f"({human(run.allreduce_bytes)} B on rank 0)")


EXERCISES.append(
    Exercise("tp_engine", "A tensor-parallel layer on 2 processes", "build",
             "Your shard_layer() splits each layer's weights over 2 ranks (q/k/v and gate/up by output rows, whole "
             "KV groups per rank; o and down by input columns) and your tp_decoder_layer() runs one rank's layer, "
             "all-reducing where a rank holds a partial sum; checked by running the chapter's tensor-parallel "
             "runtime on 2 processes with both, token for token against transformers, with 2 all-reduces per "
             "layer in every step. TP is not part of the single-process serving engine, so the capstone "
             "(infer-lab serve --my-parts) does not use it.", check_tp_engine,
             functions=("shard_layer", "tp_decoder_layer"),
             symbol="src/infer_lab/parallel/shard.py::shard_model(split=shard_layer), "
                    "src/infer_lab/parallel/layers.py::TPModel.layer_fn",
             timeout_s=build.BUILD_TIMEOUT_S))
