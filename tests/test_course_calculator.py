"""The course's calculator and KV visualizer: the same functions behind marimo and ipywidgets."""

from __future__ import annotations

import pytest

from infer_lab.analysis import memory
from infer_lab.catalog import get_gpu, list_gpus
from infer_lab.course import calculator


def test_kv_curves_match_the_equation():
    d = calculator.kv_curves("mistral-7b", context=4096, users=80, gpu="H100-SXM")
    assert d.kv_bytes_total == memory.kv_bytes("mistral-7b", 4096, 80)
    assert d.kv_bytes_vs_tokens[-1] == memory.kv_bytes("mistral-7b", d.tokens[-1], 80)
    assert d.kv_bytes_vs_users[0] == memory.kv_bytes("mistral-7b", 4096, d.user_counts[0])
    assert "42.9 GB" in d.kv_total_label and "40 GiB" in d.kv_total_label
    assert d.gpu_memory_bytes == get_gpu("H100-SXM").memory_bytes
    fig = calculator.kv_visualizer_figure(d)
    assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)  # bytes start at zero


def test_capacity_calculator_widget_conventions():
    result = calculator.capacity_plans("mistral-7b", gpu="all", itl_slo_ms=50)
    assert len(result.plans) == len(list_gpus())
    assert "Cheapest" in result.verdict and result.plans[0].meets_slo
    one = calculator.capacity_plans("mistral-7b", gpu="H200", n_gpus=2, users=10)
    assert [p.n_gpus for p in one.plans] == [2] and [p.users for p in one.plans] == [10]
    table = calculator.plans_table(result.plans)
    assert len(table) == len(list_gpus()) and table.iloc[0]["meets the SLOs"] == "yes"


def test_calculator_says_when_the_model_does_not_fit_and_by_how_much():
    result = calculator.capacity_plans("llama-3-70b", gpu="T4", n_gpus=1)
    assert not result.plans[0].fits
    assert "does not fit" in result.verdict and "short by" in result.verdict
    assert "does not fit" in calculator.plans_table(result.plans).iloc[0]["ITL (ms)"]


def test_marimo_controls_feed_the_pure_functions():
    import marimo as mo

    kv = calculator.kv_controls(mo)
    assert calculator.kv_curves(**kv.value).model == kv.value["model"]
    cap = calculator.capacity_controls(mo)
    assert len(calculator.capacity_plans(**cap.value).plans) > 0


def test_ipywidgets_builders_construct():
    ipywidgets = pytest.importorskip("ipywidgets")
    assert isinstance(calculator.kv_visualizer_ipywidget(), ipywidgets.VBox)
    assert isinstance(calculator.capacity_calculator_ipywidget(), ipywidgets.VBox)


def test_the_minimum_batch_is_a_knob_that_can_fail_a_plan_and_buy_gpus():
    """The talk's second dimension: the fewest concurrent users a deployment must serve."""
    one = calculator.capacity_plans("mistral-7b", gpu="H100-SXM", n_gpus=1, itl_slo_ms=50).plans[0]
    within = one.users  # what one H100 holds within memory and the SLO
    assert one.meets_slo
    met = calculator.capacity_plans("mistral-7b", gpu="H100-SXM", n_gpus=1, itl_slo_ms=50, min_users=within)
    assert met.plans[0].meets_slo and "Cheapest" in met.verdict
    missed = calculator.capacity_plans("mistral-7b", gpu="H100-SXM", n_gpus=1, itl_slo_ms=50,
                                       min_users=within + 1)
    assert not missed.plans[0].meets_slo and f"fewer than the minimum {within + 1}" in missed.plans[0].why_not
    assert "No configuration meets" in missed.verdict
    # On the whole catalog a larger minimum buys more GPUs of the same type instead of failing.
    catalog = {p.gpu: p for p in calculator.capacity_plans("mistral-7b", itl_slo_ms=50, min_users=within + 1).plans}
    assert catalog["H100-SXM"].n_gpus > 1 and catalog["H100-SXM"].meets_slo
    assert catalog["H100-SXM"].users >= within + 1
    with pytest.raises(ValueError):
        calculator.capacity_plans("mistral-7b", min_users=0)


def test_the_minimum_batch_control_reaches_the_planner():
    import marimo as mo

    cap = calculator.capacity_controls(mo)
    assert cap.value["min_users"] == calculator.DEFAULTS_CAPACITY["min_users"]
    result = calculator.capacity_plans(**{**cap.value, "gpu": "H100-SXM", "min_users": 10_000})
    assert not result.plans[0].meets_slo and "fewer than the minimum 10000" in result.plans[0].why_not
