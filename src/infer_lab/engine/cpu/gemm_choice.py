"""Which GEMM path a CPU engine takes, chosen by timing both on this machine, per batch size.

:mod:`.prepack` gives two ways to multiply by a weight: ``F.linear`` on the plain matrix (MKL)
and oneDNN on a copy reordered once. Which one is faster depends on the CPU and on how many
rows (tokens) a step multiplies: on the course's AMD EPYC the prepacked path is 1.3-3x faster
at every size, while on an Intel Sapphire Rapids it was slower at one row. A rule written for
one machine is a tuning accident on the next, so the engine measures.

:func:`measure_plan` times the model's GEMMs (q|k|v, o, gate|up, down per layer, the LM head)
both ways at a handful of row counts (interleaved, best of a few rounds; about a second for the
course's 135M model on a quiet CPU) and :func:`choose` turns those timings into a :class:`GemmPlan`: for each
row bucket, prepacked or plain. The engine then runs every step on the path its number of rows
asks for. The plan is measured once per process for each CPU, thread count, dtype and set of
weight shapes (:func:`plan_for`), and both paths give the same tokens (they differ by float
rounding only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...hardware import cpu_model
from . import prepack

ROW_BUCKETS = (1, 4, 16, 64, 256)
MARGIN = 0.05  # prepacked must be this much faster to be worth its extra copy of the weights


@dataclass(frozen=True)
class GemmPlan:
    """The GEMM path for each number of rows a step multiplies.

    Attributes:
        rows: lower edges of the row buckets, ascending; bucket ``i`` covers ``rows[i]`` up to
            ``rows[i + 1] - 1`` rows (the last one: every larger step).
        prepacked: for each bucket, True when the prepacked (oneDNN) path is used.
        plain_ms, prepacked_ms: the timings the choice was made from (ms per measured pass;
            empty when the plan was not measured).
        source: ``"measured"``, ``"forced on"``, ``"forced off"`` or ``"refused here"``.
        threads: torch threads when it was made.
        refused: why this machine cannot prepack (:func:`.prepack.refusal`), when it cannot.
    """

    rows: tuple[int, ...]
    prepacked: tuple[bool, ...]
    plain_ms: tuple[float, ...] = ()
    prepacked_ms: tuple[float, ...] = ()
    source: str = "measured"
    threads: int = 0
    refused: str | None = None

    def __post_init__(self) -> None:
        if not self.rows or len(self.rows) != len(self.prepacked):
            raise ValueError("a GEMM plan needs one choice per row bucket, and at least one bucket")
        if list(self.rows) != sorted(set(self.rows)) or self.rows[0] < 1:
            raise ValueError(f"row buckets must be ascending and >= 1, got {self.rows}")

    @classmethod
    def always(cls, prepacked: bool) -> GemmPlan:
        """One path at every size (``prepack_weights=True`` or ``False``)."""
        return cls((1,), (prepacked,), source="forced on" if prepacked else "forced off",
                   threads=torch.get_num_threads())

    @classmethod
    def refused_here(cls, why: str) -> GemmPlan:
        """Plain at every size because this machine refuses prepacking (``why``, from its probe)."""
        return cls((1,), (False,), source="refused here", threads=torch.get_num_threads(), refused=why)

    def use_prepacked(self, rows: int) -> bool:
        """The path for a step that multiplies ``rows`` rows (tokens)."""
        choice = self.prepacked[0]
        for edge, packed in zip(self.rows, self.prepacked, strict=True):
            if rows >= edge:
                choice = packed
        return choice

    @property
    def any_prepacked(self) -> bool:
        return any(self.prepacked)

    def describe(self) -> str:
        """In words: ``prepacked at every size``, ``plain below 4 rows, prepacked from 4``, ..."""
        if all(self.prepacked):
            return "prepacked (oneDNN) at every batch size"
        if not any(self.prepacked):
            return "plain F.linear at every batch size" + (f" ({self.refused})" if self.refused else "")
        parts = []
        for i, (edge, packed) in enumerate(zip(self.rows, self.prepacked, strict=True)):
            if i and packed == self.prepacked[i - 1]:
                continue
            parts.append(f"{'prepacked' if packed else 'plain'} from {edge} row{'s' * (edge > 1)}")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "threads": self.threads,
            "refused": self.refused,
            "summary": self.describe(),
            "buckets": [
                {"rows": r, "prepacked": p,
                 "plain_ms": self.plain_ms[i] if self.plain_ms else None,
                 "prepacked_ms": self.prepacked_ms[i] if self.prepacked_ms else None}
                for i, (r, p) in enumerate(zip(self.rows, self.prepacked, strict=True))
            ],
        }


def choose(rows: Sequence[int], plain_ms: Sequence[float], prepacked_ms: Sequence[float],
           margin: float = MARGIN) -> GemmPlan:
    """The plan from timings: prepacked in a bucket when it is at least ``margin`` faster there.

    Between two measured buckets the smaller one's choice holds. Ties go to the plain path,
    which needs no second copy of the weights.
    """
    if not (len(rows) == len(plain_ms) == len(prepacked_ms)) or not rows:
        raise ValueError("rows, plain_ms and prepacked_ms need one entry each per bucket")
    if min(plain_ms) <= 0 or min(prepacked_ms) <= 0:
        raise ValueError("timings must be > 0 ms")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    wins = tuple(p < (1 - margin) * f for f, p in zip(plain_ms, prepacked_ms, strict=True))
    return GemmPlan(tuple(rows), wins, tuple(plain_ms), tuple(prepacked_ms), "measured",
                    torch.get_num_threads())


def _pass(weights: Sequence[torch.Tensor], inputs: dict[int, torch.Tensor]) -> Callable[[], None]:
    def one_pass() -> None:
        for w in weights:
            prepack.linear(inputs[w.shape[1]], w)
    return one_pass


def _count_for(rows: int, weights: Sequence[torch.Tensor], full_rows: int = 16, least: int = 8) -> int:
    """How many of ``weights`` (in model order) to time at ``rows`` rows.

    Up to ``full_rows`` rows, all of them: a small-batch GEMM streams its weight from memory,
    and only a pass over more bytes than the CPU's caches hold times that stream (a few layers
    would sit in the L3 cache and time something else). Above it the GEMMs are compute-bound
    and a share of ``full_rows / rows`` of the bytes (at least ``least`` weights) keeps every
    bucket's pass about as long.
    """
    total = sum(w.numel() for w in weights)
    budget = total * min(1.0, full_rows / rows)
    n, used = 0, 0
    for w in weights:
        if n >= least and used + w.numel() > budget:
            break
        n, used = n + 1, used + w.numel()
    return n


@torch.inference_mode()
def measure_plan(weights: Sequence[torch.Tensor], packed: Sequence[torch.Tensor] | None = None,
                 rows: Sequence[int] = ROW_BUCKETS, rounds: int = 3, budget_s: float = 1.0) -> GemmPlan:
    """Time a model's GEMM ``weights`` (plain ``(out, in)``, in the order a step uses them) both ways.

    ``packed``: the same weights prepacked (default: packed here). Each row count gets one
    warm-up pass of each path, then up to ``rounds`` rounds time every row count both ways in
    turn, until ``budget_s`` seconds have gone (at least one round). The best time of each
    counts: on a shared machine it is the one least disturbed by others.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    weights = list(weights)
    if not weights:
        raise ValueError("measure_plan needs at least one weight")
    packed = [prepack.prepack(w) for w in weights] if packed is None else list(packed)
    if len(packed) != len(weights):
        raise ValueError("packed needs one tensor per weight")
    dtype = weights[0].dtype
    gen = torch.Generator().manual_seed(0)
    passes = []
    for n in rows:
        k = _count_for(n, weights)
        inputs = {c: torch.randn(n, c, generator=gen).to(dtype) for c in {w.shape[1] for w in weights[:k]}}
        passes.append((_pass(weights[:k], inputs), _pass(packed[:k], inputs)))
    best = [[float("inf"), float("inf")] for _ in rows]
    start = time.perf_counter()
    for pair in passes:
        for one_pass in pair:
            one_pass()
    for r in range(rounds):
        if r and time.perf_counter() - start > budget_s:
            break
        for pair, b in zip(passes, best, strict=True):
            for i, one_pass in enumerate(pair):
                t0 = time.perf_counter()
                one_pass()
                b[i] = min(b[i], time.perf_counter() - t0)
    return choose(rows, [b[0] * 1e3 for b in best], [b[1] * 1e3 for b in best])


