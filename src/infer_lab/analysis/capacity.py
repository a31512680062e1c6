"""The capacity planner: which GPU, how many users, what latency, and what a million tokens costs.

It combines the memory equation (what fits) with the roofline (how fast) for every GPU in the
catalog. Prices come from the catalog (or your own ``price_usd_per_hour``). All predictions are
roofline bounds: a real engine gets some fraction of them (see notebook 04 for how much).

More than one GPU is a *layout* (:class:`infer_lab.analysis.parallel.Layout`): tensor parallel
(TP) groups pay two all-reduces per layer on the GPU's interconnect, pipeline stages (PP) pay
stage-to-stage sends and bubbles, replicas (DP) pay nothing per token but each holds the whole
model. :func:`plan_layouts` compares the layouts of one GPU count and :func:`recommend` says how
many GPUs and which parallelism meet the SLOs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..catalog import get_gpu, list_gpus
from ..units import require_positive
from .memory import FitReport, ModelLike, as_shape
from .parallel import (
    Layout,
    layouts_for,
    predict_layout_decode,
    predict_layout_prefill,
    replica_fit,
)
from .roofline import Roof, predict_decode, predict_prefill

# How every J/token of the planner is computed, in words for the pages that print one.
ENERGY_ASSUMPTION = ("Energy per token assumes every GPU draws its full TDP (the catalog's board power) for the "
                     "whole step: an upper bound, since a memory-bound decode step draws less.")

@dataclass(frozen=True)
class Workload:
    """A serving workload: its context, its latency SLOs and the precision it can accept.

    ``context`` is the tokens each sequence may hold (prompt + output); ``prompt_tokens`` the
    prompt that arrives at once (it sets the TTFT). ``None`` for an SLO means "no limit".
    """

    name: str
    corner: str
    description: str
    context: int
    prompt_tokens: int
    itl_slo_ms: float | None
    ttft_slo_ms: float | None
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    min_users: int = 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# The quality / latency / throughput triangle: each preset picks two corners. These are
# workload definitions (what the product promises its users), not hardware facts.
PRESETS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "premium-chat",
            "quality + latency",
            "Interactive chat: full-precision weights, fast tokens (40 tok/s per user), quick first token.",
            context=8192,
            prompt_tokens=2048,
            itl_slo_ms=25.0,
            ttft_slo_ms=500.0,
        ),
        Workload(
            "async-agents",
            "quality + throughput",
            "Agents that run in the background: long shared histories, full precision, latency can slip.",
            context=32768,
            prompt_tokens=16384,
            itl_slo_ms=100.0,
            ttft_slo_ms=10_000.0,
        ),
        Workload(
            "batch-summarization",
            "throughput (quality traded for fp8, no latency SLO)",
            "Offline summaries of long documents: fp8 weights and KV, no latency SLO, prefill-heavy. Cost is "
            "what every corner is priced in, not a corner: this preset keeps one corner and trades the other two.",
            context=8192,
            prompt_tokens=7680,
            itl_slo_ms=None,
            ttft_slo_ms=None,
            weight_dtype="fp8",
            kv_dtype="fp8",
        ),
    )
}


def get_preset(name: str) -> Workload:
    """A preset by name; the error lists the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class CapacityPlan:
    """One GPU configuration against one workload. Bytes exact, times in ms, money in USD.

    ``n_gpus = tp x pp x dp``; ``fit`` is the memory of ONE replica (tp x pp GPUs); ``users``,
    ``max_users_*``, tokens/s and $/hour are totals over the ``dp`` replicas. ITL and TTFT are
    what one user sees. When the weights do not fit, ``fit.shortfall_bytes`` says by how much
    and the latency and cost fields are ``None``.
    """

    gpu: str
    n_gpus: int
    model: str
    weight_dtype: str
    kv_dtype: str
    context: int
    prompt_tokens: int
    fit: FitReport
    max_users_memory: int
    max_users_within_slo: int
    users: int
    itl_ms: float | None
    ttft_ms: float | None
    tokens_per_s: float | None
    input_tokens_per_s: float | None
    usd_per_hour: float
    usd_per_m_output_tokens: float | None
    usd_per_m_input_tokens: float | None
    itl_slo_ms: float | None
    ttft_slo_ms: float | None
    meets_slo: bool
    why_not: str
    tp: int = 1
    pp: int = 1
    dp: int = 1
    interconnect: str | None = None
    allreduce_ms_per_step: float | None = None
    prefill_allreduce_ms: float | None = None
    bubble_fraction: float | None = None
    joules_per_output_token: float | None = None

    @property
    def fits(self) -> bool:
        return self.fit.fits

    @property
    def parallelism(self) -> str:
        """``'TP1'``, ``'TP4'``, ``'TP2 x DP2'``, ``'TP8 x PP2'``..."""
        return Layout(self.tp, self.pp, self.dp).label

    def row(self) -> dict[str, Any]:
        """A flat dict for a table or JSON (GB = 1e9 B for the memory columns)."""
        return {
            "gpu": self.gpu,
            "n_gpus": self.n_gpus,
            "parallelism": self.parallelism,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "interconnect": self.interconnect,
            "allreduce_ms_per_step": self.allreduce_ms_per_step,
            "prefill_allreduce_ms": self.prefill_allreduce_ms,
            "bubble_fraction": self.bubble_fraction,
            "joules_per_output_token": self.joules_per_output_token,
            "fits": self.fits,
            "shortfall_bytes": self.fit.shortfall_bytes,
            "weight_bytes": self.fit.weight_bytes,
            "kv_bytes_per_user": self.fit.kv_bytes_per_user,
            "kv_budget_bytes": self.fit.kv_budget_bytes,
            "max_users_memory": self.max_users_memory,
            "max_users_within_slo": self.max_users_within_slo,
            "users": self.users,
            "itl_ms": self.itl_ms,
            "ttft_ms": self.ttft_ms,
            "tokens_per_s": self.tokens_per_s,
            "input_tokens_per_s": self.input_tokens_per_s,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_m_output_tokens": self.usd_per_m_output_tokens,
            "usd_per_m_input_tokens": self.usd_per_m_input_tokens,
            "meets_slo": self.meets_slo,
            "why_not": self.why_not,
        }

    def as_dict(self) -> dict[str, Any]:
        d = self.row()
        d.update(
            model=self.model,
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            context=self.context,
            prompt_tokens=self.prompt_tokens,
            itl_slo_ms=self.itl_slo_ms,
            ttft_slo_ms=self.ttft_slo_ms,
            fit=self.fit.as_dict(),
        )
        return d


