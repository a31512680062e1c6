"""The analytic model of inference: parameters, the memory equation, the roofline, the capacity planner.

Everything works from a catalog name or an HF ``config.json`` with no weights, and nothing here
measures: ``compare`` reads predictions against measured rows, and the measuring lives in
:mod:`infer_lab.bench` (``bench.hf_predicted``, ``bench.predicted``). The figures, tables and widgets that
show them belong to the course chapters (:mod:`infer_lab.course`), not to this package.
"""

from __future__ import annotations

from ..shape import ModelShape, model_shape
from .capacity import (
    PRESETS,
    CapacityPlan,
    Workload,
    cheapest,
    compare_gpus,
    plan,
    plan_preset,
    price_vs_cost,
)
from .memory import (
    KV_FORMATS,
    WEIGHT_FORMATS,
    activation_workspace_bytes,
    attention_variants,
    context_users_tradeoff,
    fit,
    kv_bytes,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    kv_report,
    max_context,
    max_users,
    weight_bytes,
)
from .params import ParamCounts, param_counts
from .roofline import (
    Roof,
    critical_batch,
    decode_ops,
    gpu_roof,
    measured_roof,
    predict,
    predict_decode,
    predict_prefill,
    prefill_ops,
)

__all__ = [
    "KV_FORMATS",
    "PRESETS",
    "WEIGHT_FORMATS",
    "CapacityPlan",
    "ModelShape",
    "ParamCounts",
    "Roof",
    "Workload",
    "activation_workspace_bytes",
    "attention_variants",
    "cheapest",
    "compare_gpus",
    "context_users_tradeoff",
    "critical_batch",
    "decode_ops",
    "fit",
    "gpu_roof",
    "kv_bytes",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_layer",
    "kv_report",
    "max_context",
    "max_users",
    "measured_roof",
    "model_shape",
    "param_counts",
    "plan",
    "plan_preset",
    "predict",
    "predict_decode",
    "predict_prefill",
    "prefill_ops",
    "price_vs_cost",
    "weight_bytes",
]
