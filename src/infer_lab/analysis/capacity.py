"""The capacity planner: which GPU, how many users, what latency, and what a million tokens costs.

It combines the memory equation (what fits) with the roofline (how fast) for every GPU in the
catalog. Prices come from the catalog (or your own ``price_usd_per_hour``). All predictions are
roofline bounds: a real engine gets some fraction of them (see notebook 03 for how much).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ..units import require_positive
from .memory import FitReport, ModelLike, as_shape, fit
from .roofline import Roof, gpu_roof, predict_decode, predict_prefill


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
            "throughput + cost",
            "Offline summaries of long documents: fp8 weights and KV, no latency SLO, prefill-heavy.",
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

    When the weights do not fit, ``fit.shortfall_bytes`` says by how much and the latency and
    cost fields are ``None``.
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

    @property
    def fits(self) -> bool:
        return self.fit.fits

    def row(self) -> dict[str, Any]:
        """A flat dict for a table or JSON (GB = 1e9 B for the memory columns)."""
        return {
            "gpu": self.gpu,
            "n_gpus": self.n_gpus,
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
) -> CapacityPlan:
    """Plan one GPU type (``n_gpus`` of them, tensor-parallel) for a model and workload.

    The batch is ``users`` when given; else the smallest batch reaching ``target_tokens_per_s``;
    else the most users that fit in memory AND keep the ITL within ``itl_slo_ms``; fewer than
    ``min_users`` (the minimum batch the service needs) misses the SLO. ITL is
    predicted at the full ``context`` (the worst step of a request). TTFT is one prompt of
    ``prompt_tokens`` (default: ``context``) plus the decode step it waits behind.
    $/M output tokens assumes the GPUs only decode at that batch; $/M input tokens assumes they
    only prefill. Price per GPU-hour: the catalog's, or ``price_usd_per_hour``.
    """
    from ..catalog import get_gpu

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
    spec = get_gpu(gpu)
    shape = as_shape(model)
    prompt_tokens = context if prompt_tokens is None else prompt_tokens
    if prompt_tokens > context:
        raise ValueError(f"prompt_tokens ({prompt_tokens}) cannot exceed context ({context})")
    roof = roof or gpu_roof(
        spec.name, compute_dtype, n_gpus, flops_efficiency, bandwidth_efficiency
    )
    usd_per_hour = (
        price_usd_per_hour if price_usd_per_hour is not None else spec.price_usd_per_hour
    ) * n_gpus
    fit_kwargs = dict(
        n_gpus=n_gpus,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        memory_fraction=memory_fraction,
        overhead_bytes=overhead_bytes,
    )
    probe = fit(shape, spec.memory_bytes, context, users=users or 1, **fit_kwargs)
    mem_users = probe.max_users
    step_kwargs = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype)

    def itl_s(batch: int) -> float:
        return predict_decode(shape, roof, batch, context, **step_kwargs).time_s

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
        max_users_memory=mem_users,
        max_users_within_slo=slo_users,
        usd_per_hour=usd_per_hour,
        itl_slo_ms=itl_slo_ms,
        ttft_slo_ms=ttft_slo_ms,
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
            why_not=f"{why} (short by {probe.shortfall_bytes:,} B)",
        )

    reasons = []
    if users is not None:
        batch = users
    elif target_tokens_per_s is not None:
        batch = next(
            (b for b in _batches_up_to(mem_users) if b / itl_s(b) >= target_tokens_per_s), mem_users
        )
    else:
        batch = max(slo_users, 1)
    fit_report = fit(shape, spec.memory_bytes, context, users=batch, **fit_kwargs)
    if not fit_report.fits:
        reasons.append(
            f"{batch} users need {fit_report.shortfall_bytes:,} B more than fit ({mem_users} fit)"
        )
    itl = itl_s(batch)
    prefill = predict_prefill(shape, roof, 1, prompt_tokens, **step_kwargs).time_s
    ttft = prefill + itl
    tokens_per_s = batch / itl
    if itl_slo_ms is not None and itl * 1e3 > itl_slo_ms:
        reasons.append(f"ITL {itl * 1e3:.1f} ms > SLO {itl_slo_ms:g} ms")
    if ttft_slo_ms is not None and ttft * 1e3 > ttft_slo_ms:
        reasons.append(f"TTFT {ttft * 1e3:.0f} ms > SLO {ttft_slo_ms:g} ms")
    if batch < min_users:
        reasons.append(
            f"only {batch} users within the SLO and memory, fewer than the minimum {min_users}"
        )
    if target_tokens_per_s is not None and tokens_per_s < target_tokens_per_s:
        reasons.append(f"{tokens_per_s:.0f} tok/s < target {target_tokens_per_s:g}")
    return CapacityPlan(
        **base,
        fit=fit_report,
        users=batch,
        itl_ms=itl * 1e3,
        ttft_ms=ttft * 1e3,
        tokens_per_s=tokens_per_s,
        input_tokens_per_s=prompt_tokens / prefill,
        usd_per_m_output_tokens=_usd_per_million(usd_per_hour, tokens_per_s),
        usd_per_m_input_tokens=_usd_per_million(usd_per_hour, prompt_tokens / prefill),
        meets_slo=not reasons,
        why_not="; ".join(reasons),
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
    """:func:`plan` for each catalog GPU (or ``gpus``), sorted: SLO met first, then by $/M output tokens.

    With ``n_gpus=None`` each GPU type gets the smallest count in (1, 2, 4, 8) where the workload
    fits (8 when none does, so the shortfall still shows).
    """
    from ..catalog import list_gpus

    shape = as_shape(model)
    plans = []
    for gpu in gpus or list_gpus():
        if n_gpus is not None:
            plans.append(plan(shape, gpu, n_gpus, **kwargs))
            continue
        for count in GPU_COUNTS:
            p = plan(shape, gpu, count, **kwargs)
            if p.fits and p.users >= 1:
                break
        plans.append(p)
    return sorted(plans, key=_plan_order)


def _plan_order(p: CapacityPlan) -> tuple:
    cost = p.usd_per_m_output_tokens if p.usd_per_m_output_tokens is not None else float("inf")
    return (not p.meets_slo, not p.fits, cost, p.usd_per_hour)


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
        return [plan(model, gpu, n_gpus or 1, **kwargs)]
    return compare_gpus(model, n_gpus=n_gpus, **kwargs)
