"""Section 3 of chapter 15: the planner's answer and its launch commands (the notebook's ``plan_cluster``)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import launchers
from ...catalog import load_model_config
from ..ch14_tensor_parallel import LayoutRow
from ..notebook_code import notebook_function
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class PlanResult:
    model: str
    hub_id: str
    gpu: str
    context: int
    itl_slo_ms: float
    min_users: int
    chosen: int | None
    parallelism: str | None
    reason: str
    considered: list[LayoutRow]
    vllm: str
    sglang: str
    infer_lab: str
    disaggregated: dict[str, str]  # "engine role" -> command, in launch order (see pd_commands)
    pointers: dict[str, str]
    pd_tp: int = 1  # TP size of each P/D role


# The P/D pair as one procedure on one node with 2 x TP GPUs: each role on its own GPUs, both servers on
# 127.0.0.1 with the proxy or router in front of them on port PD_FRONT_PORT.
PD_PORTS = {"prefill": 8100, "decode": 8200}
PD_FRONT_PORT = 8000
# vLLM's NixlConnector handshake port (VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600): every worker on a host needs
# its own, base + dp_rank x tp_size + tp_rank, so the decode server's base starts past the prefill's TP ranks
# (vLLM's NixlConnector usage guide, docs.vllm.ai, features/nixl_connector_usage).
NIXL_SIDE_CHANNEL_BASE = 5600
# vLLM ships no prefill/decode router in its package: its NixlConnector guide runs this proxy from a clone of
# the vLLM repository (arguments as in that file: --port, --prefiller-hosts/-ports, --decoder-hosts/-ports).
VLLM_PD_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"


def pd_gpus(role: str, tp: int) -> str:
    """CUDA_VISIBLE_DEVICES of one P/D role on a node of 2 x ``tp`` GPUs: prefill the first ``tp``, decode the rest."""
    first = list(PD_PORTS).index(role) * tp
    return ",".join(str(g) for g in range(first, first + tp))


def pd_commands(hub_id: str, tp: int, context: int) -> dict[str, str]:
    """The disaggregated deployment as commands to run in order, on one node with 2 x ``tp`` GPUs: for vLLM
    the prefill server, the decode server and the proxy that sends each request to the first then the second;
    for SGLang the two servers and its router. Keys are "engine role"."""
    out = {}
    for eng in launchers.ENGINES:
        for i, role in enumerate(launchers.DISAGGREGATION_ROLES):
            opts = launchers.EngineOptions(hub_id, tensor_parallel=tp, max_model_len=context, disaggregation=role,
                                           port=PD_PORTS[role])
            env = [f"CUDA_VISIBLE_DEVICES={pd_gpus(role, tp)}"]
            if eng == "vllm":
                env.append(f"VLLM_NIXL_SIDE_CHANNEL_PORT={NIXL_SIDE_CHANNEL_BASE + i * tp}")
            out[f"{eng} {role}"] = " ".join(env + [shlex.join(launchers.build_command(eng, opts, python="python"))])
        hosts = {role: f"http://127.0.0.1:{port}" for role, port in PD_PORTS.items()}
        if eng == "vllm":
            out["vllm proxy"] = shlex.join([
                "python", VLLM_PD_PROXY, "--port", str(PD_FRONT_PORT),
                "--prefiller-hosts", "127.0.0.1", "--prefiller-ports", str(PD_PORTS["prefill"]),
                "--decoder-hosts", "127.0.0.1", "--decoder-ports", str(PD_PORTS["decode"])])
        else:
            out["sglang router"] = shlex.join(launchers.pd_router_command(
                "sglang", [hosts["prefill"]], [hosts["decode"]], port=PD_FRONT_PORT, host="127.0.0.1"))
    return out


def pd_gpus_text(pd_tp: int, chosen: int | None) -> str:
    """How many GPUs the P/D pair needs (one TP group per role) against the planner's colocated count."""
    need = 2 * pd_tp
    head = f"The pair needs **{need} GPUs**, TP{pd_tp} per role"
    if chosen is None:
        return head + "."
    if need > chosen:
        return head + f": {need - chosen} more than the {chosen} the planner chose for one colocated server."
    if need < chosen:
        return head + f": {chosen - need} fewer than the {chosen} the planner chose for one colocated server."
    return head + f": the same {chosen} the planner chose for one colocated server."


