"""Roofline predictions for prefill and decode: FLOPs and bytes per op, and the time they imply.

A step is a list of ops (projections, attention, MLP, LM head), each summed over all layers.
Each op takes ``max(FLOPs / peak, bytes / bandwidth)`` seconds on a :class:`Roof`; the step takes
the sum. The roof is either a datasheet (optionally derated by efficiency factors) or the
ceilings measured on this machine by :func:`infer_lab.hardware.measure_ceilings`.

Assumptions, stated once: weights are read from memory once per step; attention is a fused
kernel (scores never written to memory) that reads the cached K/V once per step.

Tensor parallelism over N GPUs (``gpu_roof(..., n_gpus=N)``): every op's FLOPs and bytes are
split evenly across the N ranks (the roof's ceilings are N times one GPU's, so each op takes
1/N of its one-GPU time), except the K/V cache when there are fewer KV heads than ranks (or
an MLA latent): those heads are replicated, and so are their reads. On top of that the step
pays 2 x layers ring all-reduces of (tokens in the step x hidden x activation bytes) on the
GPU's interconnect (:func:`infer_lab.analysis.collectives.ring_allreduce_s`), not overlapped with
compute. The vocab-parallel LM head's logit gather is not counted. So N GPUs are never N times
faster: see :mod:`infer_lab.analysis.parallel` for pipeline and data parallelism.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..catalog import get_gpu, get_interconnect
from ..units import require_positive
from .collectives import kv_replication, tp_allreduces
from .memory import (
    ModelLike,
    as_shape,
    kv_bytes_per_element,
    kv_bytes_per_token_per_layer,
    weight_format,
)
from .params import ModelShape, attention_params_per_layer, gated_mlp_params

CROSS_SERVER_LINK = "infiniband-ndr400"


@dataclass(frozen=True)
class Roof:
    """A device's two ceilings: ``peak_flops`` (FLOP/s) and ``bandwidth_Bps`` (bytes/s).

    For a tensor-parallel group, ``tp`` > 1, the ceilings are the group's (N times one GPU's)
    and ``link`` is the interconnect its all-reduces run on.
    """

    name: str
    peak_flops: float
    bandwidth_Bps: float
    source: str = "datasheet"
    tp: int = 1
    link: Any = None  # an infer_lab.catalog.InterconnectSpec when tp > 1

    @property
    def ridge_point(self) -> float:
        """FLOP per byte where a kernel stops being memory-bound and becomes compute-bound."""
        return self.peak_flops / self.bandwidth_Bps

    def time_s(self, flops: float, n_bytes: float) -> float:
        """Roofline time of one op: the slower of computing and moving its bytes."""
        return max(flops / self.peak_flops, n_bytes / self.bandwidth_Bps)

    def attainable_flops(self, intensity: float) -> float:
        """FLOP/s the roof allows at an arithmetic intensity (FLOP/B)."""
        return min(self.peak_flops, intensity * self.bandwidth_Bps)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ridge_point"] = self.ridge_point
        d["link"] = self.link.name if self.link is not None else None
        return d


def gpu_roof(
    gpu: str,
    dtype: str = "bf16",
    n_gpus: int = 1,
    flops_efficiency: float = 1.0,
    bandwidth_efficiency: float = 1.0,
    link: str | Any | None = None,
) -> Roof:
    """The datasheet roof of one catalog GPU, or of a tensor-parallel group of ``n_gpus``.

    Efficiencies in (0, 1] derate the peaks. ``link`` (a catalog interconnect key or spec)
    overrides the GPU's own scale-up link. A group larger than that link joins (8 GPUs for an
    HGX board) is modelled as one ring over ``CROSS_SERVER_LINK``, the network between servers.
    """
    require_positive("n_gpus", n_gpus)
    for name, value in (
        ("flops_efficiency", flops_efficiency),
        ("bandwidth_efficiency", bandwidth_efficiency),
    ):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    spec = get_gpu(gpu)
    label = spec.name if n_gpus == 1 else f"{n_gpus}x {spec.name} (TP{n_gpus})"
    source = (
        "datasheet" if flops_efficiency == bandwidth_efficiency == 1 else "datasheet x efficiency"
    )
    if isinstance(link, str):
        link = get_interconnect(link)
    if link is None and n_gpus > spec.link().max_group:
        # TP beyond one server: the ring crosses the network, whose hops set its pace
        link = get_interconnect(CROSS_SERVER_LINK)
    return Roof(
        label,
        spec.peak_flops(dtype) * n_gpus * flops_efficiency,
        spec.bandwidth_Bps * n_gpus * bandwidth_efficiency,
        source,
        tp=n_gpus,
        link=(link or spec.link()) if n_gpus > 1 else None,
    )


def measured_roof(ceilings: Any) -> Roof:
    """The roof from :class:`infer_lab.hardware.Ceilings` measured on this machine."""
    return Roof(
        f"{ceilings.device_name} (measured)",
        ceilings.matmul_flops,
        ceilings.bandwidth_Bps,
        "measured",
    )


# ---------------------------------------------------------------------------------------------
# Ops


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes of one op summed over all layers for one step (a prefill or a decode step)."""

    name: str
    flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    activation_bytes: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.activation_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte moved."""
        return self.flops / self.bytes if self.bytes else math.inf

    def row(self, roof: Roof | None = None) -> dict[str, Any]:
        d = asdict(self)
        d.update(bytes=self.bytes, intensity=self.intensity)
        if roof is not None:
            t = roof.time_s(self.flops, self.bytes)
            d.update(
                time_s=t,
                bound="compute"
                if self.flops / roof.peak_flops >= self.bytes / roof.bandwidth_Bps
                else "memory",
            )
        return d


def _attended_pairs(past: int, q_tokens: int, window: int | None) -> int:
    """Query-key pairs for ``q_tokens`` new tokens after ``past`` cached ones (causal, windowed).

    The query at position p attends positions 0..p, so a prefill of n tokens counts
    n(n+1)/2 pairs, about half of the full n^2 square.
    """
    if window is None:
        first, last = past + 1, past + q_tokens
        return (first + last) * q_tokens // 2
    return sum(min(p + 1, window) for p in range(past, past + q_tokens))


def _linear(
    name: str,
    params: int,
    tokens: int,
    in_dim: int,
    out_dim: int,
    layers: int,
    wfmt,
    act_b: int,
    weight_params: int | None = None,
) -> OpCost:
    read = params if weight_params is None else weight_params
    return OpCost(
        name,
        flops=2.0 * tokens * params,
        weight_bytes=float(wfmt.bytes_for(read)),
        kv_read_bytes=0.0,
        kv_write_bytes=0.0,
        activation_bytes=float(layers * tokens * (in_dim + out_dim) * act_b),
    )


def step_ops(
    model: ModelLike,
    batch: int,
    q_tokens: int,
    past: int = 0,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    act_dtype: str = "bf16",
    logits: str = "last",
) -> list[OpCost]:
    """FLOPs and bytes per op for one forward pass of ``batch`` sequences.

    Each sequence has ``past`` tokens cached and feeds ``q_tokens`` new ones: a prefill is
    ``past=0, q_tokens=prompt``; a decode step is ``past=context-1, q_tokens=1``. ``logits`` is
    ``"last"`` (only the next-token logits, as servers do) or ``"all"`` (every position, as a
    plain ``model(ids)`` call does).
    """
    require_positive("batch", batch)
    require_positive("q_tokens", q_tokens)
    require_positive("past", past, allow_zero=True)
    if logits not in ("last", "all"):
        raise ValueError(f"logits must be 'last' or 'all', got {logits!r}")
    shape: ModelShape = as_shape(model)
    wfmt = weight_format(weight_dtype)
    act_b = kv_bytes_per_element(act_dtype)
    tokens = batch * q_tokens
    h, L = shape.hidden, shape.layers
    ops: list[OpCost] = []

    attn_params = L * attention_params_per_layer(shape)
    if shape.mla:
        m = shape.mla
        o_params = L * shape.heads * m.v_head_dim * h
        ops.append(
            _linear(
                "q/kv projections (MLA)",
                attn_params - o_params,
                tokens,
                h,
                shape.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) + m.kv_lora_rank,
                L,
                wfmt,
                act_b,
            )
        )
        ops.append(
            _linear("o projection", o_params, tokens, shape.heads * m.v_head_dim, h, L, wfmt, act_b)
        )
        score_dim, value_dim = m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank
        q_width = shape.heads * score_dim
    else:
        q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        o_params = L * q_out * h
        ops.append(
            _linear(
                "q/k/v projections",
                attn_params - o_params,
                tokens,
                h,
                q_out + 2 * kv_out,
                L,
                wfmt,
                act_b,
            )
        )
        ops.append(_linear("o projection", o_params, tokens, q_out, h, L, wfmt, act_b))
        score_dim = value_dim = shape.head_dim
        q_width = q_out

    kv_layer = kv_bytes_per_token_per_layer(shape, kv_dtype)
    pairs = kv_read = kv_write = 0
    for window in shape.layer_windows:
        pairs += _attended_pairs(past, q_tokens, window)
        cached_after = past + q_tokens if window is None else min(past + q_tokens, window)
        kv_read += cached_after * kv_layer
        kv_write += q_tokens * kv_layer
    ops.insert(
        1,
        OpCost(
            "attention (scores + weighted sum)",
            flops=2.0 * batch * pairs * shape.heads * (score_dim + value_dim),
            weight_bytes=0.0,
            kv_read_bytes=float(batch * kv_read),
            kv_write_bytes=float(batch * kv_write),
            activation_bytes=float(L * tokens * 2 * q_width * act_b),
        ),
    )

    n_moe = sum(shape.is_moe_layer(i) for i in range(L))
    n_dense = L - n_moe
    if n_dense:
        ops.append(
            _linear(
                "MLP (dense)",
                n_dense * gated_mlp_params(h, shape.intermediate, shape.mlp_bias),
                tokens,
                h,
                3 * shape.intermediate,
                n_dense,
                wfmt,
                act_b,
            )
        )
    if shape.moe:
        e = shape.moe
        per_expert = gated_mlp_params(h, e.expert_intermediate, e.expert_bias)
        ops.append(
            _linear(
                "MoE router", n_moe * e.n_experts * h, tokens, h, e.n_experts, n_moe, wfmt, act_b
            )
        )
        # Each token picks k of n experts; with uniform routing a batch of T tokens touches
        # n * (1 - (1 - k/n)^T) distinct experts, and only those are read from memory.
        touched = e.n_experts * (1.0 - (1.0 - e.active_experts / e.n_experts) ** tokens)
        ops.append(
            _linear(
                "MoE experts",
                n_moe * e.active_experts * per_expert,
                tokens,
                h,
                3 * e.expert_intermediate * e.active_experts,
                n_moe,
                wfmt,
                act_b,
                weight_params=round(n_moe * touched * per_expert),
            )
        )
        if e.n_shared_experts:
            inner = e.expert_intermediate * e.n_shared_experts
            ops.append(
                _linear(
                    "MoE shared experts",
                    n_moe * gated_mlp_params(h, inner),
                    tokens,
                    h,
                    3 * inner,
                    n_moe,
                    wfmt,
                    act_b,
                )
            )

    logit_tokens = tokens if logits == "all" else batch
    head = weight_format("bf16") if wfmt.bits < 16 else wfmt
    ops.append(
        OpCost(
            "LM head",
            flops=2.0 * logit_tokens * shape.vocab * h,
            weight_bytes=float(head.bytes_for(shape.vocab * h)),
            kv_read_bytes=0.0,
            kv_write_bytes=0.0,
            activation_bytes=float(logit_tokens * (h * act_b + shape.vocab * 4)),
        )
    )
    return ops


def prefill_ops(model: ModelLike, batch: int, prompt_tokens: int, **kwargs: Any) -> list[OpCost]:
    """Ops of a prefill: ``batch`` prompts of ``prompt_tokens`` tokens, empty cache."""
    return step_ops(model, batch, prompt_tokens, past=0, **kwargs)


def decode_ops(model: ModelLike, batch: int, context: int, **kwargs: Any) -> list[OpCost]:
    """Ops of one decode step: ``batch`` sequences each attending ``context`` tokens (the new one included)."""
    require_positive("context", context)
    return step_ops(model, batch, 1, past=context - 1, **kwargs)


# ---------------------------------------------------------------------------------------------
# Step predictions


@dataclass(frozen=True)
class StepPrediction:
    """A step on a roof. ``time_s`` sums per-op roofline times plus the tensor-parallel
    all-reduces; ``whole_step_time_s`` is the bound from the step's total FLOPs and bytes (what
    you get if every op overlapped perfectly), plus the same all-reduces.

    ``compute_s`` is the per-op part alone; ``allreduce_s`` is ``allreduce_count`` ring
    all-reduces of ``allreduce_bytes`` each (0 on one GPU).
    """

    phase: str
    batch: int
    tokens: int
    flops: float
    bytes: float
    time_s: float
    whole_step_time_s: float
    roof: Roof
    compute_s: float = 0.0
    allreduce_s: float = 0.0
    allreduce_count: int = 0
    allreduce_bytes: int = 0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def bound(self) -> str:
        return "compute" if self.intensity >= self.roof.ridge_point else "memory"

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "batch": self.batch,
            "tokens": self.tokens,
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": self.intensity,
            "time_s": self.time_s,
            "whole_step_time_s": self.whole_step_time_s,
            "bound": self.bound,
            "roof": self.roof.name,
            "ridge_point": self.roof.ridge_point,
            "tp": self.roof.tp,
            "compute_s": self.compute_s,
            "allreduce_s": self.allreduce_s,
            "allreduce_count": self.allreduce_count,
            "allreduce_bytes": self.allreduce_bytes,
        }


def predict_step(
    ops: list[OpCost],
    roof: Roof,
    phase: str,
    batch: int,
    tokens: int,
    allreduce: tuple[int, int, float] = (0, 0, 0.0),
) -> StepPrediction:
    """Sum a step's ops on a roof; ``allreduce`` is (count, bytes each, seconds in all)."""
    flops = sum(o.flops for o in ops)
    nbytes = sum(o.bytes for o in ops)
    count, each, comm_s = allreduce
    compute = sum(roof.time_s(o.flops, o.bytes) for o in ops)
    return StepPrediction(
        phase,
        batch,
        tokens,
        flops,
        nbytes,
        compute + comm_s,
        roof.time_s(flops, nbytes) + comm_s,
        roof,
        compute_s=compute,
        allreduce_s=comm_s,
        allreduce_count=count,
        allreduce_bytes=each,
    )


