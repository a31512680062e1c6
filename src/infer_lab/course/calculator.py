"""The course's two interactive tools: the KV visualizer (chapter 03) and the capacity calculator (05).

Both front-ends call the same pure functions, so marimo, Jupyter and the tour show the same numbers:

* :func:`kv_curves` and :func:`kv_visualizer_figure`: KV bytes against tokens and against users.
* :func:`capacity_plans`, :func:`plans_table` and :func:`verdict`: which GPUs fit a workload,
  at what latency and cost.

Front-ends:

* marimo / molab: :func:`kv_controls` and :func:`capacity_controls` return ``mo.ui.dictionary``
  elements; a cell passes ``controls.value`` to :func:`kv_curves` / :func:`capacity_plans`.
* Jupyter / Colab: :func:`kv_visualizer_ipywidget` and :func:`capacity_calculator_ipywidget`
  build ipywidgets apps (``pip install ipywidgets``) over the very same functions.

No GPU is needed: everything is arithmetic on the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.capacity import CapacityPlan, cheapest, compare_gpus, plan, price_vs_cost
from ..analysis.memory import (
    KV_FORMATS,
    WEIGHT_FORMATS,
    as_shape,
    fit,
    kv_bytes,
    kv_bytes_per_token,
    weight_bytes,
)
from ..catalog import get_gpu, list_gpus, list_models
from ..units import GB, fmt_bytes, human, require_positive
from .ipython import ipywidgets_module, say, show_figure
from .tables import Column, people_table

DEFAULTS_KV = {
    "model": "mistral-7b",
    "kv_dtype": "bf16",
    "context": 4096,
    "users": 80,
    "gpu": "H100-SXM",
}
DEFAULTS_CAPACITY = {
    "model": "mistral-7b",
    "gpu": "all",
    "n_gpus": 1,
    "weight_dtype": "bf16",
    "kv_dtype": "bf16",
    "context": 4096,
    "users": 0,
    "min_users": 1,
    "itl_slo_ms": 50.0,
    "ttft_slo_ms": 2000.0,
    "memory_fraction": 0.9,
}


def _choices() -> tuple[list[str], list[str]]:
    return list_models(), list_gpus()


# ---------------------------------------------------------------------------------------------
# The KV visualizer


@dataclass(frozen=True)
class KVCurves:
    """KV bytes against tokens per user (at ``users``) and against users (at ``context``)."""

    model: str
    attention: str
    kv_dtype: str
    context: int
    users: int
    kv_bytes_per_token: int
    kv_bytes_total: int
    weight_bytes: int  # in ``weight_dtype``
    weight_dtype: str
    tokens: list[int]
    kv_bytes_vs_tokens: list[int]
    user_counts: list[int]
    kv_bytes_vs_users: list[int]
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    kv_budget_bytes: int | None = None  # what the planner's fit leaves for KV on that GPU (after weights, overhead)

    @property
    def kv_total_label(self) -> str:
        """The total in GB and GiB side by side."""
        return fmt_bytes(self.kv_bytes_total)


def kv_curves(
    model: str,
    kv_dtype: str = "bf16",
    context: int = 4096,
    users: int = 1,
    gpu: str | None = None,
    weight_dtype: str = "bf16",
    points: int = 48,
) -> KVCurves:
    """The visualizer's numbers: exact KV bytes up to twice ``context`` and twice ``users``."""
    require_positive("context", context)
    require_positive("users", users)
    require_positive("points", points)
    shape = as_shape(model)
    step_t = max(1, (2 * context) // points)
    tokens = list(range(step_t, 2 * context + 1, step_t))
    step_u = max(1, (2 * users) // points)
    user_counts = list(range(step_u, 2 * users + 1, step_u))
    spec = None
    if gpu:
        spec = get_gpu(gpu)
    return KVCurves(
        model=shape.name,
        attention=shape.attention_kind,
        kv_dtype=kv_dtype,
        context=context,
        users=users,
        kv_bytes_per_token=kv_bytes_per_token(shape, kv_dtype),
        kv_bytes_total=kv_bytes(shape, context, users, kv_dtype),
        weight_bytes=weight_bytes(shape, weight_dtype).total,
        weight_dtype=weight_dtype,
        tokens=tokens,
        kv_bytes_vs_tokens=[kv_bytes(shape, t, users, kv_dtype) for t in tokens],
        user_counts=user_counts,
        kv_bytes_vs_users=[kv_bytes(shape, context, u, kv_dtype) for u in user_counts],
        gpu=spec.name if spec else None,
        gpu_memory_bytes=spec.memory_bytes if spec else None,
        kv_budget_bytes=(fit(shape, spec.memory_bytes, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
                         .kv_budget_bytes if spec else None),
    )


def kv_visualizer_figure(curves: KVCurves):
    """Two panels: KV vs tokens per user and KV vs users, in GB (1e9 B), from zero.

    The dashed line is the weights, the dotted line the GPU's memory (when one is chosen) and the
    dash-dot line the room the planner leaves for KV there (usable memory minus weights and
    overhead): the KV curve crosses that one at the user count the fit reports, well before the
    GPU's line. A dot marks the chosen point (``users`` x ``context``).
    """

    from ..figures import subplots  # defers matplotlib

    fig, (a, b) = subplots(1, 2, figsize=(10, 3.6), sharey=True)
    total = curves.kv_bytes_total / GB
    a.plot(curves.tokens, [x / GB for x in curves.kv_bytes_vs_tokens], label="KV cache")
    a.plot([curves.context], [total], "ko")
    a.set(xlabel="tokens per user (context)", title=f"{curves.users:,} users", xlim=(0, None))
    b.plot(curves.user_counts, [x / GB for x in curves.kv_bytes_vs_users], color="tab:purple", label="KV cache")
    b.plot([curves.users], [total], "ko")
    b.set(xlabel="concurrent users", title=f"{curves.context:,} tokens each", xlim=(0, None))
    top = max(max(curves.kv_bytes_vs_tokens), max(curves.kv_bytes_vs_users), curves.weight_bytes,
              curves.gpu_memory_bytes or 0) / GB
    for ax in (a, b):
        ax.axhline(curves.weight_bytes / GB, color="k", ls="--", lw=1,
                   label=f"weights ({curves.weight_dtype}, {human(curves.weight_bytes / GB, 3)} GB)")
        if curves.gpu_memory_bytes:
            ax.axhline(curves.gpu_memory_bytes / GB, color="r", ls=":", lw=1,
                       label=f"{curves.gpu} memory ({human(curves.gpu_memory_bytes / GB, 3)} GB)")
        if curves.kv_budget_bytes and curves.kv_budget_bytes > 0:
            ax.axhline(curves.kv_budget_bytes / GB, color="tab:green", ls="-.", lw=1,
                       label=f"room for KV after weights + overhead ({human(curves.kv_budget_bytes / GB, 3)} GB)")
        ax.set_ylim(0, top * 1.08)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    a.set_ylabel("GB (10⁹ bytes)")
    fig.suptitle(
        f"{curves.model} ({curves.attention}), KV in {curves.kv_dtype}: {curves.kv_bytes_per_token:,} B/token; "
        f"{curves.users:,} users x {curves.context:,} tokens = {curves.kv_total_label} (analytic, no hardware)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# The capacity calculator


@dataclass(frozen=True)
class CalculatorResult:
    """The calculator's answer: one plan per GPU (or one configuration) and the verdict in words."""

    model: str
    context: int
    plans: list[CapacityPlan]
    verdict: str

    @property
    def best(self) -> CapacityPlan | None:
        return cheapest(self.plans)


def capacity_plans(
    model: str = "mistral-7b",
    gpu: str = "all",
    n_gpus: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    context: int = 4096,
    users: int = 0,
    itl_slo_ms: float = 0.0,
    ttft_slo_ms: float = 0.0,
    memory_fraction: float = 0.9,
    min_users: int = 1,
) -> CalculatorResult:
    """Plan the workload on the catalog (``gpu='all'``) or on ``n_gpus`` of one GPU type.

    Widget conventions: ``gpu='all'`` compares the catalog (each GPU type at the smallest count
    that meets the SLOs), ``users=0`` means "as many as memory and the SLO allow", an SLO of 0
    means "none". ``min_users`` is the minimum batch: the concurrent users (all GPUs of a
    configuration together) the deployment must serve; a configuration that holds fewer within
    memory and the ITL SLO misses, so with ``gpu='all'`` a larger minimum buys more GPUs.
    """
    require_positive("min_users", int(min_users))
    kwargs = dict(
        context=int(context),
        users=int(users) or None,
        min_users=int(min_users),
        itl_slo_ms=itl_slo_ms or None,
        ttft_slo_ms=ttft_slo_ms or None,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        memory_fraction=memory_fraction,
    )
    plans = compare_gpus(model, **kwargs) if gpu == "all" else [plan(model, gpu, int(n_gpus), **kwargs)]
    return CalculatorResult(as_shape(model).name, int(context), plans, verdict(plans))


def verdict(plans: list[CapacityPlan]) -> str:
    """The calculator's answer in markdown: the cheapest plan meeting the SLOs, or why none does."""
    best = cheapest(plans)
    if best is None:
        if not any(p.fits for p in plans):
            least = min(plans, key=lambda p: p.fit.shortfall_bytes)
            return (f"**It does not fit.** The closest, {least.n_gpus}x {least.gpu}, is short by "
                    f"{fmt_bytes(least.fit.shortfall_bytes)}: {least.why_not}.")
        return "**No configuration meets these SLOs and this minimum batch.** The last column says why, for each GPU."
    text = (
        f"**Cheapest that meets the SLOs: {best.n_gpus}x {best.gpu}**: {best.users:,} users, "
        f"ITL {human(best.itl_ms, 3)} ms, TTFT {best.ttft_ms:,.0f} ms, {best.tokens_per_s:,.0f} tokens/s, "
        f"${best.usd_per_hour:.2f}/h, ${human(best.usd_per_m_output_tokens, 3)} per million output tokens "
        "(roofline bounds: a real engine reaches a fraction)."
    )
    paradox = price_vs_cost(plans)
    if paradox and paradox["expensive_gpu_wins"]:
        text += (
            f"\n\nThe cheapest per hour, {paradox['cheapest_per_hour']} at "
            f"${paradox['cheapest_per_hour_usd_per_hour']:.2f}/h, costs "
            f"${human(paradox['cheapest_per_hour_usd_per_m_tokens'])} per million tokens: "
            f"{human(paradox['cost_per_token_ratio'])}× more per token than {paradox['cheapest_per_token']}."
        )
    return text


NOT_FIT = "— (does not fit)"
PLAN_COLUMNS = [
    Column("gpu", "GPU", "text"),
    Column("n_gpus", "GPUs", "int"),
    Column("fits", "fits", "bool"),
    Column("users", "users", "int"),
    Column("max_users_memory", "users memory allows", "int"),
    Column("itl_ms", "ITL (ms)", missing=NOT_FIT),
    Column("ttft_ms", "TTFT (ms)", missing=NOT_FIT),
    Column("tokens_per_s", "output tokens/s", missing=NOT_FIT),
    Column("usd_per_hour", "$ per hour"),
    Column("usd_per_m_output_tokens", "$ per M output tokens", missing=NOT_FIT),
    Column("usd_per_m_input_tokens", "$ per M input tokens", missing=NOT_FIT),
    Column("meets_slo", "meets the SLOs", "bool"),
    Column("why_not", "why not", "text"),
]


def plans_table(plans: list[CapacityPlan]):
    """Plans as a people table: 3 significant figures, units in the headers, "—" when it does not fit."""
    return people_table(plans, PLAN_COLUMNS)


# ---------------------------------------------------------------------------------------------
# marimo front-end


def kv_controls(mo: Any):
    """``mo.ui.dictionary`` of the KV visualizer's inputs (assign it to a global in a cell)."""
    models, gpus = _choices()
    d = DEFAULTS_KV
    return mo.ui.dictionary(
        {
            "model": mo.ui.dropdown(models, value=d["model"], label="model"),
            "kv_dtype": mo.ui.dropdown(list(KV_FORMATS), value=d["kv_dtype"], label="KV dtype"),
            "context": mo.ui.slider(256, 131072, step=256, value=d["context"], label="context (tokens)",
                                    show_value=True),
            "users": mo.ui.slider(1, 512, value=d["users"], label="users", show_value=True),
            "gpu": mo.ui.dropdown(gpus, value=d["gpu"], label="GPU (memory line)"),
        }
    )


def capacity_controls(mo: Any):
    """``mo.ui.dictionary`` of the capacity calculator's inputs."""
    models, gpus = _choices()
    d = DEFAULTS_CAPACITY
    return mo.ui.dictionary(
        {
            "model": mo.ui.dropdown(models, value=d["model"], label="model"),
            "gpu": mo.ui.dropdown(["all", *gpus], value=d["gpu"], label="GPU"),
            "n_gpus": mo.ui.number(1, 8, value=d["n_gpus"], label="GPUs (when one type)"),
            "weight_dtype": mo.ui.dropdown(list(WEIGHT_FORMATS), value=d["weight_dtype"], label="weights"),
            "kv_dtype": mo.ui.dropdown(list(KV_FORMATS), value=d["kv_dtype"], label="KV"),
            "context": mo.ui.number(128, 1_048_576, step=128, value=d["context"], label="context (tokens)"),
            "users": mo.ui.number(0, 4096, value=d["users"], label="users (0 = max within SLO)"),
            "min_users": mo.ui.number(1, 4096, value=d["min_users"], label="minimum batch (users)"),
            "itl_slo_ms": mo.ui.number(0, 10_000, value=d["itl_slo_ms"], label="ITL SLO ms (0 = none)"),
            "ttft_slo_ms": mo.ui.number(0, 600_000, value=d["ttft_slo_ms"], label="TTFT SLO ms (0 = none)"),
            "memory_fraction": mo.ui.slider(0.5, 1.0, step=0.01, value=d["memory_fraction"],
                                            label="memory fraction", show_value=True),
        }
    )


# ---------------------------------------------------------------------------------------------
# Jupyter / Colab front-end


def kv_visualizer_ipywidget():
    """An ipywidgets app (VBox) for the KV visualizer; display it in Jupyter or Colab."""
    w = ipywidgets_module()
    models, gpus = _choices()
    d = DEFAULTS_KV
    controls = {
        "model": w.Dropdown(options=models, value=d["model"], description="model"),
        "kv_dtype": w.Dropdown(options=list(KV_FORMATS), value=d["kv_dtype"], description="KV dtype"),
        "context": w.IntSlider(min=256, max=131072, step=256, value=d["context"], description="context"),
        "users": w.IntSlider(min=1, max=512, value=d["users"], description="users"),
        "gpu": w.Dropdown(options=gpus, value=d["gpu"], description="GPU"),
    }

    def render(**values):
        show_figure(kv_visualizer_figure(kv_curves(**values)))

    out = w.interactive_output(render, controls)
    return w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:]), out])


