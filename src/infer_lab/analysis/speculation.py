"""Speculative decoding on paper: acceptance, the cost of a draft and of a verification pass.

The textbook model (Leviathan et al. 2023) has each of ``k`` drafted tokens kept independently
with probability ``alpha``; one target pass then yields ``(1 - alpha^(k+1)) / (1 - alpha)``
tokens (:func:`infer_lab.engine.acceptance.expected_tokens_per_pass`) and costs ``k c + 1``
target steps, ``c`` being a draft token's cost over a target step. Real runs break the model in
three ways this module measures instead of assuming:

* **Truncation.** Drafts after the first rejection are never tested, so the engine's counter
  ``accepted / proposed`` is below ``alpha`` even for i.i.d. drafts
  (:func:`expected_acceptance_rate`). :func:`alpha_mle` backs ``alpha`` out of the per-pass
  accepted lengths as the maximum-likelihood estimate of a truncated geometric.
* **Short proposals.** Prompt lookup proposes fewer than ``k`` tokens, or none, when the text
  has no match. The MLE above counts only the drafts that were tested.
* **Correlation.** In a copy span every draft is right; outside one, every draft is wrong.
  :func:`acceptance_by_position` shows the acceptance of the i-th draft given that the ones
  before it were kept: flat for i.i.d. drafts, rising for correlated ones.

A verification pass over ``k + 1`` tokens is not free either: :func:`fit_verify_cost` fits the
measured target time of a verification pass as ``t(q) = t0 + t1 q`` over ``q`` tokens, next to a
plain one-token step, and
:func:`roofline_verify_ratio` predicts ``t(k+1) / t(1)`` from the roofline of chapter 04.

The second half computes what EAGLE, Medusa and multi-token prediction (MTP) add to a model, from
its config (:func:`draft_mechanisms`), and reads the figures their papers report
(:func:`cited_results`, from ``data/speculative_papers.json``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..engine.acceptance import expected_tokens_per_pass
from ..package_files import data_path
from .memory import ModelLike, as_shape, kv_bytes_per_token_per_layer
from .params import (
    ModelShape,
    attention_params_per_layer,
    gated_mlp_params,
    load_config,
    param_counts,
)
from .roofline import predict_decode, predict_step, step_ops

# ---------------------------------------------------------------------------------------------
# Acceptance


def expected_acceptance_rate(alpha: float, k: int) -> float:
    """``accepted / proposed`` that i.i.d. drafts kept with probability ``alpha`` show at ``k``.

    Mean kept drafts per pass are ``alpha + alpha^2 + ... + alpha^k``; dividing by the ``k``
    proposed gives a number below ``alpha`` for every ``k > 1``: the truncation bias.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return (expected_tokens_per_pass(alpha, k) - 1) / k


def alpha_mle(accepted: Sequence[int], proposed: Sequence[int]) -> float | None:
    """Per-draft acceptance ``alpha`` backed out of per-pass outcomes (maximum likelihood).

    A pass that kept ``a`` of its ``m`` drafts tested ``a`` drafts that were right and, when
    ``a < m``, one that was wrong (the rest were never tested). Under the i.i.d. model its
    likelihood is ``alpha^a (1 - alpha)^[a < m]``, so over all passes ``alpha^A (1 - alpha)^R``,
    which peaks at ``A / (A + R)``: kept drafts over tested drafts. Passes without drafts say
    nothing. Returns None when no draft was tested.
    """
    if len(accepted) != len(proposed):
        raise ValueError(f"need one proposal length per pass: {len(accepted)} vs {len(proposed)}")
    kept = rejected = 0
    for a, m in zip(accepted, proposed, strict=True):
        if not 0 <= a <= m:
            raise ValueError(f"a pass cannot keep {a} of {m} drafts")
        if m:
            kept += a
            rejected += a < m
    return kept / (kept + rejected) if kept + rejected else None


