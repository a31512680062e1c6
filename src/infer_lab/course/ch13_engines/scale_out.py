"""The page's "When one GPU is not enough" section: the capacity planner's layouts and launch lines (analytic)."""

from __future__ import annotations

from typing import Any

from ... import launchers
from ..tables import Column, people_table

# The capacity planner's question of the scale-out section (inputs, not results).
SCALE_OUT = {"model": "llama-3-70b", "gpu": "H100-SXM", "context": 8192, "itl_slo_ms": 50.0, "min_users": 16}
SCALE_OUT_COLUMNS = [  # the layout beside the GPU count: TP2 and DP2 are both "2 GPUs"
    Column("n_gpus", "GPUs", "int"), Column("parallelism", "layout", "text"), Column("fits", "weights fit", "bool"),
    Column("max_users_memory", "users by memory", "int"),
    Column("max_users_within_slo", "users within the ITL SLO", "int"),
    Column("itl_ms", "ITL (ms)", missing="— (does not fit)"),
    Column("tokens_per_s", "output tokens/s", missing="— (does not fit)"),
    Column("meets_slo", "meets the SLO", "bool"),
]


def scale_out_plan() -> dict[str, Any]:
    """:func:`infer_lab.launchers.scale_out` for :data:`SCALE_OUT` (analytic: roofline bounds)."""
    return launchers.scale_out(**SCALE_OUT)


def scale_out_text(plan: dict[str, Any]) -> str:
    q = SCALE_OUT
    most = max(r["n_gpus"] for r in plan["plans"])
    answer = (f"**{plan['chosen']} GPUs as {plan['parallelism']}**" if plan["chosen"]
              else f"**more than {most} GPUs** (no layout tried meets it)")
    return (f"The capacity planner (chapter 05) for {q['model']} at {q['context']:,} tokens of context, "
            f"{q['min_users']} users within a {q['itl_slo_ms']:g} ms ITL on {q['gpu']} (roofline bounds): "
            f"{answer}. The table lists every layout it tried{_layout_contrast(plan['plans'])}. Launch a "
            "distributed engine for that and measure it with the same loadgen; our engine stays on one device "
            "on purpose.")


def _layout_contrast(plans: list[dict[str, Any]]) -> str:
    """Where one GPU count fits the weights in one layout and not in another (``n_gpus``,
    ``parallelism``, ``fits`` per plan row), a clause naming the first such pair; else ""."""
    for n in sorted({p["n_gpus"] for p in plans}):
        same = [p for p in plans if p["n_gpus"] == n]
        fit = next((p for p in same if p["fits"]), None)
        miss = next((p for p in same if not p["fits"]), None)
        if fit and miss:
            return (f": at {n} GPUs, {fit['parallelism']} fits the weights and {miss['parallelism']} does not "
                    "(a data-parallel replica holds all of them, a tensor-parallel group splits them)")
    return ""


def scale_out_table(plan: dict[str, Any]):
    return people_table(plan["plans"], SCALE_OUT_COLUMNS)


def scale_out_commands(plan: dict[str, Any]) -> str:
    """The vLLM and SGLang launch lines for the planned number of GPUs (a markdown code block)."""
    return "\n".join(["```bash", " ".join(plan["vllm"]), " ".join(plan["sglang"]), "```"])