def capacity_calculator_ipywidget():
    """An ipywidgets app (VBox) for the capacity calculator; display it in Jupyter or Colab."""
    w = ipywidgets_module()
    models, gpus = _choices()
    d = DEFAULTS_CAPACITY
    controls = {
        "model": w.Dropdown(options=models, value=d["model"], description="model"),
        "gpu": w.Dropdown(options=["all", *gpus], value=d["gpu"], description="GPU"),
        "n_gpus": w.BoundedIntText(min=1, max=8, value=d["n_gpus"], description="GPUs"),
        "weight_dtype": w.Dropdown(options=list(WEIGHT_FORMATS), value=d["weight_dtype"], description="weights"),
        "kv_dtype": w.Dropdown(options=list(KV_FORMATS), value=d["kv_dtype"], description="KV"),
        "context": w.BoundedIntText(min=128, max=1_048_576, step=128, value=d["context"], description="context"),
        "users": w.BoundedIntText(min=0, max=4096, value=d["users"], description="users (0=max)"),
        "min_users": w.BoundedIntText(min=1, max=4096, value=d["min_users"], description="minimum batch (users)"),
        "itl_slo_ms": w.BoundedFloatText(min=0, max=10_000, value=d["itl_slo_ms"], description="ITL SLO ms"),
        "ttft_slo_ms": w.BoundedFloatText(min=0, max=600_000, value=d["ttft_slo_ms"], description="TTFT SLO ms"),
        "memory_fraction": w.FloatSlider(min=0.5, max=1.0, step=0.01, value=d["memory_fraction"],
                                         description="mem frac"),
    }

    def render(**values):
        from IPython.display import display  # optional: IPython (Jupyter/Colab only)

        result = capacity_plans(**values)
        say(result.verdict)  # dollars as dollars: Jupyter reads $...$ as LaTeX
        display(plans_table(result.plans).style.hide(axis="index"))

    for control in controls.values():  # whole labels, not "users (0=…"
        control.style.description_width = "initial"
    out = w.interactive_output(render, controls)
    items = list(controls.values())
    return w.VBox([w.HBox(items[:6]), w.HBox(items[6:]), out])
