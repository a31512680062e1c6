"""Chapter 05, "Capacity planner": which GPU, how many, how many users, what latency, what cost.

All analytic (:mod:`infer_lab.analysis.capacity`: the memory equation of chapter 03 for what
fits, the roofline of chapter 04 for how fast) over the GPU catalog, so it needs no model and
no GPU, and the notebook runs it live:

1. The calculator (:mod:`infer_lab.course.calculator`): one workload on every catalog GPU.
2. The quality / latency / throughput triangle: three workload presets, planned on the catalog.
3. Context against users: at a fixed GPU and model, every token of context one user gets is
   memory another user cannot have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import matplotlib
import torch

from ..analysis import capacity, memory
from ..analysis.capacity import GPU_COUNTS, CapacityPlan, Workload
from ..catalog import get_gpu, gpu_catalog_about
from ..figures import finish, subplots
from ..units import GB, human
from .calculator import DEFAULTS_CAPACITY, CalculatorResult, capacity_plans, plans_table
from .chapter import ChapterResult, Page, Part, choose_size
from .library_code import code_block
from .tables import Column, people_table

NUMBER = "05"
SLUG = "capacity_planner"
TITLE = "05 · Capacity planner: users, latency and $ per million tokens"
NEEDS_MODEL = False
PARTS = {
    "calculator": "Plan one workload on every catalog GPU (analytic: runs live)",
    "presets": "Plan the three workload presets (analytic: runs live)",
    "tradeoff": "Context against users on one GPU (analytic: runs live)",
}
PRESET_MODELS = ("mistral-7b", "llama-3-8b", "qwen2.5-7b", "llama-3-70b", "gpt-oss-120b")


@dataclass(frozen=True)
class Sizes:
    """Which models the presets and the trade-off cover, on which GPU, at which contexts."""

    size: str
    models: tuple[str, ...]
    tradeoff_gpu: str
    contexts: tuple[int, ...]


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Arithmetic only: ``quick`` plans one model (milliseconds), ``full`` three; the device does not matter."""
    size = choose_size(device, size)
    models = PRESET_MODELS[:1] if size == "quick" else ("mistral-7b", "llama-3-8b", "llama-3-70b")
    steps = 8 if size == "quick" else 10
    return Sizes(size, models, "H100-SXM", tuple(1024 * 2**i for i in range(steps)))


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class PriceVsCost:
    """The cheapest GPU per hour against the cheapest per million tokens (plans meeting the SLOs)."""

    cheapest_per_hour: str
    cheapest_per_hour_parallelism: str
    cheapest_per_token_parallelism: str
    cheapest_per_hour_usd_per_hour: float
    cheapest_per_hour_usd_per_m_tokens: float
    cheapest_per_token: str
    cheapest_per_token_usd_per_hour: float
    cheapest_per_token_usd_per_m_tokens: float
    expensive_gpu_wins: bool
    price_per_hour_ratio: float
    cost_per_token_ratio: float


@dataclass(frozen=True)
class PresetResult:
    """One preset workload planned on the catalog for one model."""

    preset: str
    workload: Workload
    model: str
    plans: list[CapacityPlan]
    best: CapacityPlan | None
    price_vs_cost: PriceVsCost | None


@dataclass(frozen=True)
class TradeoffPoint:
    model: str
    context: int
    max_users: int
    kv_bytes_per_user: int


@dataclass(frozen=True)
class TradeoffResult:
    gpu: str
    memory_bytes: int
    memory_fraction: float
    points: list[TradeoffPoint]


@dataclass
class Result(ChapterResult):
    """Chapter 05's results; a part not run is ``None``."""

    calculator: CalculatorResult | None = None
    presets: list[PresetResult] | None = None
    tradeoff: TradeoffResult | None = None


# ---------------------------------------------------------------------------------------------
# The parts