def accepted_length_pmf(alpha: float, k: int) -> list[float]:
    """P(a pass keeps j of k drafts), j = 0..k, for i.i.d. drafts: a geometric truncated at k."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return [alpha**j * (1 - alpha) for j in range(k)] + [alpha**k]


def acceptance_by_position(accepted: Sequence[int], proposed: Sequence[int], k: int) -> list[float | None]:
    """Acceptance of the i-th draft (i = 1..k) among passes whose drafts 1..i-1 were all kept.

    For i.i.d. drafts every entry estimates the same ``alpha``. A rising curve means the drafts
    are correlated: once a pass is inside a copy span, its next guess is right more often.
    None where no pass reached position i.
    """
    out: list[float | None] = []
    for i in range(1, k + 1):
        reached = [(a, m) for a, m in zip(accepted, proposed, strict=True) if m >= i and a >= i - 1]
        out.append(sum(a >= i for a, _ in reached) / len(reached) if reached else None)
    return out


# ---------------------------------------------------------------------------------------------
# Cost of drafting and of verifying


@dataclass(frozen=True)
class VerifyCost:
    """Target time of a verification pass over ``q >= 2`` tokens per sequence, fitted as
    ``t0 + t1 q``, next to a plain one-token decode step ``decode_s`` (seconds).

    The two are kept apart because an engine may run them differently: in ours a one-token
    step takes the batched decode path, a multi-token one the chunked (prefill-like) path, so
    ``t(2)`` can sit well above ``t(1)`` even when each extra token is cheap.
    """

    t0_s: float
    t1_s: float
    decode_s: float
    samples: int
    q_values: tuple[int, ...]

    def time_s(self, q: float) -> float:
        return self.decode_s if q <= 1 else self.t0_s + self.t1_s * q

    def ratio(self, q: float) -> float:
        """``v = t(q) / t(1)``: how many plain decode steps one verification of ``q`` tokens costs."""
        return self.time_s(q) / self.decode_s


def fit_verify_cost(samples: Sequence[tuple[int, float]], decode_s: float | None = None) -> VerifyCost:
    """Least-squares line through ``(tokens per sequence, seconds)`` of verification passes (q >= 2).

    ``decode_s`` is the plain decode step; by default the mean of the samples with ``q = 1``.
    Without verification samples every pass is taken to cost one decode step (the textbook
    assumption); with a single ``q`` the slope cannot be fitted and is 0.
    """
    if not samples:
        raise ValueError("need at least one (tokens, seconds) sample")
    ones = [float(t) for q, t in samples if q <= 1]
    if decode_s is None:
        if not ones:
            raise ValueError("need a plain decode step: pass decode_s or samples with q = 1")
        decode_s = sum(ones) / len(ones)
    verify = [(float(q), float(t)) for q, t in samples if q >= 2]
    if not verify:
        return VerifyCost(decode_s, 0.0, decode_s, len(samples), (1,))
    n = len(verify)
    mean_q, mean_t = sum(q for q, _ in verify) / n, sum(t for _, t in verify) / n
    var_q = sum((q - mean_q) ** 2 for q, _ in verify)
    slope = sum((q - mean_q) * (t - mean_t) for q, t in verify) / var_q if var_q else 0.0
    slope = max(slope, 0.0)  # noise must not make more tokens cheaper
    return VerifyCost(mean_t - slope * mean_q, slope, decode_s, n, tuple(sorted({int(q) for q, _ in verify})))


def predicted_speedup_with_verify(alpha: float, k: int, cost_ratio: float, verify_ratio: float) -> float:
    """Speedup when a verification pass costs ``verify_ratio`` decode steps instead of 1.

    ``E(alpha, k) / (k c + v)``: the textbook formula with its ``1`` replaced by the measured
    ``v = t(k+1) / t(1)``.
    """
    return expected_tokens_per_pass(alpha, k) / (k * cost_ratio + verify_ratio)


def roofline_verify_ratio(
    model: ModelLike, roof: Any, batch: int, k: int, context: int, dtype: str = "bf16"
) -> float:
    """Predicted time of a verification step (``batch`` sequences x ``k + 1`` tokens) over a
    plain decode step (``batch`` x 1 token), on the roofline of chapter 04.

    While the step is memory-bound both read the same weights once and the ratio stays near 1:
    the extra FLOPs are free. Once ``batch x (k + 1)`` tokens push the step past the ridge
    point, the ratio climbs towards ``k + 1`` and the guesses cost as much as they save.
    """
    shape = as_shape(model)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
    plain = predict_decode(shape, roof, batch, context, logits="last", **kw)
    ops = step_ops(shape, batch, k + 1, past=context - 1, logits="all", **kw)
    verify = predict_step(ops, roof, "verify", batch, batch * (k + 1))
    return verify.time_s / plain.time_s


# ---------------------------------------------------------------------------------------------
# EAGLE, Medusa, MTP: what they add to a model, computed from its config


@dataclass(frozen=True)
class DraftMechanism:
    """One way to draft, sized for one catalog model (parameters and bytes; bf16 unless said).

    ``draft_params_read`` is what one drafted token reads (its weights, shared ones included:
    a shared LM head is still read again), so ``cost_ratio`` estimates ``c`` for a
    memory-bound decode step as that over the target's active parameters.
    """

    method: str
    model: str
    drafts_from: str
    adds: str
    extra_params: int
    extra_kv_bytes_per_token: int
    draft_params_read: int
    target_params: int
    target_active_params: int
    bytes_per_param: int = 2

    @property
    def extra_weight_bytes(self) -> int:
        return self.extra_params * self.bytes_per_param

    @property
    def extra_fraction(self) -> float:
        """Extra parameters over the target's total."""
        return self.extra_params / self.target_params

    @property
    def cost_ratio(self) -> float:
        """``c``: one draft token's weight reads over one target decode step's."""
        return self.draft_params_read / self.target_active_params