def shard_ops(ops: list[OpCost], shape: ModelShape, tp: int) -> list[OpCost]:
    """The ops of a step as a TP group of ``tp`` runs them, summed over its ranks.

    Everything splits evenly except the K/V reads and writes of replicated KV heads
    (:func:`infer_lab.analysis.collectives.kv_replication`).
    """
    factor = kv_replication(shape, tp)
    if factor == 1:
        return ops
    return [
        replace(o, kv_read_bytes=o.kv_read_bytes * factor, kv_write_bytes=o.kv_write_bytes * factor)
        if o.kv_read_bytes or o.kv_write_bytes
        else o
        for o in ops
    ]


def _tp_step(
    shape: ModelShape,
    ops: list[OpCost],
    roof: Roof,
    phase: str,
    batch: int,
    tokens: int,
    act_dtype: str,
) -> StepPrediction:
    if roof.tp <= 1:
        return predict_step(ops, roof, phase, batch, tokens)
    comm = tp_allreduces(shape, roof.tp, tokens, roof.link, act_dtype)
    return predict_step(
        shard_ops(ops, shape, roof.tp),
        roof,
        phase,
        batch,
        tokens,
        (comm.count, comm.message_bytes, comm.total_s),
    )


def predict_prefill(
    model: ModelLike, roof: Roof, batch: int, prompt_tokens: int, **kwargs: Any
) -> StepPrediction:
    """Predicted prefill (the TTFT of ``batch`` prompts arriving together)."""
    shape = as_shape(model)
    ops = prefill_ops(shape, batch, prompt_tokens, **kwargs)
    act = kwargs.get("act_dtype", "bf16")
    return _tp_step(shape, ops, roof, "prefill", batch, batch * prompt_tokens, act)