def _usd_per_million(usd_per_hour: float, tokens_per_s: float) -> float:
    return usd_per_hour / (tokens_per_s * 3600.0) * 1e6


def _layout(n_gpus: int, parallelism: str | Layout | None) -> Layout:
    if parallelism is None:
        return Layout(tp=n_gpus)
    lay = Layout.parse(parallelism) if isinstance(parallelism, str) else parallelism
    if n_gpus not in (1, lay.n_gpus):
        raise ValueError(f"parallelism {lay.label} uses {lay.n_gpus} GPUs but n_gpus is {n_gpus}")
    return lay


def plan(
    model: ModelLike,
    gpu: str,
    n_gpus: int = 1,
    context: int = 4096,
    prompt_tokens: int | None = None,
    users: int | None = None,
    target_tokens_per_s: float | None = None,
    itl_slo_ms: float | None = None,
    ttft_slo_ms: float | None = None,
    min_users: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
    overhead_bytes: int | None = None,
    price_usd_per_hour: float | None = None,
    compute_dtype: str = "bf16",
    flops_efficiency: float = 1.0,
    bandwidth_efficiency: float = 1.0,
    roof: Roof | None = None,
    parallelism: str | Layout | None = None,
    link: str | None = None,
) -> CapacityPlan:
    """Plan one GPU type (``n_gpus`` of them in one layout) for a model and workload.

    ``parallelism`` is a :class:`Layout` or its text (``"tp4"``, ``"tp2xdp2"``, ``"dp4"``,
    ``"tp4xpp2"``); the default is one tensor-parallel group over all ``n_gpus``. ``link``
    overrides the GPU's interconnect (a catalog key). ``roof`` replaces the datasheet roof
    (e.g. measured ceilings) for a single-stage layout.

    The batch (``users``, a total over replicas) is ``users`` when given; else the smallest
    batch reaching ``target_tokens_per_s``; else the most users that fit in memory AND keep the
    ITL within ``itl_slo_ms``; fewer than ``min_users`` (the minimum batch the service needs)
    misses the SLO. ITL is predicted at the full ``context`` (the worst step of a request).
    TTFT is one prompt of ``prompt_tokens`` (default: ``context``) plus the decode step it
    waits behind. $/M output tokens assumes the GPUs only decode at that batch; $/M input
    tokens assumes they only prefill. Price per GPU-hour: the catalog's, or
    ``price_usd_per_hour``. Energy per output token assumes every GPU draws its TDP.
    """
    require_positive("context", context)
    require_positive("n_gpus", n_gpus)
    require_positive("min_users", min_users)
    for name, value in (
        ("users", users),
        ("target_tokens_per_s", target_tokens_per_s),
        ("itl_slo_ms", itl_slo_ms),
        ("ttft_slo_ms", ttft_slo_ms),
        ("price_usd_per_hour", price_usd_per_hour),
        ("prompt_tokens", prompt_tokens),
    ):
        if value is not None:
            require_positive(name, value)
    lay = _layout(n_gpus, parallelism)
    n_gpus = lay.n_gpus
    spec = get_gpu(gpu)
    shape = as_shape(model)
    prompt_tokens = context if prompt_tokens is None else prompt_tokens
    if prompt_tokens > context:
        raise ValueError(f"prompt_tokens ({prompt_tokens}) cannot exceed context ({context})")
    if roof is not None and lay.pp > 1:
        raise ValueError(
            "a custom roof models one stage: it cannot be combined with pipeline parallelism"
        )
    replica = Layout(lay.tp, lay.pp, 1)
    usd_per_hour = (
        price_usd_per_hour if price_usd_per_hour is not None else spec.price_usd_per_hour
    ) * n_gpus
    fit_kwargs = dict(
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        memory_fraction=memory_fraction,
        overhead_bytes=overhead_bytes,
    )
    per_replica = -(-users // lay.dp) if users else 1
    probe = replica_fit(shape, spec.name, replica, context, per_replica, **fit_kwargs)
    mem_users = probe.max_users
    step_kwargs = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    roof_kwargs = dict(
        dtype=compute_dtype,
        flops_efficiency=flops_efficiency,
        bandwidth_efficiency=bandwidth_efficiency,
        link=link,
    )

    def decode(batch: int):
        if roof is not None:
            step = predict_decode(shape, roof, batch, context, **step_kwargs)
            return step.time_s, step.allreduce_s, 0.0
        step = predict_layout_decode(
            shape, spec.name, replica, batch, context, **roof_kwargs, **step_kwargs
        )
        return step.time_s, step.allreduce_s, step.bubble_fraction

    def itl_s(batch: int) -> float:
        return decode(batch)[0]

    slo_users = mem_users
    if itl_slo_ms is not None and mem_users:
        lo, hi = (
            0,
            mem_users,
        )  # ITL grows with the batch, so bisect for the largest batch within the SLO
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if itl_s(mid) * 1e3 <= itl_slo_ms:
                lo = mid
            else:
                hi = mid - 1
        slo_users = lo

    base = dict(
        gpu=spec.name,
        n_gpus=n_gpus,
        model=shape.name,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        context=context,
        prompt_tokens=prompt_tokens,
        max_users_memory=mem_users * lay.dp,
        max_users_within_slo=slo_users * lay.dp,
        usd_per_hour=usd_per_hour,
        itl_slo_ms=itl_slo_ms,
        ttft_slo_ms=ttft_slo_ms,
        tp=lay.tp,
        pp=lay.pp,
        dp=lay.dp,
        interconnect=(link or spec.interconnect) if lay.tp * lay.pp > 1 else None,
    )
    if mem_users == 0:
        why = (
            "the weights alone do not fit"
            if probe.kv_budget_bytes <= 0
            else "not even one sequence's KV fits next to the weights"
        )
        return CapacityPlan(
            **base,
            fit=probe,
            users=0,
            itl_ms=None,
            ttft_ms=None,
            tokens_per_s=None,
            input_tokens_per_s=None,
            usd_per_m_output_tokens=None,
            usd_per_m_input_tokens=None,
            meets_slo=False,
            why_not=f"{why} on {lay.gpus_per_replica} GPU(s) per replica (short by {probe.shortfall_bytes:,} B)",
        )

    reasons = []
    if users is not None:
        batch = per_replica
    elif target_tokens_per_s is not None:
        batch = next(
            (b for b in _batches_up_to(mem_users) if lay.dp * b / itl_s(b) >= target_tokens_per_s),
            mem_users,
        )
    else:
        batch = max(slo_users, 1)
    fit_report = replica_fit(shape, spec.name, replica, context, batch, **fit_kwargs)
    if not fit_report.fits:
        reasons.append(
            f"{batch} users per replica need {fit_report.shortfall_bytes:,} B more than fit ({mem_users} fit)"
        )
    itl, itl_comm, bubble = decode(batch)
    if roof is not None:
        pre = predict_prefill(shape, roof, 1, prompt_tokens, **step_kwargs)
        prefill, prefill_comm = pre.time_s, pre.allreduce_s
    else:
        pre = predict_layout_prefill(
            shape, spec.name, replica, prompt_tokens, **roof_kwargs, **step_kwargs
        )
        prefill, prefill_comm = pre.time_s, pre.allreduce_s
    ttft = prefill + itl
    total_users = batch * lay.dp
    tokens_per_s = total_users / itl
    input_tokens_per_s = lay.dp * prompt_tokens / prefill
    if itl_slo_ms is not None and itl * 1e3 > itl_slo_ms:
        reasons.append(f"ITL {itl * 1e3:.1f} ms > SLO {itl_slo_ms:g} ms")
    if ttft_slo_ms is not None and ttft * 1e3 > ttft_slo_ms:
        reasons.append(f"TTFT {ttft * 1e3:.0f} ms > SLO {ttft_slo_ms:g} ms")
    if total_users < min_users:
        reasons.append(
            f"only {total_users} users within the SLO and memory, fewer than the minimum {min_users}"
        )
    if target_tokens_per_s is not None and tokens_per_s < target_tokens_per_s:
        reasons.append(f"{tokens_per_s:.0f} tok/s < target {target_tokens_per_s:g}")
    return CapacityPlan(
        **base,
        fit=fit_report,
        users=total_users,
        itl_ms=itl * 1e3,
        ttft_ms=ttft * 1e3,
        tokens_per_s=tokens_per_s,
        input_tokens_per_s=input_tokens_per_s,
        usd_per_m_output_tokens=_usd_per_million(usd_per_hour, tokens_per_s),
        usd_per_m_input_tokens=_usd_per_million(usd_per_hour, input_tokens_per_s),
        meets_slo=not reasons,
        why_not="; ".join(reasons),
        allreduce_ms_per_step=itl_comm * 1e3,
        prefill_allreduce_ms=prefill_comm * 1e3,
        bubble_fraction=bubble,
        joules_per_output_token=n_gpus * spec.tdp_w / tokens_per_s,
    )


def plan_layouts(
    model: ModelLike, gpu: str, n_gpus: int, pipeline: bool = False, **kwargs: Any
) -> list[CapacityPlan]:
    """:func:`plan` for every TP x DP split of ``n_gpus`` (and TP x PP with ``pipeline``), best
    first: SLO met, then most output tokens/s, then fewest GPUs per replica."""
    shape = as_shape(model)
    plans = [
        plan(shape, gpu, lay.n_gpus, parallelism=lay, **kwargs)
        for lay in layouts_for(n_gpus, pipeline=pipeline)
    ]
    return sorted(plans, key=_layout_order)


def _layout_order(p: CapacityPlan) -> tuple:
    return (not p.meets_slo, not p.fits, -(p.tokens_per_s or 0.0), p.tp * p.pp)


@dataclass(frozen=True)
class Recommendation:
    """How many GPUs of one type and which parallelism: the fewest GPUs whose best layout meets
    the SLOs, and among that count's layouts the one with the most output tokens/s."""

    gpu: str
    n_gpus: int | None
    parallelism: str | None
    plan: CapacityPlan | None
    considered: list[CapacityPlan]
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "n_gpus": self.n_gpus,
            "parallelism": self.parallelism,
            "reason": self.reason,
            "plan": self.plan.as_dict() if self.plan else None,
            "considered": [p.row() for p in self.considered],
        }