def plan_presets(model: str, presets: list[str] | None = None) -> list[PresetResult]:
    """Every preset (or ``presets``) planned on the catalog for ``model``."""
    out = []
    for name in presets or list(capacity.PRESETS):
        plans = capacity.plan_preset(model, name)
        paradox = capacity.price_vs_cost(plans)
        out.append(PresetResult(name, capacity.PRESETS[name], model, plans, capacity.cheapest(plans),
                                PriceVsCost(**paradox) if paradox else None))
    return out


def tradeoff(models: tuple[str, ...] | list[str], gpu: str = "H100-SXM", contexts: tuple[int, ...] | None = None,
             memory_fraction: float = 0.9) -> TradeoffResult:
    """Max users at each context on one ``gpu`` (bf16 weights and KV), for each model."""
    spec = get_gpu(gpu)
    contexts = list(contexts or (1024 * 2**i for i in range(8)))
    points = [TradeoffPoint(model, **r) for model in models  # only contexts the model can read at all
              for r in memory.context_users_tradeoff(model, spec.memory_bytes, memory.within_limit(model, contexts),
                                                     memory_fraction=memory_fraction)]
    return TradeoffResult(spec.name, spec.memory_bytes, memory_fraction, points)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row; ``lm`` is not used (pass ``None``)."""
    return PAGE.measure(Result(size=sizes.size), lm, sizes, parts)


# ---------------------------------------------------------------------------------------------
# Words


def fit_code() -> str:
    """What fits, the library's real code (:func:`infer_lab.analysis.memory.fit`), docstring left out."""
    return code_block(memory.fit)


def plan_line(p: CapacityPlan) -> str:
    """One plan in a sentence: what memory allows, what the ITL SLO allows, and what it costs."""
    if not p.fit.fits and p.itl_ms is None:
        return f"**{p.n_gpus}x {p.gpu}, {p.model}: does not fit** ({p.why_not})."
    return (f"**{p.n_gpus}x {p.gpu}, {p.model} at {p.context:,} tokens per user:** memory holds "
            f"**{p.max_users_memory:,} users** (KV budget {human(p.fit.kv_budget_bytes / GB, 3)} GB ÷ "
            f"{human(p.fit.kv_bytes_per_user / GB, 3)} GB per user); the ITL SLO allows "
            f"**{p.max_users_within_slo:,}**; at {p.users:,} users a step takes {human(p.itl_ms, 3)} ms, "
            f"{human(p.tokens_per_s, 3)} tokens/s in total, "
            f"${human(p.usd_per_m_output_tokens, 3)} per million output tokens (roofline bounds).")


def preset_line(p: PresetResult) -> str:
    """The preset's answer in one paragraph, every number from the plans."""
    head = f"**{p.preset}** ({p.workload.corner}, {p.model})"
    if p.best is None:
        if not any(plan.fits for plan in p.plans):
            return f"{head}: it does not fit on any catalog configuration of up to {max(GPU_COUNTS)} GPUs."
        return f"{head}: no configuration meets the SLOs (the table says why for each GPU)."
    b = p.best
    line = (f"{head}: the cheapest per output token meeting the SLOs is {b.n_gpus}x {b.gpu}, {b.users:,} users, "
            f"ITL {human(b.itl_ms, 3)} ms, ${human(b.usd_per_m_output_tokens, 3)} per million output tokens. "
            + request_cost_line(capacity.request_cost(b)))
    pvc = p.price_vs_cost
    if pvc and pvc.expensive_gpu_wins:
        line += (f" The cheapest per hour, {pvc.cheapest_per_hour} at ${pvc.cheapest_per_hour_usd_per_hour:.2f}/h, "
                 f"costs {human(pvc.cost_per_token_ratio, 3)}× more per token than {pvc.cheapest_per_token} at "
                 f"${pvc.cheapest_per_token_usd_per_hour:.2f}/h.")
    elif pvc:
        line += " Here the cheapest GPU per hour is also the cheapest per token."
    return line


REQUESTS_PRICED = 1000  # a request costs fractions of a cent: the words price a thousand of them