def predict_decode(
    model: ModelLike, roof: Roof, batch: int, context: int, **kwargs: Any
) -> StepPrediction:
    """Predicted decode step (the ITL) for ``batch`` sequences at ``context`` tokens."""
    shape = as_shape(model)
    ops = decode_ops(shape, batch, context, **kwargs)
    return _tp_step(shape, ops, roof, "decode", batch, batch, kwargs.get("act_dtype", "bf16"))


def critical_batch(
    model: ModelLike, roof: Roof, context: int, max_batch: int = 1 << 16, **kwargs: Any
) -> int | None:
    """Smallest decode batch whose whole step is compute-bound at ``context``; None if none up to ``max_batch``.

    Every sequence adds its own KV reads, whose intensity stays low, so at long contexts decode
    may never become compute-bound: the answer is then ``None``.
    """

    shape = as_shape(model)

    def compute_bound(b: int) -> bool:
        step = predict_decode(shape, roof, b, context, **kwargs)
        return step.flops / roof.peak_flops >= step.bytes / roof.bandwidth_Bps

    return smallest_true(compute_bound, max_batch)


@dataclass(frozen=True)
class Prediction:
    """Serving numbers predicted by the roofline. Times in seconds."""

    model: str
    roof: Roof
    batch: int
    prompt_tokens: int
    context: int
    ttft_s: float
    itl_s: float
    tokens_per_s: float
    tokens_per_s_per_user: float
    critical_batch: int | None
    prefill: StepPrediction
    decode: StepPrediction

    @property
    def parallelism(self) -> str:
        """``'TP1'`` on one GPU, ``'TP4'`` for a tensor-parallel group of four."""
        return f"TP{self.roof.tp}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.roof.name,
            "roof_source": self.roof.source,
            "parallelism": self.parallelism,
            "tp": self.roof.tp,
            "interconnect": self.roof.link.name if self.roof.link is not None else None,
            "allreduce_ms_per_step": self.decode.allreduce_s * 1e3,
            "prefill_allreduce_ms": self.prefill.allreduce_s * 1e3,
            "peak_flops": self.roof.peak_flops,
            "bandwidth_Bps": self.roof.bandwidth_Bps,
            "ridge_point": self.roof.ridge_point,
            "batch": self.batch,
            "prompt_tokens": self.prompt_tokens,
            "context": self.context,
            "ttft_ms": self.ttft_s * 1e3,
            "itl_ms": self.itl_s * 1e3,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_user": self.tokens_per_s_per_user,
            "critical_batch": self.critical_batch,
            "prefill": self.prefill.as_dict(),
            "decode": self.decode.as_dict(),
        }