_PLANS: dict[tuple[Any, ...], GemmPlan] = {}


def plan_for(weights: Sequence[torch.Tensor], packed: Sequence[torch.Tensor] | None = None) -> GemmPlan:
    """The measured plan for a model whose steps multiply by ``weights`` (plain, in step order).

    Measured once per process for each CPU, thread count, dtype and list of weight shapes, then
    reused: every engine of a chapter or a test suite shares one measurement.
    """
    key = (cpu_model(), torch.get_num_threads(), weights[0].dtype, tuple(tuple(w.shape) for w in weights))
    if key not in _PLANS:
        _PLANS[key] = measure_plan(weights, packed)
    return _PLANS[key]


def shape_weights(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, layers: int,
                  vocab: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Stand-in GEMM weights of a model shape in step order: (q|k|v, o, gate|up, down) per layer, LM head.

    Enough to measure a plan (:func:`plan_for`) for a model without loading it: GEMM speed
    depends on the shapes and the dtype, not on the values (a constant fill is quick to make).
    """
    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.full((rows, cols), 0.01, dtype=dtype)

    per_layer = [w((heads + 2 * kv_heads) * head_dim, hidden), w(hidden, heads * head_dim),
                 w(2 * intermediate, hidden), w(hidden, intermediate)]
    return [t for _ in range(layers) for t in per_layer] + [w(vocab, hidden)]
