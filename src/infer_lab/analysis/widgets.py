"""Two interactive tools over the same pure functions: the KV visualizer and the capacity calculator.

* In marimo / molab: :func:`kv_controls` and :func:`capacity_controls` return ``mo.ui.dictionary``
  elements; the notebook passes ``controls.value`` to :func:`kv_visualizer_data` /
  :func:`capacity_table`.
* In Jupyter / Colab: :func:`kv_visualizer_ipywidget` and :func:`capacity_calculator_ipywidget`
  build ipywidgets apps (``pip install ipywidgets``) calling the very same functions.

No GPU is needed: everything is arithmetic on the catalog.
"""

from __future__ import annotations

from typing import Any

from ..units import GB, fmt_bytes, require_positive
from .capacity import cheapest, compare_gpus, plan, price_vs_cost
from .memory import KV_FORMATS, WEIGHT_FORMATS, as_shape, kv_bytes, kv_bytes_per_token, weight_bytes

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
    "itl_slo_ms": 50.0,
    "ttft_slo_ms": 2000.0,
    "memory_fraction": 0.9,
}


def _choices() -> tuple[list[str], list[str]]:
    from ..catalog import list_gpus, list_models

    return list_models(), list_gpus()


# ---------------------------------------------------------------------------------------------
# The pure functions behind both front-ends