def _decoder_layer_params(shape: ModelShape, index: int) -> tuple[int, int]:
    """(total, active) parameters of decoder layer ``index``: attention, MLP or MoE, two norms."""
    attn = attention_params_per_layer(shape)
    norms = 2 * shape.hidden
    if not shape.is_moe_layer(index):
        mlp = gated_mlp_params(shape.hidden, shape.intermediate, shape.mlp_bias)
        return attn + mlp + norms, attn + mlp + norms
    one = param_counts(replace(shape, layers=1, layer_windows=shape.layer_windows[:1],
                               moe=replace(shape.moe, dense_layers=0)))
    layer = one.attention + one.experts + one.shared_experts + one.routers + norms
    return layer, layer - one.experts + one.experts_active


def _mtp_modules(model: str | dict[str, Any]) -> int:
    cfg = load_config(model)
    return int(cfg.get("num_nextn_predict_layers") or 0)


def draft_mechanisms(
    model: str, self_layers: int | None = None, medusa_heads: int = 3, mtp_modules: int | None = None
) -> list[DraftMechanism]:
    """n-gram, self-speculative, Medusa-1, EAGLE and MTP sized for one catalog model.

    Args:
        model: a catalog name (``"llama-3-8b"``, ``"deepseek-v3"``...).
        self_layers: L of the self-speculative draft (default: a quarter of the layers).
        medusa_heads: Medusa heads (3 in the Medusa authors' Vicuna-7B recipe).
        mtp_modules: MTP modules; default the config's ``num_nextn_predict_layers``, else 1
            (what a dense model would need to be trained with, as DeepSeek-V3 was).
    """
    shape = as_shape(model)
    counts = param_counts(shape)
    h, vocab, layers = shape.hidden, shape.vocab, shape.layers
    head = vocab * h  # an LM head (the target's is shared by EAGLE, MTP and self-speculation)
    last_total, last_active = _decoder_layer_params(shape, layers - 1)
    kv_layer = kv_bytes_per_token_per_layer(shape, "bf16")
    L = self_layers or max(1, layers // 4)
    first_active = sum(_decoder_layer_params(shape, i)[1] for i in range(L))
    modules = mtp_modules if mtp_modules is not None else (_mtp_modules(model) or 1)
    medusa_head = h * h + h + head  # residual SiLU block (with bias), then its own vocab projection
    eagle = 2 * h * h + h + last_total  # fc over [feature; token embedding] with bias, one decoder layer
    mtp = 2 * h * h + 3 * h + last_total  # projection of [hidden; embedding], two input norms, head norm
    common = dict(model=shape.name, target_params=counts.total, target_active_params=counts.active)
    return [
        DraftMechanism("n-gram (prompt lookup)", drafts_from="the prompt and the output so far (token matching)",
                       adds="nothing", extra_params=0, extra_kv_bytes_per_token=0, draft_params_read=0, **common),
        DraftMechanism(f"self-speculative (first {L} of {layers} layers)",
                       drafts_from="the target's own first layers, final norm and LM head",
                       adds="a KV cache for the draft's layers (in this engine)", extra_params=0,
                       extra_kv_bytes_per_token=L * kv_layer, draft_params_read=first_active + head, **common),
        DraftMechanism(f"Medusa-1 ({medusa_heads} heads)",
                       drafts_from="the target's last hidden state, one head per future position",
                       adds=f"{medusa_heads} heads: a hidden x hidden residual block + a hidden x vocab projection each",
                       extra_params=medusa_heads * medusa_head, extra_kv_bytes_per_token=0,
                       draft_params_read=medusa_head, **common),
        DraftMechanism("EAGLE (one decoder layer)",
                       drafts_from="the target's last hidden state (the features under its LM head) plus the next token's embedding",
                       adds="a 2h -> h projection and one decoder layer; embedding and LM head shared",
                       extra_params=eagle, extra_kv_bytes_per_token=kv_layer,
                       draft_params_read=2 * h * h + h + last_active + head, **common),
        DraftMechanism(f"MTP ({modules} module{'s' if modules > 1 else ''})",
                       drafts_from="the target's last hidden state plus the next token's embedding",
                       adds="per module: a 2h -> h projection, norms and one decoder layer, trained with the model",
                       extra_params=modules * mtp, extra_kv_bytes_per_token=modules * kv_layer,
                       draft_params_read=2 * h * h + last_active + head, **common),
    ]


# ---------------------------------------------------------------------------------------------
# What the papers report


@dataclass(frozen=True)
class CitedResult:
    """One figure a paper reports (not measured here): ``[low, high]`` of ``metric``."""

    key: str
    label: str
    method: str
    paper: str
    authors: str
    year: int
    venue: str
    where: str
    url: str
    target_model: str
    setting: str
    metric: str
    low: float
    high: float
    note: str = ""
    k: int | None = None
    batch: int | None = None

    @property
    def mid(self) -> float:
        return (self.low + self.high) / 2

    @property
    def citation(self) -> str:
        return f"{self.authors}, {self.paper} ({self.venue}, {self.year}), {self.where}"


def _papers_file() -> Path:
    return data_path("speculative_papers.json")


@lru_cache(maxsize=1)
def _cited_table() -> tuple[CitedResult, ...]:
    raw = json.loads(_papers_file().read_text())
    return tuple(CitedResult(**r) for r in raw["results"])


def cited_results(metric: str | None = None) -> list[CitedResult]:
    """The cited figures of ``data/speculative_papers.json`` (optionally one ``metric``)."""
    return [r for r in _cited_table() if metric is None or r.metric == metric]


def cited(key: str) -> CitedResult:
    """One cited figure by key; a clear error naming the known keys otherwise."""
    for r in _cited_table():
        if r.key == key:
            return r
    raise KeyError(f"no cited result {key!r}; known: {', '.join(r.key for r in _cited_table())}")