def predict(
    model: ModelLike,
    roof: Roof,
    batch: int = 1,
    context: int = 4096,
    prompt_tokens: int | None = None,
    **kwargs: Any,
) -> Prediction:
    """TTFT (one prompt of ``prompt_tokens``, default ``context``), ITL and tokens/s at ``batch`` x ``context``."""
    shape = as_shape(model)
    prompt_tokens = context if prompt_tokens is None else prompt_tokens
    pre = predict_prefill(shape, roof, 1, prompt_tokens, **kwargs)
    dec = predict_decode(shape, roof, batch, context, **kwargs)
    return Prediction(
        model=shape.name,
        roof=roof,
        batch=batch,
        prompt_tokens=prompt_tokens,
        context=context,
        ttft_s=pre.time_s,
        itl_s=dec.time_s,
        tokens_per_s=batch / dec.time_s,
        tokens_per_s_per_user=1 / dec.time_s,
        critical_batch=critical_batch(shape, roof, context, **kwargs),
        prefill=pre,
        decode=dec,
    )


def smallest_true(condition: Callable[[int], bool], largest: int) -> int | None:
    """The smallest n in 1..``largest`` for which ``condition(n)`` holds, for a condition that stays
    true once it turns true (a bisection, about log2(largest) calls); None when even ``largest`` fails."""
    if not condition(largest):
        return None
    lo, hi = 1, largest
    while lo < hi:
        mid = (lo + hi) // 2
        if condition(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