def kv_visualizer_data(
    model: str,
    kv_dtype: str = "bf16",
    context: int = 4096,
    users: int = 1,
    gpu: str | None = None,
    weight_dtype: str = "bf16",
    points: int = 48,
) -> dict[str, Any]:
    """KV vs tokens (at ``users``) and KV vs users (at ``context``), in bytes, plus labelled totals."""
    require_positive("context", context)
    require_positive("users", users)
    require_positive("points", points)
    shape = as_shape(model)
    step_t = max(1, (2 * context) // points)
    tokens = list(range(step_t, 2 * context + 1, step_t))
    step_u = max(1, (2 * users) // points)
    user_counts = list(range(step_u, 2 * users + 1, step_u))
    total = kv_bytes(shape, context, users, kv_dtype)
    data = {
        "model": shape.name,
        "attention": shape.attention_kind,
        "kv_dtype": kv_dtype,
        "context": context,
        "users": users,
        "kv_bytes_per_token": kv_bytes_per_token(shape, kv_dtype),
        "kv_bytes_total": total,
        "kv_total_label": fmt_bytes(total),
        "weight_bytes": weight_bytes(shape, weight_dtype).total,
        "tokens": tokens,
        "kv_bytes_vs_tokens": [kv_bytes(shape, t, users, kv_dtype) for t in tokens],
        "user_counts": user_counts,
        "kv_bytes_vs_users": [kv_bytes(shape, context, u, kv_dtype) for u in user_counts],
        "gpu": None,
        "gpu_memory_bytes": None,
    }
    if gpu:
        from ..catalog import get_gpu

        spec = get_gpu(gpu)
        data.update(gpu=spec.name, gpu_memory_bytes=spec.memory_bytes)
    return data


def kv_visualizer_figure(data: dict[str, Any]):
    """Two panels from :func:`kv_visualizer_data`: KV vs tokens and KV vs users (GB = 1e9 B)."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(data["tokens"], [x / GB for x in data["kv_bytes_vs_tokens"]])
    a.set_xlabel("tokens per user")
    a.set_title(f"{data['users']} users", fontsize=9)
    b.plot(data["user_counts"], [x / GB for x in data["kv_bytes_vs_users"]], color="tab:purple")
    b.set_xlabel("concurrent users")
    b.set_title(f"{data['context']} tokens each", fontsize=9)
    for ax in (a, b):
        ax.set_ylabel("KV cache, GB (1e9 B)")
        ax.axhline(data["weight_bytes"] / GB, color="k", ls="--", lw=1, label="weights")
        if data["gpu_memory_bytes"]:
            ax.axhline(
                data["gpu_memory_bytes"] / GB,
                color="r",
                ls=":",
                lw=1,
                label=f"{data['gpu']} memory",
            )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{data['model']} ({data['attention']}), KV in {data['kv_dtype']}: "
        f"{data['kv_bytes_per_token']:,} B/token; {data['users']} x {data['context']} = "
        f"{data['kv_total_label']} (analytic, no hardware)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def capacity_table(
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
) -> tuple[Any, str]:
    """The calculator: a DataFrame of plans (one row per GPU) and a markdown verdict.

    Widget conventions: ``gpu='all'`` compares the catalog (each GPU type at the smallest count
    that fits), ``users=0`` means "as many as the SLO allows", an SLO of 0 means "none".
    """
    import pandas as pd

    kwargs = dict(
        context=int(context),
        users=int(users) or None,
        itl_slo_ms=itl_slo_ms or None,
        ttft_slo_ms=ttft_slo_ms or None,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        memory_fraction=memory_fraction,
    )
    plans = (
        compare_gpus(model, **kwargs) if gpu == "all" else [plan(model, gpu, int(n_gpus), **kwargs)]
    )
    df = pd.DataFrame([p.row() for p in plans])
    best = cheapest(plans)
    if best is None:
        verdict = "**No configuration meets these SLOs.** See `why_not` for each GPU."
    else:
        verdict = (
            f"**Cheapest that meets the SLOs: {best.n_gpus}x {best.gpu}**: {best.users} users, "
            f"ITL {best.itl_ms:.1f} ms, TTFT {best.ttft_ms:.0f} ms, {best.tokens_per_s:,.0f} tok/s, "
            f"${best.usd_per_hour:.2f}/h, ${best.usd_per_m_output_tokens:.3f} per M output tokens "
            "(roofline bounds: a real engine reaches a fraction)."
        )
        paradox = price_vs_cost(plans)
        if paradox and paradox["expensive_gpu_wins"]:
            verdict += (
                f"\n\nThe cheapest per hour, {paradox['cheapest_per_hour']} at "
                f"${paradox['cheapest_per_hour_usd_per_hour']:.2f}/h, costs "
                f"${paradox['cheapest_per_hour_usd_per_m_tokens']:.3f} per M tokens: "
                f"{paradox['cost_per_token_ratio']:.1f}x more per token than {paradox['cheapest_per_token']}."
            )
    return df, verdict


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
            "context": mo.ui.slider(
                256, 131072, step=256, value=d["context"], label="context (tokens)"
            ),
            "users": mo.ui.slider(1, 512, value=d["users"], label="users"),
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
            "weight_dtype": mo.ui.dropdown(
                list(WEIGHT_FORMATS), value=d["weight_dtype"], label="weights"
            ),
            "kv_dtype": mo.ui.dropdown(list(KV_FORMATS), value=d["kv_dtype"], label="KV"),
            "context": mo.ui.number(128, 1_048_576, step=128, value=d["context"], label="context"),
            "users": mo.ui.number(0, 4096, value=d["users"], label="users (0 = max within SLO)"),
            "itl_slo_ms": mo.ui.number(
                0, 10_000, value=d["itl_slo_ms"], label="ITL SLO ms (0 = none)"
            ),
            "ttft_slo_ms": mo.ui.number(
                0, 600_000, value=d["ttft_slo_ms"], label="TTFT SLO ms (0 = none)"
            ),
            "memory_fraction": mo.ui.slider(
                0.5, 1.0, step=0.01, value=d["memory_fraction"], label="memory fraction"
            ),
        }
    )


# ---------------------------------------------------------------------------------------------
# Jupyter / Colab front-end


def _ipywidgets():
    try:
        import ipywidgets
    except ImportError as exc:
        raise ImportError(
            "the Jupyter/Colab widgets need ipywidgets: pip install ipywidgets "
            "(in marimo, use kv_controls / capacity_controls instead)"
        ) from exc
    return ipywidgets


def kv_visualizer_ipywidget():
    """An ipywidgets app (VBox) for the KV visualizer; display it in Jupyter or Colab."""
    w = _ipywidgets()
    models, gpus = _choices()
    d = DEFAULTS_KV
    controls = {
        "model": w.Dropdown(options=models, value=d["model"], description="model"),
        "kv_dtype": w.Dropdown(
            options=list(KV_FORMATS), value=d["kv_dtype"], description="KV dtype"
        ),
        "context": w.IntSlider(
            min=256, max=131072, step=256, value=d["context"], description="context"
        ),
        "users": w.IntSlider(min=1, max=512, value=d["users"], description="users"),
        "gpu": w.Dropdown(options=gpus, value=d["gpu"], description="GPU"),
    }

    def render(**values):
        import matplotlib.pyplot as plt

        kv_visualizer_figure(kv_visualizer_data(**values))
        plt.show()

    out = w.interactive_output(render, controls)
    return w.VBox([w.HBox(list(controls.values())[:3]), w.HBox(list(controls.values())[3:]), out])


def capacity_calculator_ipywidget():
    """An ipywidgets app (VBox) for the capacity calculator; display it in Jupyter or Colab."""
    w = _ipywidgets()
    models, gpus = _choices()
    d = DEFAULTS_CAPACITY
    controls = {
        "model": w.Dropdown(options=models, value=d["model"], description="model"),
        "gpu": w.Dropdown(options=["all", *gpus], value=d["gpu"], description="GPU"),
        "n_gpus": w.BoundedIntText(min=1, max=8, value=d["n_gpus"], description="GPUs"),
        "weight_dtype": w.Dropdown(
            options=list(WEIGHT_FORMATS), value=d["weight_dtype"], description="weights"
        ),
        "kv_dtype": w.Dropdown(options=list(KV_FORMATS), value=d["kv_dtype"], description="KV"),
        "context": w.BoundedIntText(
            min=128, max=1_048_576, step=128, value=d["context"], description="context"
        ),
        "users": w.BoundedIntText(min=0, max=4096, value=d["users"], description="users (0=max)"),
        "itl_slo_ms": w.BoundedFloatText(
            min=0, max=10_000, value=d["itl_slo_ms"], description="ITL SLO ms"
        ),
        "ttft_slo_ms": w.BoundedFloatText(
            min=0, max=600_000, value=d["ttft_slo_ms"], description="TTFT SLO ms"
        ),
        "memory_fraction": w.FloatSlider(
            min=0.5, max=1.0, step=0.01, value=d["memory_fraction"], description="mem frac"
        ),
    }

    def render(**values):
        from IPython.display import Markdown, display

        df, verdict = capacity_table(**values)
        display(Markdown(verdict))
        display(df)

    out = w.interactive_output(render, controls)
    items = list(controls.values())
    return w.VBox([w.HBox(items[:5]), w.HBox(items[5:]), out])