def recommend(
    model: ModelLike,
    gpu: str,
    counts: tuple[int, ...] = (1, 2, 4, 8),
    pipeline: bool = False,
    **kwargs: Any,
) -> Recommendation:
    """The fewest GPUs of type ``gpu`` (from ``counts``) and the layout that meet the SLOs.

    ``kwargs`` are those of :func:`plan` (context, SLOs, ``users`` or ``target_tokens_per_s``,
    dtypes...). When no count meets them, ``n_gpus`` is ``None`` and ``reason`` says what the
    best attempt missed.
    """
    shape = as_shape(model)
    considered: list[CapacityPlan] = []
    for count in counts:
        plans = plan_layouts(shape, gpu, count, pipeline=pipeline, **kwargs)
        considered.extend(plans)
        best = plans[0]
        if best.meets_slo:
            others = [p for p in plans if p is not best and p.fits and p.tokens_per_s]
            why = f"the fewest {best.gpu} GPUs that meet the SLOs"
            if others:
                alt = others[0]
                why += (
                    f"; {best.parallelism} serves {best.tokens_per_s:,.0f} output tok/s vs "
                    f"{alt.tokens_per_s:,.0f} for {alt.parallelism}"
                )
            return Recommendation(best.gpu, best.n_gpus, best.parallelism, best, considered, why)
    last = sorted(considered, key=_layout_order)[0]
    return Recommendation(
        last.gpu,
        None,
        None,
        None,
        considered,
        f"no layout of up to {max(counts)} GPUs meets the SLOs; closest: {last.n_gpus}x {last.gpu} "
        f"{last.parallelism} ({last.why_not})",
    )