def cost_split_words(prefill_usd: float, decode_usd: float) -> str:
    """Which phase of a request costs more, with its share: 'prefill is 62% of the cost, more than decode'."""
    total = prefill_usd + decode_usd
    if total <= 0:
        return "the plan prices it at nothing"
    if prefill_usd == decode_usd:
        return "prefill and decode cost the same"
    larger, smaller = ("prefill", "decode") if prefill_usd > decode_usd else ("decode", "prefill")
    return f"{larger} is {max(prefill_usd, decode_usd) / total:.0%} of the cost, more than {smaller}"


def request_cost_line(cost: capacity.RequestCost | None) -> str:
    """One request's cost in a sentence: prefill and decode apart, and the blended price per million tokens.

    The $ per million *output* tokens prices decode alone; a prefill-heavy workload pays mostly for
    its prompt, so a request's cost is the comparison that holds across workloads.
    """
    if cost is None:
        return ""
    per = REQUESTS_PRICED
    return (f"{per:,} requests of {cost.prompt_tokens:,} prompt + {cost.output_tokens:,} output tokens cost "
            f"${human(per * cost.total_usd, 3)}: prefill ${human(per * cost.prefill_usd, 3)}, decode "
            f"${human(per * cost.decode_usd, 3)}; {cost_split_words(cost.prefill_usd, cost.decode_usd)}. Per million "
            f"tokens of either kind that is ${human(cost.usd_per_m_tokens, 3)}.")


def tradeoff_text(result: TradeoffResult) -> str:
    lines = []
    for model in dict.fromkeys(p.model for p in result.points):
        pts = [p for p in result.points if p.model == model]
        first, last = pts[0], pts[-1]
        if first.max_users == 0:
            lines.append(f"- {model} does not fit on one {result.gpu} at any of these contexts: not even one "
                         f"{first.context:,}-token user fits beside the weights.")
            continue
        lines.append(f"- {model} on one {result.gpu}: {first.max_users:,} users at {first.context:,} tokens, "
                     f"{last.max_users:,} at {last.context:,}"
                     + (f" (its limit is {memory.context_limit(model):,} positions: longer contexts are left out)."
                        if last.context >= memory.context_limit(model) else "."))
    return "\n".join(lines)


def price_note() -> str:
    about = gpu_catalog_about()
    return f"{about['price_note']} (dated {about['price_date']})"


# ---------------------------------------------------------------------------------------------
# Tables and figures


NO_SLO = "— (none)"
WORKLOAD_COLUMNS = [
    Column("name", "preset", "text"), Column("corner", "corners of the triangle", "text"),
    Column("description", "what it promises", "text"), Column("context", "context (tokens)", "int"),
    Column("prompt_tokens", "prompt (tokens)", "int"), Column("itl_slo_ms", "ITL SLO (ms)", missing=NO_SLO),
    Column("ttft_slo_ms", "TTFT SLO (ms)", missing=NO_SLO), Column("weight_dtype", "weights", "text"),
    Column("kv_dtype", "KV", "text"), Column("min_users", "min users", "int"),
]
TRADEOFF_COLUMNS = [
    Column("model", "model", "text"), Column("context", "context (tokens)", "int"),
    Column("max_users", "max users", "int"), Column("kv_bytes_per_user", "KV per user", "bytes"),
]


def workloads_table():
    """The three presets: what each promises its users (workload definitions, not hardware facts)."""
    return people_table(list(capacity.PRESETS.values()), WORKLOAD_COLUMNS)


def tradeoff_table(result: TradeoffResult):
    return people_table(result.points, TRADEOFF_COLUMNS)


