"""Beyond one GPU: what tensor, pipeline and data parallelism cost, from the interconnect up.

**Ring all-reduce.** N ranks each hold S bytes and all end with their sum. The ring does it in
2(N-1) steps (N-1 reduce-scatter, N-1 all-gather); in each step every rank sends S/N bytes to
its neighbour while receiving S/N from the other one. So

    t(N, S) = t_base + 2(N-1) * t_hop + 2(N-1)/N * S / B_bus

``B_bus`` is the *bus bandwidth* in one direction per GPU (nccl-tests' "busbw"): because a rank
sends and receives at once, the per-direction link bandwidth is its ceiling, never the
bidirectional headline (H100 SXM: 450 GB/s per direction, not 900). ``t_hop`` is the latency of
one step and ``t_base`` the fixed cost of launching the collective. All three come from the
catalog (``infer_lab.catalog.get_interconnect``) with their sources: measured nccl-tests busbw
where one is on file, NCCL's own cost-model latencies.

**Tensor parallelism** (TP = N): every layer's matmuls are split across N GPUs, and each layer
pays two all-reduces of (tokens in the step x hidden x activation bytes), after attention and
after the MLP. :func:`infer_lab.analysis.roofline.predict_decode` on ``gpu_roof(gpu, n_gpus=N)``
adds them to the compute and memory time divided across ranks. Decode messages are small
(16 users x 8192 x 2 B = 262 kB), so the latency term dominates and does not shrink with N:
that is why 4x the GPUs gives clearly less than 4x the speed.

**Pipeline parallelism** (PP = S): layers are cut into S stages; activations cross each stage
boundary point to point. A decode step is cut into micro-batches so all stages stay busy; with
fewer micro-batches than stages the rest of the pipe idles (the bubble). PP adds memory, not
speed: every micro-batch re-reads its stage's weights.

**Data parallelism** (DP = R): R independent replicas behind a load balancer. No
communication per token; each replica needs the whole model (or its own TP/PP group).

:func:`parallelism_frontier` puts layouts side by side as per-user speed vs throughput per GPU,
with energy per token (TDP) and $ per million tokens. :func:`fast_mode` reads the talk's
trade-off off that frontier.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..catalog import get_gpu
from ..units import require_positive
from .collectives import (  # noqa: F401 (re-exported: the collectives' names stay importable from here)
    AllReduceCost,
    TPComm,
    _link,
    allreduce_cost,
    fit_allreduce,
    kv_replication,
    p2p_transfer_s,
    ring_allreduce_s,
    tp_allreduces,
)
from .memory import as_shape, fit, kv_bytes_per_element
from .roofline import decode_ops, gpu_roof, predict_decode, predict_prefill

# ---------------------------------------------------------------------------------------------
# Layouts: TP x PP x DP


@dataclass(frozen=True)
class Layout:
    """How ``n_gpus = tp x pp x dp`` GPUs serve one model: a TP group per pipeline stage,
    ``pp`` stages per replica, ``dp`` replicas."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self):
        for name in ("tp", "pp", "dp"):
            require_positive(name, getattr(self, name))

    @property
    def n_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def label(self) -> str:
        """``'TP4'``, ``'TP2 x DP2'``, ``'DP4'``, ``'TP4 x PP2'``."""
        parts = []
        if self.tp > 1 or (self.pp == 1 and self.dp == 1):
            parts.append(f"TP{self.tp}")
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        if self.dp > 1:
            parts.append(f"DP{self.dp}")
        return " x ".join(parts)

    @classmethod
    def parse(cls, text: str) -> Layout:
        """``'tp4'``, ``'tp2xdp2'``, ``'TP2 x DP2'``, ``'dp8'``, ``'tp4xpp2'`` -> a Layout."""
        sizes = {"tp": 1, "pp": 1, "dp": 1}
        cleaned = text.lower().replace(" ", "")
        parts = [p for p in re.split(r"[x*,]", cleaned) if p]
        if not parts:
            raise ValueError(f"empty parallelism {text!r}; use e.g. tp4, tp2xdp2, dp4, tp4xpp2")
        for part in parts:
            m = re.fullmatch(r"(tp|pp|dp)(\d+)", part)
            if not m:
                raise ValueError(
                    f"cannot read parallelism {text!r}: expected parts like tp4, pp2, dp2 joined by 'x'"
                )
            sizes[m.group(1)] = int(m.group(2))
        return cls(**sizes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "n_gpus": self.n_gpus,
            "label": self.label,
        }


