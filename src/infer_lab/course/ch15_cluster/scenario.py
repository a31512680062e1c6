"""Chapter 15's identity (number, title, parts), the settings its experiments share and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...cluster.report import SLO
from ..ch14_tensor_parallel import TP_QUESTIONS
from ..chapter import choose_size

NUMBER = "15"
SLUG = "cluster"
TITLE = "15 · The cluster: disaggregation, heterogeneous GPUs, the planner, the simulator checked"
NEEDS_MODEL = True
PARTS = {
    "cluster": "Simulate colocated vs disaggregated serving",
    "hetero": "Heterogeneous hardware and the attention/FFN split",
    "plan": "The planner's answer and its launch command",
    "check": "Check the simulator against our engine",
}
# Parts that need no model and measure nothing here (computed or simulated): the saved-only deck keeps them.
ANALYTIC_PARTS = ("cluster", "hetero", "plan")
WORKLOADS = ("summarize", "story")  # prefill-heavy, decode-heavy
SERVING_SLO = SLO(2000.0, 50.0)  # TTFT 2 s, TPOT 50 ms
# What the page's cells start at (each cell reads its own here, and so does the chapter's runner):
CLUSTER_GPUS = 4  # GPUs of the simulated cluster ("cluster")
CHECK_SLOTS = 3  # batch slots of the engine and the simulator, fewer than the prompts ("check")
HETERO_GPUS = ("H100-SXM", "H200")  # the GPU types the heterogeneous pick chooses from ("hetero")
HETERO_SPLIT = (1, 3)  # prefill GPUs, decode GPUs ("hetero")
AFD_MODEL, AFD_GPU, AFD_GPUS, AFD_CONTEXT = "deepseek-v3", "H100-SXM", 16, 8192
CHECK_QUESTIONS = TP_QUESTIONS  # the same chat questions as chapter 14's TP run


@dataclass(frozen=True)
class Sizes:
    """What each part runs: the simulated cluster, the planner's question and the engine check."""

    size: str
    cluster_model: str
    cluster_gpu: str
    cluster_requests: int
    plan_model: str
    plan_gpu: str
    plan_context: int
    plan_users: int
    plan_itl_slo_ms: float
    check_prompts: int
    check_new_tokens: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Quick: 60 simulated requests per workload and 6 short prompts on the engine (a few seconds)."""
    size = choose_size(device, size)
    common = dict(cluster_model="llama-3-8b", cluster_gpu="H100-SXM", plan_model="llama-3-70b", plan_gpu="H100-SXM",
                  plan_context=8192, plan_users=16, plan_itl_slo_ms=30.0)
    if size == "quick":
        return Sizes(size, cluster_requests=60, check_prompts=6, check_new_tokens=6, **common)
    return Sizes(size, cluster_requests=300, check_prompts=12, check_new_tokens=12, **common)