def _batches_up_to(limit: int):
    b = 1
    while b < limit:
        yield b
        b = b + 1 if b < 16 else int(b * 1.25)
    yield limit


GPU_COUNTS = (1, 2, 4, 8)


def compare_gpus(
    model: ModelLike, gpus: list[str] | None = None, n_gpus: int | None = None, **kwargs: Any
) -> list[CapacityPlan]:
    """The best layout per catalog GPU (or ``gpus``), sorted: SLO met first, then by $/M output tokens.

    With ``n_gpus`` each GPU type gets the best layout of that many GPUs (:func:`plan_layouts`).
    With ``n_gpus=None`` it gets the smallest count in (1, 2, 4, 8) whose best layout meets the
    SLOs; if none does, the smallest count where the workload fits (8 when none does, so the
    shortfall still shows).
    """
    shape = as_shape(model)
    plans = []
    for gpu in gpus or list_gpus():
        if n_gpus is not None:
            plans.append(plan_layouts(shape, gpu, n_gpus, **kwargs)[0])
            continue
        first_fit = None
        for count in GPU_COUNTS:
            p = plan_layouts(shape, gpu, count, **kwargs)[0]
            if p.meets_slo:
                break
            if first_fit is None and p.fits and p.users >= 1:
                first_fit = p
        else:
            p = first_fit or p
        plans.append(p)
    return sorted(plans, key=_plan_order)