def layouts_for(n_gpus: int, max_tp: int = 8, pipeline: bool = False) -> list[Layout]:
    """Every TP x DP split of ``n_gpus`` (TP a power of two up to ``max_tp``), TP-heaviest first;
    with ``pipeline`` also TP x PP splits whose TP group fills ``max_tp``."""
    require_positive("n_gpus", n_gpus)
    out = []
    tp = 1
    while tp <= min(n_gpus, max_tp):
        if n_gpus % tp == 0:
            out.append(Layout(tp=tp, dp=n_gpus // tp))
        tp *= 2
    if pipeline and n_gpus > max_tp and n_gpus % max_tp == 0:
        out.append(Layout(tp=max_tp, pp=n_gpus // max_tp))
    return sorted(out, key=lambda lay: (-lay.tp * lay.pp, lay.dp))


@dataclass(frozen=True)
class LayoutStep:
    """One phase on one layout. Times in seconds; ``batch`` is per replica.

    ``time_s`` is what one sequence waits: the ITL of a decode step, the TTFT-compute of a
    prefill. ``compute_s`` is the roofline time of the ops, ``allreduce_s`` the TP all-reduces
    and ``transfer_s`` the pipeline's stage-to-stage sends of one pass through every stage (with
    PP, ``time_s`` is a whole round and can exceed their sum: the bottleneck stage serves every
    micro-batch in turn). ``bubble_fraction`` is the share of time stages sit idle (0 without PP).
    """

    layout: Layout
    phase: str
    batch: int
    tokens: int
    time_s: float
    compute_s: float
    allreduce_s: float
    transfer_s: float
    bubble_fraction: float
    allreduce_count: int
    allreduce_bytes: int
    micro_batches: int = 1

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second over all replicas (decode: output tokens; prefill: prompt tokens)."""
        return self.layout.dp * self.tokens / self.time_s

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layout"] = self.layout.label
        d.update(
            tp=self.layout.tp, pp=self.layout.pp, dp=self.layout.dp, tokens_per_s=self.tokens_per_s
        )
        return d


def _head_time(shape, roof, batch: int, **kwargs) -> float:
    """Roofline time of the LM head alone for ``batch`` sampled positions."""
    ops = decode_ops(shape, batch, 1, **kwargs)
    head = next(o for o in ops if o.name == "LM head")
    return roof.time_s(head.flops, head.bytes)


def predict_layout_decode(
    model: Any,
    gpu: str,
    layout: Layout,
    batch: int,
    context: int,
    micro_batches: int | None = None,
    link: Any = None,
    stage_link: Any = None,
    dtype: str = "bf16",
    flops_efficiency: float = 1.0,
    bandwidth_efficiency: float = 1.0,
    **kwargs: Any,
) -> LayoutStep:
    """A decode step of ``batch`` sequences per replica at ``context`` tokens on ``layout``.

    With PP the batch is cut into ``micro_batches`` (default: one per stage, fewer if the batch
    is smaller). A sequence gets a token once per round: ``max(S x (t_stage + t_send),
    m x t_stage)``; stages are idle for the rest (the bubble). ``stage_link`` carries the
    activations between stages (default: the GPU's own link; pass ``"infiniband-ndr400"`` for
    stages on different servers).
    """
    require_positive("batch", batch)
    shape = as_shape(model)
    roof = gpu_roof(gpu, dtype, layout.tp, flops_efficiency, bandwidth_efficiency, link=link)
    if layout.pp == 1:
        step = predict_decode(shape, roof, batch, context, **kwargs)
        return LayoutStep(
            layout,
            "decode",
            batch,
            batch,
            step.time_s,
            step.compute_s,
            step.allreduce_s,
            0.0,
            0.0,
            step.allreduce_count,
            step.allreduce_bytes,
        )
    stages = layout.pp
    if stages > shape.layers:
        raise ValueError(f"{stages} pipeline stages for {shape.layers} layers")
    m = micro_batches or min(stages, batch)
    micro = math.ceil(batch / m)
    step = predict_decode(shape, roof, micro, context, **kwargs)
    head = _head_time(shape, roof, micro, **kwargs)
    stage_s = (step.compute_s - head + step.allreduce_s) / stages + head  # the last stage, slowest
    send = _stage_send_s(shape, gpu, micro, stage_link or link, kwargs.get("act_dtype", "bf16"))
    cycle = stages * (
        stage_s + send
    )  # through every stage, and the sampled token back to the first
    round_s = max(cycle, m * stage_s)
    return LayoutStep(
        layout,
        "decode",
        batch,
        m * micro,
        round_s,
        stages * (stage_s - step.allreduce_s / stages),
        step.allreduce_s,
        stages * send,
        1.0 - m * stage_s / round_s,
        step.allreduce_count,
        step.allreduce_bytes,
        m,
    )


def _stage_send_s(shape, gpu: str, tokens: int, link: Any, act_dtype: str) -> float:
    spec = _link(link) if link is not None else get_gpu(gpu).link()
    return p2p_transfer_s(tokens * shape.hidden * kv_bytes_per_element(act_dtype), spec)


def predict_layout_prefill(
    model: Any,
    gpu: str,
    layout: Layout,
    prompt_tokens: int,
    chunks: int | None = None,
    link: Any = None,
    stage_link: Any = None,
    dtype: str = "bf16",
    flops_efficiency: float = 1.0,
    bandwidth_efficiency: float = 1.0,
    **kwargs: Any,
) -> LayoutStep:
    """One prompt's prefill on one replica of ``layout`` (the compute part of its TTFT).

    With PP the prompt is cut into ``chunks`` (default: one per stage) that follow each other
    down the pipe: ``(c + S - 1)`` chunk-stage times, of which ``(S - 1) / (c + S - 1)`` is
    bubble (GPipe's fill and drain).
    """
    shape = as_shape(model)
    roof = gpu_roof(gpu, dtype, layout.tp, flops_efficiency, bandwidth_efficiency, link=link)
    step = predict_prefill(shape, roof, 1, prompt_tokens, **kwargs)
    if layout.pp == 1:
        return LayoutStep(
            layout,
            "prefill",
            1,
            prompt_tokens,
            step.time_s,
            step.compute_s,
            step.allreduce_s,
            0.0,
            0.0,
            step.allreduce_count,
            step.allreduce_bytes,
        )
    stages = layout.pp
    c = max(1, min(chunks or stages, prompt_tokens))
    head = _head_time(shape, roof, 1, **kwargs)
    chunk_stage = (step.compute_s - head + step.allreduce_s) / (stages * c)
    send = _stage_send_s(
        shape,
        gpu,
        math.ceil(prompt_tokens / c),
        stage_link or link,
        kwargs.get("act_dtype", "bf16"),
    )
    slots = c + stages - 1
    total = slots * chunk_stage + (stages - 1) * send + head
    return LayoutStep(
        layout,
        "prefill",
        1,
        prompt_tokens,
        total,
        step.compute_s,
        step.allreduce_s,
        (stages - 1) * send,
        (stages - 1) / slots,
        step.allreduce_count,
        step.allreduce_bytes,
        c,
    )


# ---------------------------------------------------------------------------------------------
# Memory of a replica (KV replication included)


def replica_fit(
    model: Any,
    gpu: str,
    layout: Layout,
    context: int,
    users: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
    overhead_bytes: int | None = None,
):
    """:func:`infer_lab.analysis.memory.fit` for one replica (tp x pp GPUs), with the K/V of
    duplicated KV heads counted once per copy (:func:`kv_replication`)."""
    shape = as_shape(model)
    spec = get_gpu(gpu)
    report = fit(
        shape,
        spec.memory_bytes,
        context,
        users=users,
        n_gpus=layout.gpus_per_replica,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        memory_fraction=memory_fraction,
        overhead_bytes=overhead_bytes,
    )
    factor = kv_replication(shape, layout.tp)
    if factor == 1:
        return report
    per_user = math.ceil(report.kv_bytes_per_user * factor)
    return replace(
        report,
        kv_bytes_per_user=per_user,
        kv_needed_bytes=per_user * users,
        max_users=max(0, report.kv_budget_bytes // per_user),
    )


# ---------------------------------------------------------------------------------------------
# The Pareto frontier over parallelism


@dataclass(frozen=True)
class FrontierPoint:
    """One (layout, batch) on one GPU type. ``batch`` is the users of one TP group.

    ``gpu_seconds_per_token`` is compute spent per output token (tp x ITL / batch); energy
    assumes every GPU of the group draws its TDP the whole step (an upper bound); $ uses the
    catalog price per GPU-hour.
    """

    gpu: str
    tp: int
    replicas: int
    batch: int
    context: int
    itl_ms: float
    allreduce_ms_per_step: float
    tokens_per_s_per_user: float
    tokens_per_s_per_gpu: float
    pool_tokens_per_s: float
    gpu_seconds_per_token: float
    joules_per_token: float
    usd_per_m_tokens: float
    on_frontier: bool = False

    @property
    def layout(self) -> str:
        return Layout(tp=self.tp, dp=self.replicas).label

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layout"] = self.layout
        return d


DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def parallelism_frontier(
    model: Any,
    gpu: str = "H100-SXM",
    context: int = 8192,
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    tps: tuple[int, ...] = (1, 2, 4, 8),
    pool_gpus: int = 8,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
    link: Any = None,
    price_usd_per_hour: float | None = None,
) -> list[FrontierPoint]:
    """Per-user speed vs throughput per GPU for TP in ``tps`` at each batch that fits.

    A pool of ``pool_gpus`` runs ``pool_gpus // tp`` replicas of each TP group, so per-GPU
    numbers are those of one group and ``pool_tokens_per_s`` is the pool's. Batches that do not
    fit the group's memory are left out; the largest batch that fits is always included. Points
    on the Pareto frontier (no other point is both faster per user and cheaper per token) have
    ``on_frontier`` set.
    """
    shape = as_shape(model)
    spec = get_gpu(gpu)
    price = spec.price_usd_per_hour if price_usd_per_hour is None else price_usd_per_hour
    points = []
    for tp in tps:
        if pool_gpus % tp:
            continue
        lay = Layout(tp=tp)
        limit = replica_fit(
            shape, gpu, lay, context, 1, weight_dtype, kv_dtype, memory_fraction
        ).max_users
        if limit == 0:
            continue
        for b in sorted({b for b in batches if b <= limit} | {limit}):
            step = predict_layout_decode(
                shape, gpu, lay, b, context, link=link, weight_dtype=weight_dtype, kv_dtype=kv_dtype
            )
            itl = step.time_s
            per_gpu = b / itl / tp
            points.append(
                FrontierPoint(
                    gpu=spec.name,
                    tp=tp,
                    replicas=pool_gpus // tp,
                    batch=b,
                    context=context,
                    itl_ms=itl * 1e3,
                    allreduce_ms_per_step=step.allreduce_s * 1e3,
                    tokens_per_s_per_user=1 / itl,
                    tokens_per_s_per_gpu=per_gpu,
                    pool_tokens_per_s=per_gpu * pool_gpus,
                    gpu_seconds_per_token=1 / per_gpu,
                    joules_per_token=spec.tdp_w / per_gpu,
                    usd_per_m_tokens=price / (per_gpu * 3600) * 1e6,
                )
            )
    front = {id(p) for p in pareto_front(points)}
    return [replace(p, on_frontier=id(p) in front) for p in points]


def pareto_front(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other point beats on both per-user speed and throughput per GPU, fastest first."""
    ordered = sorted(points, key=lambda p: (-p.tokens_per_s_per_user, -p.tokens_per_s_per_gpu))
    front, best_throughput = [], -math.inf
    for p in ordered:
        if p.tokens_per_s_per_gpu > best_throughput:
            front.append(p)
            best_throughput = p.tokens_per_s_per_gpu
    return front


@dataclass(frozen=True)
class FastMode:
    """A "fast mode" read off the frontier: ``fast`` is at least ``speedup`` x faster per user
    than ``baseline`` and costs ``compute_ratio`` x the GPU time (and energy, and $) per token."""

    baseline: FrontierPoint
    fast: FrontierPoint
    speedup: float
    compute_ratio: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.as_dict(),
            "fast": self.fast.as_dict(),
            "speedup": self.speedup,
            "compute_ratio": self.compute_ratio,
        }


def fast_mode(
    points: list[FrontierPoint], speedup: float = 2.0, baseline_itl_ms: float | None = 50.0
) -> FastMode | None:
    """The cheapest frontier point at least ``speedup`` x faster per user than the baseline.

    The baseline is the most economical frontier point whose ITL is within ``baseline_itl_ms``
    (an interactive product's default tier; ``None``: the most economical point of all).
    Returns ``None`` when no point is that much faster.
    """
    front = pareto_front(points)
    usable = [p for p in front if baseline_itl_ms is None or p.itl_ms <= baseline_itl_ms]
    if not usable:
        return None
    base = max(usable, key=lambda p: p.tokens_per_s_per_gpu)
    faster = [p for p in front if p.tokens_per_s_per_user >= speedup * base.tokens_per_s_per_user]
    if not faster:
        return None
    fast = max(faster, key=lambda p: p.tokens_per_s_per_gpu)
    return FastMode(
        base,
        fast,
        fast.tokens_per_s_per_user / base.tokens_per_s_per_user,
        base.tokens_per_s_per_gpu / fast.tokens_per_s_per_gpu,
    )


def scaling_table(
    model: Any,
    gpus: tuple[str, ...] = ("H100-SXM", "H100-PCIe"),
    batch: int = 16,
    context: int = 8192,
    tps: tuple[int, ...] = (1, 2, 4, 8),
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """ITL at TP 1/2/4/8 per GPU type, with the all-reduce share and the speed-up over TP1.

    The TP1 row is computed even when the model does not fit one GPU (``fits`` says so): it is
    the reference the speed-up is measured against, not a configuration to run.
    """
    shape = as_shape(model)
    rows = []
    for gpu in gpus:
        one = None
        for tp in tps:
            lay = Layout(tp=tp)
            step = predict_layout_decode(shape, gpu, lay, batch, context, **kwargs)
            one = one or step.time_s
            fits = replica_fit(shape, gpu, lay, context, batch).fits
            rows.append(
                {
                    "gpu": gpu,
                    "tp": tp,
                    "batch": batch,
                    "context": context,
                    "fits": fits,
                    "itl_ms": step.time_s * 1e3,
                    "compute_ms": step.compute_s * 1e3,
                    "allreduce_ms": step.allreduce_s * 1e3,
                    "allreduce_share": step.allreduce_s / step.time_s,
                    "speedup_vs_tp1": one / step.time_s,
                    "ideal_speedup": tp,
                }
            )
    return rows