def cost_figure(plans: list[CapacityPlan], title: str):
    """$ per hour against $ per million output tokens, one point per configuration that fits (log-log)."""
    fig, ax = subplots(figsize=(7, 4))
    shown = [p for p in plans if p.usd_per_m_output_tokens is not None]
    for p in shown:
        ax.scatter(p.usd_per_hour, p.usd_per_m_output_tokens, color="tab:green" if p.meets_slo else "tab:red")
        ax.annotate(f"{p.n_gpus}x {p.gpu}", (p.usd_per_hour, p.usd_per_m_output_tokens), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    if shown:
        xs = [p.usd_per_hour for p in shown]
        ys = [p.usd_per_m_output_tokens for p in shown]
        ax.set_xlim(min(xs) / 1.5, max(xs) * 2)
        ax.set_ylim(min(ys) / 1.5, max(ys) * 1.5)
    ax.set(xscale="log", yscale="log", xlabel="$ per hour, all GPUs of the configuration (log scale)",
           ylabel="$ per million output tokens (log scale)")
    missing = len(plans) - len(shown)
    ax.set_title(f"{title}\ngreen: meets the SLOs, red: misses" + (f"; {missing} do not fit" if missing else ""),
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig


def calculator_figure(calc: CalculatorResult):
    return cost_figure(calc.plans, f"{calc.model}, context {calc.context:,}: roofline bounds, catalog prices "
                                   "(analytic, no hardware measured)")


def tradeoff_figure(result: TradeoffResult):
    """Max users against context, log-log from one user up; a context where nobody fits is marked."""
    fig, ax = subplots(figsize=(6.5, 3.8))
    top = max([p.max_users for p in result.points] + [1])
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, model in enumerate(dict.fromkeys(p.model for p in result.points)):
        color = colors[i % len(colors)]
        pts = [p for p in result.points if p.model == model]
        fits = [p for p in pts if p.max_users >= 1]
        if fits:
            ax.plot([p.context for p in fits], [p.max_users for p in fits], marker="o", color=color, label=model)
        for p in fits:
            ax.annotate(f"{p.max_users:,}", (p.context, p.max_users), fontsize=7, xytext=(0, 5),
                        textcoords="offset points", ha="center", color=color)
        gone = [p for p in pts if p.max_users < 1]
        if gone:
            ax.scatter([p.context for p in gone], [0.7] * len(gone), marker="x", color=color,
                       label=f"{model}: not one user fits")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(0.5, top * 3)
    ax.set(xlabel="context per user (tokens), log scale", ylabel="max concurrent users, log scale")
    ax.set_title(f"Context against users on one {result.gpu} ({human(result.memory_bytes / GB, 3)} GB, "
                 f"{result.memory_fraction:.0%} usable), bf16: analytic", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig


def _calculator_tables(result: Result) -> dict[str, Any]:
    c = result.calculator
    return {f"Calculator: {c.model} at {c.context:,} tokens on the catalog": plans_table(c.plans)}


def _presets_tables(result: Result) -> dict[str, Any]:
    return {"The workload presets": workloads_table(),
            **{f"{p.preset}, {p.model}": plans_table(p.plans) for p in result.presets}}


PAGE = Page(
    PARTS,
    Part("calculator", lambda lm, sizes: capacity_plans(**{**DEFAULTS_CAPACITY, "model": sizes.models[0]}),
         text=lambda r: f"Calculator, {r.calculator.model} at {r.calculator.context:,} tokens: {r.calculator.verdict}",
         tables=_calculator_tables, figures=lambda r: {"cost": calculator_figure(r.calculator)}),
    Part("presets", lambda lm, sizes: [p for m in sizes.models for p in plan_presets(m)],
         text=lambda r: [preset_line(p) for p in r.presets], tables=_presets_tables),
    Part("tradeoff", lambda lm, sizes: tradeoff(sizes.models, sizes.tradeoff_gpu, sizes.contexts),
         text=lambda r: tradeoff_text(r.tradeoff),
         tables=lambda r: {f"Context against users on one {r.tradeoff.gpu}": tradeoff_table(r.tradeoff)},
         figures=lambda r: {"tradeoff": tradeoff_figure(r.tradeoff)}),
)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, "")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> None:
    """Nothing saved from a GPU: the planner is arithmetic on the catalog, the same on every machine."""
    return None