def _plan_order(p: CapacityPlan) -> tuple:
    cost = p.usd_per_m_output_tokens if p.usd_per_m_output_tokens is not None else float("inf")
    return (not p.meets_slo, not p.fits, cost, p.usd_per_hour)


@dataclass(frozen=True)
class RequestCost:
    """What one request costs on a plan, prefill and decode apart, in USD.

    ``prefill_usd`` is the prompt's tokens at the plan's $ per input token (the GPUs only prefilling),
    ``decode_usd`` the output tokens at its $ per output token (the GPUs only decoding at the plan's
    batch): the GPU time each phase of the request takes, priced at the plan's $/hour.
    """

    prompt_tokens: int
    output_tokens: int
    prefill_usd: float
    decode_usd: float

    @property
    def total_usd(self) -> float:
        return self.prefill_usd + self.decode_usd

    @property
    def prefill_share(self) -> float:
        """The prefill's part of the request's cost, 0 to 1."""
        return self.prefill_usd / self.total_usd if self.total_usd else 0.0

    @property
    def usd_per_m_tokens(self) -> float:
        """The blended price: the request's cost per million tokens of either kind (prompt + output)."""
        return self.total_usd / (self.prompt_tokens + self.output_tokens) * 1e6


def request_cost(p: CapacityPlan, output_tokens: int | None = None) -> RequestCost | None:
    """One request's cost on plan ``p``: ``p.prompt_tokens`` prefilled plus ``output_tokens`` decoded.

    ``output_tokens`` defaults to what the context leaves after the prompt (``context - prompt_tokens``).
    ``None`` when the plan has no price (it does not fit).
    """
    if p.usd_per_m_input_tokens is None or p.usd_per_m_output_tokens is None:
        return None
    output = p.context - p.prompt_tokens if output_tokens is None else output_tokens
    if output < 0:
        raise ValueError(f"output_tokens must be >= 0, got {output}")
    return RequestCost(p.prompt_tokens, output, p.prompt_tokens * p.usd_per_m_input_tokens / 1e6,
                       output * p.usd_per_m_output_tokens / 1e6)


