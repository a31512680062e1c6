"""Predicted next to measured: the rows, their reading, and the shape of a loaded model.

Nothing here measures. The measuring half (the harness timing a loaded model next to the
roofline on this machine's ceilings) is :mod:`infer_lab.bench.hf_predicted`; this module holds
what both it and the chapters compute from configs and saved numbers: :func:`shape_of` and
:func:`dtype_name` of a loaded model, one :func:`comparison_row`, :func:`explain_gaps`, and
:func:`saved_baseline_vs_roofline` for a saved GPU run.
"""

from __future__ import annotations

from typing import Any

from ..shape import ModelShape, model_shape
from .roofline import Roof, predict_decode, predict_prefill

TORCH_DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def shape_of(lm: Any) -> ModelShape:
    """The :class:`ModelShape` of a loaded model, from its live transformers config."""
    cfg = lm.model.config.to_dict()
    cfg.setdefault("_infer_lab", {})["name"] = lm.name
    return model_shape(cfg)


def dtype_name(lm: Any) -> str:
    """``'fp32'``, ``'bf16'`` or ``'fp16'`` for a loaded model's dtype."""
    key = str(lm.dtype)
    if key not in TORCH_DTYPE_NAMES:
        raise ValueError(f"no analytic format for {key}; use fp32, bf16 or fp16")
    return TORCH_DTYPE_NAMES[key]


def comparison_row(
    quantity: str, unit: str, predicted: float, measured: float, **extra: Any
) -> dict[str, Any]:
    """One tidy row: a quantity in ``unit``, predicted and measured, and measured / predicted."""
    row = {
        "quantity": quantity,
        "unit": unit,
        "predicted": predicted,
        "measured": measured,
        "measured_over_predicted": measured / predicted if predicted else None,
    }
    row.update(extra)
    return row


def explain_gaps(rows: list[dict[str, Any]]) -> list[str]:
    """Plain-language reading of the ratios in ``rows`` (computed, not asserted)."""
    out = []
    by = {}
    for r in rows:
        by.setdefault(r["quantity"], []).append(r)
    for q in ("weight bytes", "KV bytes"):
        if q in by:
            worst = max(abs(r["measured_over_predicted"] - 1) for r in by[q])
            out.append(
                f"{q}: analytic and measured agree within {100 * worst:.2f}%"
                + (" (the equation is exact)." if worst < 0.01 else ": check the config parsing.")
            )
    for q, why in (
        (
            "prefill time",
            "small prompts cannot fill the matmul units, and every op pays a fixed "
            "launch/Python cost that the roofline does not count",
        ),
        (
            "decode step time",
            "a decode step is hundreds of small GEMV-shaped ops; each pays a fixed "
            "per-op overhead and reaches a fraction of the copy bandwidth",
        ),
    ):
        if q in by:
            ratios = [r["measured_over_predicted"] for r in by[q]]
            out.append(
                f"{q}: measured is {min(ratios):.1f}x to {max(ratios):.1f}x the roofline prediction; {why}."
            )
    return out


def saved_baseline_vs_roofline(saved: dict[str, Any]) -> list[dict[str, Any]]:
    """Predicted vs measured for a saved HF-baseline GPU run (``infer_lab/results/*hf-baseline*.json``).

    The roof is the ceilings measured in that same run (copy bandwidth, bf16 matmul); the
    measurements are the saved TTFT and decode-step times of HF eager transformers. Rows carry
    the ratio, so the gap (kernel launches dominate the eager decode step) is a computed number.
    """
    data = saved["data"]
    roof = Roof(f"{saved['environment']['device_name']} (measured in that run)",
                data["bf16_matmul_TFLOPs"] * 1e12, data["copy_TBps"] * 1e12, "measured")
    model = saved["model"]
    rows = []
    for r in data["ctx_sweep"]:
        pre = predict_prefill(model, roof, 1, r["ctx"])
        dec = predict_decode(model, roof, 1, r["ctx"])
        rows.append(comparison_row("TTFT (prefill)", "ms", pre.time_s * 1e3, r["ttft_ms"], batch=1, context=r["ctx"]))
        rows.append(comparison_row("decode step (ITL)", "ms", dec.time_s * 1e3, r["itl_ms"], batch=1, context=r["ctx"]))
    for r in data["batch_sweep"]:
        dec = predict_decode(model, roof, r["batch"], 512)
        rows.append(comparison_row("decode step (ITL)", "ms", dec.time_s * 1e3, r["step_ms"], batch=r["batch"], context=512))
    return rows
