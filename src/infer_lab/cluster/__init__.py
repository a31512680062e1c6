"""A serving cluster, simulated: colocated vs prefill/decode disaggregated, on catalog GPUs.

``sim`` is the discrete-event loop, ``costs`` the per-step cost models (roofline or measured),
``workloads`` the arrival traces, ``report`` the metrics, ``scenarios`` the comparisons
(P:D ratio, saturation), ``hetero`` prefill and decode on different GPUs (and the cited
wafer-scale data point), ``attention_ffn`` the analytic attention/FFN split of a large MoE.
"""

from __future__ import annotations

from .costs import LinearStepCost, RooflineStepCost, StepBatch, fit_linear_step_cost
from .report import SLO, ClusterReport, summarize
from .sim import InstanceSpec, SimResult, simulate
from .workloads import WORKLOADS, TraceRequest, make_trace

__all__ = [
    "SLO",
    "WORKLOADS",
    "ClusterReport",
    "InstanceSpec",
    "LinearStepCost",
    "RooflineStepCost",
    "SimResult",
    "StepBatch",
    "TraceRequest",
    "fit_linear_step_cost",
    "make_trace",
    "simulate",
    "summarize",
]