def plan_result(sizes: Sizes, rec: Any, scale_out: dict[str, Any], users: int | None = None) -> PlanResult:
    """What the notebook's ``plan_cluster`` returned (the planner's recommendation and its launch
    commands), with the same deployment written for this course's launcher and as P/D servers.
    ``users``: the users asked for, when the page changed them from ``sizes.plan_users``."""
    model, ctx = sizes.plan_model, sizes.plan_context
    hub = load_model_config(model).get("_infer_lab", {}).get("hf_id", model)
    tp = rec.plan.tp if rec.plan else 8
    dp = rec.plan.dp if rec.plan else 1
    ours = shlex.join(["infer-lab", "engines", "launch", "vllm", "--model", hub, "--tp", str(tp)]
                      + (["--dp", str(dp)] if dp > 1 else []) + ["--max-model-len", str(ctx)])
    pd = pd_commands(hub, tp, ctx)
    considered = [LayoutRow(p.gpu, p.parallelism, p.n_gpus, p.interconnect or "—", p.itl_ms, p.tokens_per_s,
                            p.input_tokens_per_s, p.allreduce_ms_per_step, p.meets_slo, p.usd_per_m_output_tokens,
                            p.joules_per_output_token) for p in rec.considered]
    return PlanResult(model, hub, sizes.plan_gpu, ctx, sizes.plan_itl_slo_ms, users or sizes.plan_users, scale_out["chosen"],
                      scale_out["parallelism"], scale_out["reason"], considered, shlex.join(scale_out["vllm"]),
                      shlex.join(scale_out["sglang"]), ours, pd, dict(launchers.DISTRIBUTED_POINTERS), tp)


def run_plan(lm: Any, sizes: Sizes) -> PlanResult:
    """Run the notebook's own experiment (``plan_cluster`` of ``infer_lab/notebooks/15_cluster.py``)."""
    plan = notebook_function(NUMBER, "plan_cluster")
    return plan_result(sizes, *plan(sizes.plan_model, sizes.plan_gpu, sizes.plan_context, sizes.plan_itl_slo_ms,
                                    sizes.plan_users))


def plan_text(p: PlanResult) -> str:
    head = (f"**The planner:** {p.model} for {p.min_users} users at {p.context:,} tokens within {p.itl_slo_ms:.0f} ms "
            f"ITL on {p.gpu}: " + (f"**{p.chosen} GPUs, {p.parallelism}** ({p.reason})." if p.chosen
                                   else f"nothing fits ({p.reason}); the commands are for 8 GPUs."))
    return "\n\n".join([
        head,
        f"Launch it with vLLM:\n\n```\n{p.vllm}\n```\n\nor SGLang:\n\n```\n{p.sglang}\n```\n\nor through this "
        f"course's launcher (same flags, health check, logs):\n\n```\n{p.infer_lab}\n```",
        "Disaggregated prefill/decode, one server per role on its own GPUs, with a proxy in front that sends each "
        "request to the prefill server, then to the decode server with the KV's address. "
        + pd_gpus_text(p.pd_tp, p.chosen) + f" On one node of {2 * p.pd_tp} GPUs, run each block's lines in order "
        f"(each in its own terminal), then send requests to port {PD_FRONT_PORT}. vLLM, with its NixlConnector and the "
        f"proxy script its guide runs from a clone of the vLLM repository:\n\n```\n"
        + "\n".join(v for k, v in p.disaggregated.items() if k.startswith("vllm")) + "\n```\n\nSGLang, with its PD "
        "mode and its router (SGLang's guide adds `--disaggregation-ib-device` to name the RDMA NIC the KV moves "
        "over):\n\n```\n"
        + "\n".join(v for k, v in p.disaggregated.items() if k.startswith("sglang")) + "\n```\n\nAcross two nodes, "
        "bind each server to an address the other node reaches (`--host`), point the proxy or router there, and for "
        "vLLM set `VLLM_NIXL_SIDE_CHANNEL_HOST` on the prefill node to its address, where the decode server fetches "
        "the KV.",
        "Across nodes, with KV-aware routing and autoscaled pools: " + "; ".join(p.pointers.values()) + ".",
        "Our engine stays on one device: it is the from-scratch demonstration of the mechanism, not a distributed "
        "server.",
    ])