def cheapest(plans: list[CapacityPlan]) -> CapacityPlan | None:
    """The plan with the lowest $/M output tokens among those that meet the SLOs (None if none do)."""
    ok = [p for p in plans if p.meets_slo]
    return min(ok, key=_plan_order) if ok else None


def price_vs_cost(plans: list[CapacityPlan]) -> dict[str, Any] | None:
    """The cheapest GPU per hour vs the cheapest per million output tokens, among plans meeting the SLOs.

    When they differ, the dearer GPU wins on cost per token: it serves enough more tokens per
    hour to more than pay for itself. Returns ``None`` when no plan meets the SLOs.
    """
    ok = [p for p in plans if p.meets_slo]
    if not ok:
        return None
    by_hour = min(ok, key=lambda p: p.usd_per_hour)
    by_token = min(ok, key=_plan_order)
    return {
        "cheapest_per_hour": f"{by_hour.n_gpus}x {by_hour.gpu}",
        "cheapest_per_hour_parallelism": by_hour.parallelism,
        "cheapest_per_token_parallelism": by_token.parallelism,
        "cheapest_per_hour_usd_per_hour": by_hour.usd_per_hour,
        "cheapest_per_hour_usd_per_m_tokens": by_hour.usd_per_m_output_tokens,
        "cheapest_per_token": f"{by_token.n_gpus}x {by_token.gpu}",
        "cheapest_per_token_usd_per_hour": by_token.usd_per_hour,
        "cheapest_per_token_usd_per_m_tokens": by_token.usd_per_m_output_tokens,
        "expensive_gpu_wins": by_token.usd_per_hour > by_hour.usd_per_hour,
        "price_per_hour_ratio": by_token.usd_per_hour / by_hour.usd_per_hour,
        "cost_per_token_ratio": by_hour.usd_per_m_output_tokens / by_token.usd_per_m_output_tokens,
    }


def plan_preset(
    model: ModelLike,
    preset: str | Workload,
    gpu: str | None = None,
    n_gpus: int | None = None,
    **overrides: Any,
) -> list[CapacityPlan]:
    """Plans for a preset workload, on one GPU type or (``gpu=None``) the whole catalog."""
    work = get_preset(preset) if isinstance(preset, str) else preset
    if overrides:
        work = replace(
            work, **{k: v for k, v in overrides.items() if k in Workload.__dataclass_fields__}
        )
    kwargs = dict(
        context=work.context,
        prompt_tokens=work.prompt_tokens,
        itl_slo_ms=work.itl_slo_ms,
        ttft_slo_ms=work.ttft_slo_ms,
        min_users=work.min_users,
        weight_dtype=work.weight_dtype,
        kv_dtype=work.kv_dtype,
    )
    extra = {k: v for k, v in overrides.items() if k not in Workload.__dataclass_fields__}
    kwargs.update(extra)
    if gpu is not None:
        return plan_layouts(model, gpu, n_gpus or 1, **kwargs)
    return compare_gpus(model, n_gpus=n_gpus, **kwargs)
