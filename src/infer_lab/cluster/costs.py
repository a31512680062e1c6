"""What one engine step costs: from the roofline, or fitted to measured steps.

The simulator asks a cost model one question per step: how long does a forward pass take that
computes these tokens? A step is described by a :class:`StepBatch` (new tokens, sequences that
sample, cached tokens read, attention pairs). Any callable ``StepBatch -> seconds`` works:

- :class:`RooflineStepCost`: per-op roofline coefficients of a model on a GPU (or a TP group),
  read off :func:`infer_lab.analysis.roofline.step_ops`, so a pure prefill or a pure decode step
  costs exactly what :func:`~infer_lab.analysis.roofline.predict_prefill` /
  :func:`~infer_lab.analysis.roofline.predict_decode` say, and mixed (chunked-prefill) steps
  read the weights once.
- :class:`LinearStepCost`: ``a + b * tokens + c * kv_tokens``, the shape a measured engine's
  steps fit well (:func:`fit_linear_step_cost` fits it to step logs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..analysis.memory import as_shape
from ..analysis.parallel import tp_allreduces
from ..analysis.roofline import gpu_roof, shard_ops, step_ops
from ..units import require_positive


@dataclass(frozen=True)
class StepBatch:
    """The work of one forward pass, summed over the sequences in it.

    ``prefill_tokens``: new prompt tokens computed (all prefill chunks); ``decode_seqs``:
    sequences adding one token; ``sampled_seqs``: sequences whose logits are computed (every
    decode, plus each prefill that finishes its prompt); ``kv_tokens``: cached tokens attended
    (each sequence reads its whole context once, the new tokens included); ``attended_pairs``:
    query-key pairs (a chunk of c tokens after p cached ones has c*p + c(c+1)/2).
    """

    prefill_tokens: int = 0
    decode_seqs: int = 0
    sampled_seqs: int = 0
    kv_tokens: int = 0
    attended_pairs: int = 0

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @classmethod
    def prefill(cls, prompt_tokens: int, past: int = 0, samples: bool = True) -> StepBatch:
        """One prefill chunk of ``prompt_tokens`` after ``past`` cached tokens."""
        c = prompt_tokens
        return cls(c, 0, int(samples), past + c, c * past + c * (c + 1) // 2)

    @classmethod
    def decode(cls, batch: int, context: int) -> StepBatch:
        """``batch`` sequences each adding one token at ``context`` tokens (the new one included)."""
        return cls(0, batch, batch, batch * context, batch * context)

    def __add__(self, other: StepBatch) -> StepBatch:
        return StepBatch(
            self.prefill_tokens + other.prefill_tokens,
            self.decode_seqs + other.decode_seqs,
            self.sampled_seqs + other.sampled_seqs,
            self.kv_tokens + other.kv_tokens,
            self.attended_pairs + other.attended_pairs,
        )


StepCostModel = Callable[[StepBatch], float]


# ---------------------------------------------------------------------------------------------
# Roofline


@dataclass(frozen=True)
class _OpCoefficients:
    """One op's FLOPs and bytes as linear functions of a StepBatch's counts."""

    name: str
    flops_per_token: float
    flops_per_pair: float
    flops_per_sample: float
    weight_bytes: float
    kv_read_per_kv_token: float
    kv_write_per_token: float
    act_per_token: float
    act_per_sample: float
    expert_op: bool = False

    def flops(self, b: StepBatch) -> float:
        return (
            self.flops_per_token * b.tokens
            + self.flops_per_pair * b.attended_pairs
            + self.flops_per_sample * b.sampled_seqs
        )

    def bytes(self, b: StepBatch, weight_scale: float = 1.0) -> float:
        return (
            self.weight_bytes * weight_scale
            + self.kv_read_per_kv_token * b.kv_tokens
            + self.kv_write_per_token * b.tokens
            + self.act_per_token * b.tokens
            + self.act_per_sample * b.sampled_seqs
        )


def _solve3(rows: list[tuple[float, float, float]], values: list[float]) -> tuple[float, ...]:
    coef, *_ = np.linalg.lstsq(
        np.array(rows, dtype=float), np.array(values, dtype=float), rcond=None
    )
    return tuple(float(c) for c in coef)


class RooflineStepCost:
    """Step time of ``model`` on ``gpu`` (a TP group of ``tp``) from per-op roofline coefficients.

    Each op is ``max(FLOPs / peak, bytes / bandwidth)`` with FLOPs and bytes linear in the
    StepBatch's counts (read off :func:`~infer_lab.analysis.roofline.step_ops` at four tiny
    probes); the step is their sum plus the 2 x layers TP all-reduces of (tokens x hidden). MoE
    experts read only the experts a step's tokens touch. Sliding-window layers are costed as
    full attention here (an upper bound for such models).
    """

    def __init__(
        self,
        model: Any,
        gpu: str = "H100-SXM",
        tp: int = 1,
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        act_dtype: str = "bf16",
        flops_efficiency: float = 1.0,
        bandwidth_efficiency: float = 1.0,
        link: Any = None,
        roof: Any = None,
    ):
        self.shape = as_shape(model)
        self.gpu = gpu
        self.tp = tp
        self.roof = roof or gpu_roof(
            gpu, "bf16", tp, flops_efficiency, bandwidth_efficiency, link=link
        )
        self.act_dtype = act_dtype
        self._dtypes = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, act_dtype=act_dtype)
        self.ops = self._coefficients()
        self._comm_cache: dict[int, float] = {}

    def _coefficients(self) -> list[_OpCoefficients]:
        probes = [  # (batch, q_tokens, past) and the StepBatch each one is
            ((1, 1, 0), StepBatch.prefill(1)),
            ((1, 2, 0), StepBatch.prefill(2)),
            ((1, 1, 1), StepBatch.prefill(1, past=1)),
            ((2, 1, 0), StepBatch(2, 0, 2, 2, 2)),
        ]
        runs = [
            shard_ops(step_ops(self.shape, b, q, p, **self._dtypes), self.shape, self.roof.tp)
            for (b, q, p), _ in probes
        ]
        batches = [sb for _, sb in probes]
        out = []
        for i, op in enumerate(runs[0]):
            per = [run[i] for run in runs]
            f_tok, f_pair, f_smp = _solve3(
                [(sb.tokens, sb.attended_pairs, sb.sampled_seqs) for sb in batches],
                [o.flops for o in per],
            )
            a_tok, a_smp, _ = _solve3(
                [(sb.tokens, sb.sampled_seqs, 0.0) for sb in batches],
                [o.activation_bytes for o in per],
            )
            expert = per[0].weight_bytes != per[3].weight_bytes
            weight = per[0].weight_bytes
            if expert:  # one token touches k experts: keep the bytes of one expert per layer set
                weight = per[0].weight_bytes / self.shape.moe.active_experts
            out.append(
                _OpCoefficients(
                    name=op.name,
                    flops_per_token=f_tok,
                    flops_per_pair=f_pair,
                    flops_per_sample=f_smp,
                    weight_bytes=weight,
                    kv_read_per_kv_token=per[0].kv_read_bytes / batches[0].kv_tokens,
                    kv_write_per_token=per[0].kv_write_bytes / batches[0].tokens,
                    act_per_token=a_tok,
                    act_per_sample=a_smp,
                    expert_op=expert,
                )
            )
        return out

    def _touched_experts(self, tokens: int) -> float:
        e = self.shape.moe
        return e.n_experts * (1.0 - (1.0 - e.active_experts / e.n_experts) ** tokens)

    def compute_s(self, batch: StepBatch) -> float:
        """The per-op roofline part of a step, without the all-reduces."""
        roof = self.roof
        total = 0.0
        for op in self.ops:
            scale = self._touched_experts(batch.tokens) if op.expert_op else 1.0
            total += max(
                op.flops(batch) / roof.peak_flops, op.bytes(batch, scale) / roof.bandwidth_Bps
            )
        return total

    def allreduce_s(self, tokens: int) -> float:
        """The TP all-reduces of a step that computes ``tokens`` tokens (0 on one GPU)."""
        if self.roof.tp <= 1 or tokens == 0:
            return 0.0
        if tokens not in self._comm_cache:
            comm = tp_allreduces(self.shape, self.roof.tp, tokens, self.roof.link, self.act_dtype)
            self._comm_cache[tokens] = comm.total_s
        return self._comm_cache[tokens]

    def __call__(self, batch: StepBatch) -> float:
        if batch.tokens == 0:
            return 0.0
        return self.compute_s(batch) + self.allreduce_s(batch.tokens)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "model": self.shape.name,
            "gpu": self.gpu,
            "tp": self.tp,
            "roof": self.roof.name,
        }


# ---------------------------------------------------------------------------------------------
# Linear, fitted to measurements


@dataclass(frozen=True)
class LinearStepCost:
    """``step_s = a_s + b_s_per_token * tokens + c_s_per_kv_token * kv_tokens``.

    ``a`` is the fixed cost of a step (weights read, launches), ``b`` each computed token,
    ``c`` each cached token attended. ``r2`` and ``samples`` describe the fit it came from.
    """

    a_s: float
    b_s_per_token: float
    c_s_per_kv_token: float = 0.0
    r2: float | None = None
    samples: int = 0
    source: str = "given"

    def __call__(self, batch: StepBatch) -> float:
        if batch.tokens == 0:
            return 0.0
        return (
            self.a_s + self.b_s_per_token * batch.tokens + self.c_s_per_kv_token * batch.kv_tokens
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> dict[str, Any]:
        return {"kind": "linear", **self.as_dict()}


def _field(sample: Any, *names: str) -> float | None:
    for name in names:
        value = sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)
        if value is not None:
            return float(value)
    return None


def fit_linear_step_cost(samples: Iterable[Any], source: str = "fitted") -> LinearStepCost:
    """Least-squares fit of :class:`LinearStepCost` to measured steps.

    Each sample is a dict or object with the step's tokens (``tokens`` or ``num_tokens``, as in
    :class:`infer_lab.engine.StepRecord`), its time (``seconds`` or ``duration_s``) and, when
    known, the cached tokens it read (``kv_tokens``; without it ``c`` is 0). Failed steps
    (``failed`` true) are skipped. Needs at least as many distinct steps as coefficients.
    """
    rows, times = [], []
    for s in samples:
        if _field(s, "failed"):
            continue
        tokens = _field(s, "tokens", "num_tokens")
        seconds = _field(s, "seconds", "duration_s")
        if tokens is None or seconds is None:
            raise ValueError("each sample needs tokens (or num_tokens) and seconds (or duration_s)")
        rows.append((1.0, tokens, _field(s, "kv_tokens")))
        times.append(seconds)
    with_kv = bool(rows) and all(r[2] is not None for r in rows)
    needed = 3 if with_kv else 2
    if len(rows) < needed:
        raise ValueError(f"need at least {needed} usable steps to fit, got {len(rows)}")
    x = np.array([r if with_kv else r[:2] for r in rows], dtype=float)
    y = np.array(times, dtype=float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    a, b = float(coef[0]), float(coef[1])
    c = float(coef[2]) if with_kv else 0.0
    return LinearStepCost(a, b, c, r2=r2, samples=len(rows), source=source)


def linear_from_roofline(
    cost: RooflineStepCost, context: int, max_tokens: int = 512
) -> LinearStepCost:
    """A :class:`LinearStepCost` fitted to a roofline cost model's decode and prefill steps
    (batches 1..max_tokens at ``context``): the same shape a measured engine gives."""
    require_positive("context", context)
    samples = []
    b = 1
    while b <= max_tokens:
        samples.append(
            {"tokens": b, "kv_tokens": b * context, "seconds": cost(StepBatch.decode(b, context))}
        )
        pre = StepBatch.prefill(b)
        samples.append({"tokens": b, "kv_tokens": pre.kv_tokens, "seconds": cost(pre)})
        b = b * 2 if b < 8 else int(math.ceil(b * 1.5))
    return fit_linear_step_cost(samples, source=f"fitted to roofline of {cost.roof.name}")
