"""Collectives on one link: the ring all-reduce, a point-to-point send, and what a TP step pays.

**Ring all-reduce.** N ranks each hold S bytes and all end with their sum. The ring does it in
2(N-1) steps; each step every rank sends S/N bytes to one neighbour while receiving S/N from
the other, so ``t(N, S) = t_base + 2(N-1) t_hop + 2(N-1)/N S / B_bus`` (the derivation and the
layouts built on it: :mod:`infer_lab.analysis.parallel`).

This module sits below both :mod:`.roofline` (which adds a TP step's all-reduces to its
prediction) and :mod:`.parallel` (which predicts whole layouts with the roofline), so the two
import it and not each other. :mod:`.parallel` re-exports every name here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..catalog import InterconnectSpec, get_interconnect
from ..units import require_positive
from .memory import as_shape, kv_bytes_per_element

# ---------------------------------------------------------------------------------------------
# Collectives on one link


def _link(link: Any):
    if link is None:
        raise ValueError("an interconnect is needed for a collective over more than one rank")
    return get_interconnect(link) if isinstance(link, str) else link


@dataclass(frozen=True)
class AllReduceCost:
    """One ring all-reduce: its three terms in seconds and what they came from."""

    n_ranks: int
    message_bytes: int
    link: str
    base_s: float
    latency_s: float  # 2(N-1) hops
    bandwidth_s: float  # 2(N-1)/N * S / busbw
    bus_bandwidth_Bps: float

    @property
    def total_s(self) -> float:
        return self.base_s + self.latency_s + self.bandwidth_s

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total_s"] = self.total_s
        return d


def allreduce_cost(n_ranks: int, message_bytes: int, link: Any) -> AllReduceCost:
    """The ring all-reduce of ``message_bytes`` over ``n_ranks`` on ``link``, term by term.

    One rank costs nothing (no collective). See the module docstring for the formula.
    """
    require_positive("n_ranks", n_ranks)
    require_positive("message_bytes", message_bytes, allow_zero=True)
    if n_ranks == 1:
        name = getattr(link, "name", link) or "none"
        return AllReduceCost(1, int(message_bytes), str(name), 0.0, 0.0, 0.0, math.inf)
    spec = _link(link)
    if n_ranks > spec.max_group:
        raise ValueError(
            f"{spec.name} joins at most {spec.max_group} GPUs; {n_ranks} ranks need a network link"
        )
    busbw = spec.bus_bandwidth_Bps(n_ranks)
    steps = 2 * (n_ranks - 1)
    return AllReduceCost(
        n_ranks=n_ranks,
        message_bytes=int(message_bytes),
        link=spec.name,
        base_s=spec.base_latency_s,
        latency_s=steps * spec.hop_latency_s,
        bandwidth_s=steps / n_ranks * message_bytes / busbw,
        bus_bandwidth_Bps=busbw,
    )


def ring_allreduce_s(n_ranks: int, message_bytes: int, link: Any) -> float:
    """Seconds for one ring all-reduce: t_base + 2(N-1) t_hop + 2(N-1)/N S / B_bus."""
    return allreduce_cost(n_ranks, message_bytes, link).total_s


def p2p_transfer_s(n_bytes: float, link: Any) -> float:
    """Seconds to send ``n_bytes`` from one GPU to one other: latency + bytes / per-direction bandwidth."""
    require_positive("n_bytes", n_bytes, allow_zero=True)
    spec = _link(link)
    return spec.base_latency_s + spec.hop_latency_s + n_bytes / spec.per_direction_Bps


def fit_allreduce(samples: list[tuple[float, float]], n_ranks: int, name: str = "fitted"):
    """An interconnect fitted to measured all-reduces: ``samples`` are (message bytes, seconds).

    Least squares of t = alpha + beta x S; the ring model reads alpha as 2(N-1) hops (the base
    latency is folded into them, so the fit carries over to other N as hop count times a
    per-hop latency) and beta as 2(N-1)/N / busbw. Use it as ``link=`` anywhere a catalog
    interconnect goes, to hold the model against a measurement (gloo on a CPU, NCCL on GPUs).
    """
    if n_ranks < 2:
        raise ValueError("an all-reduce fit needs at least 2 ranks")
    if len(samples) < 2 or len({s for s, _ in samples}) < 2:
        raise ValueError("need at least two message sizes to fit latency and bandwidth")
    x = np.array([[1.0, float(s)] for s, _ in samples])
    y = np.array([float(t) for _, t in samples])
    (alpha, beta), *_ = np.linalg.lstsq(x, y, rcond=None)
    if beta <= 0:
        raise ValueError("the fitted time does not grow with the message size: no bandwidth term")
    steps = 2 * (n_ranks - 1)
    busbw = steps / n_ranks / beta
    return InterconnectSpec(
        name=name,
        kind="fitted",
        description=f"fitted to {len(samples)} measured all-reduces over {n_ranks} ranks",
        total_bidirectional_gbps=2 * busbw / 1e9,
        per_direction_gbps=busbw / 1e9,
        topology="switch",
        max_group=max(n_ranks, 8),
        ring_busbw_gbps=busbw / 1e9,
        busbw_source="least-squares fit of t = alpha + beta x bytes",
        base_latency_us=0.0,
        hop_latency_us=max(float(alpha), 0.0) / steps * 1e6,
        latency_source="least-squares fit (intercept / 2(N-1))",
        source="measured",
        recorded="",
    )


# ---------------------------------------------------------------------------------------------
# Tensor parallelism


@dataclass(frozen=True)
class TPComm:
    """The all-reduces of one tensor-parallel step: ``count`` of ``message_bytes`` each."""

    tp: int
    count: int
    message_bytes: int
    each: AllReduceCost

    @property
    def total_s(self) -> float:
        return self.count * self.each.total_s

    @property
    def total_bytes(self) -> int:
        return self.count * self.message_bytes


def tp_allreduces(shape: Any, tp: int, tokens: int, link: Any, act_dtype: str = "bf16") -> TPComm:
    """2 x layers all-reduces of (``tokens`` x hidden x activation bytes) for a TP step."""
    shape = as_shape(shape)
    message = tokens * shape.hidden * kv_bytes_per_element(act_dtype)
    count = 2 * shape.layers if tp > 1 else 0
    return TPComm(tp, count, message, allreduce_cost(tp, message, link if tp > 1 else None))


def kv_replication(shape: Any, tp: int) -> float:
    """How many copies of the K/V cache a TP group of ``tp`` holds in all (1 = no duplication).

    A KV head cannot be split, so ranks take whole KV heads. Up to one rank per KV head the heads
    are split among the ranks, unevenly if need be, and nothing is copied (SmolLM2-135M's 3 KV
    heads on 2 ranks: 2 + 1, as :mod:`infer_lab.parallel.shard` splits them). With more ranks
    than KV heads each rank holds one head, so ``tp / kv_heads`` copies in all (Qwen2.5-7B's 4
    KV heads on 8 ranks: 2); this course's own TP engine refuses that split, vLLM copies the
    heads. An MLA latent is not split by heads at all: every rank caches all of it, which is why
    engines run MLA attention data-parallel instead.
    """
    shape = as_shape(shape)
    if tp <= 1:
        return 1.0
    if shape.mla:
        return float(tp)
    return max(1.0, tp / shape.kv_heads)
