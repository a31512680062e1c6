"""Chapter 16's exercises: moving KV between GPUs, reloading a prefix instead of recomputing it, smaller KV."""

from __future__ import annotations

from ...analysis import memory, roofline
from ...analysis.parallel import p2p_transfer_s
from ...analysis.params import param_counts
from ...catalog import get_gpu, get_interconnect
from . import Exercise
from .checking import Mistake

NUMBER = "16"
SLUG = "where_next"
TITLE = "16 · Where next"

RATIO_TOL = 0.10  # the estimate leaves out attention's own FLOPs, which grow with the prefix

TRANSFER_CASES = (("llama-3-70b", 8192, "infiniband-ndr400"), ("mistral-7b", 32768, "nvlink4-nvswitch"),
                  ("llama-3-8b", 4096, "pcie5-x16"), ("deepseek-v3", 16384, "infiniband-ndr400"))


def check_kv_transfer(fns, r) -> None:
    for model, context, link_name in TRANSFER_CASES:
        link = get_interconnect(link_name)
        per_token = memory.kv_bytes_per_token(model)
        latency = link.base_latency_s + link.hop_latency_s
        case = (f"{model}: a {context:,}-token prompt's KV ({per_token:,} B/token) over {link_name} "
                f"({link.per_direction_gbps:g} GB/s per direction, {latency * 1e6:g} us)")
        got = r.call(fns.kv_transfer_s, context, per_token, link.per_direction_Bps, latency, case=case)
        expected = p2p_transfer_s(memory.kv_bytes(model, context), link)
        r.close(case, got, expected, rel_tol=1e-6, unit="s",
                mistakes=[Mistake(8.0, "8x too large: bytes over bytes/s, no bits"),
                          Mistake(0.5, "half of it: a transfer one way gets the per-direction bandwidth, not "
                                       "the bidirectional headline")])


RELOAD_CASES = (("llama-3-70b", "H100-SXM", "pcie5-x16"), ("mistral-7b", "H100-SXM", "pcie5-x16"),
                ("llama-3-8b", "A100-80GB", "pcie4-x16"), ("qwen2.5-7b", "L40S", "pcie4-x16"))
PREFIX = 2048


def check_recompute_over_reload(fns, r) -> None:
    for model, gpu, link_name in RELOAD_CASES:
        roof, link = roofline.gpu_roof(gpu), get_interconnect(link_name)
        params, per_token = param_counts(model).matmul, memory.kv_bytes_per_token(model)
        case = f"{model} on {gpu}, a {PREFIX:,}-token prefix in CPU memory over {link_name}"
        got = r.call(fns.recompute_over_reload, params, per_token, roof.peak_flops, link.per_direction_Bps, case=case)
        recompute = roofline.predict_prefill(model, roof, 1, PREFIX).time_s
        reload = p2p_transfer_s(memory.kv_bytes(model, PREFIX), link)
        r.close(case, got, recompute / reload, rel_tol=RATIO_TOL,
                wrong={"reload over recompute (the inverse)": reload / recompute},
                mistakes=[Mistake(0.5, "half of it: a multiply-add is 2 FLOP per weight per token")])


KV_DTYPE_CASES = (("llama-3-70b", "H200", 8192, "fp8"), ("mistral-7b", "H100-SXM", 32768, "fp8"),
                  ("llama-3-8b", "L4", 8192, "int8"), ("qwen2.5-7b", "A100-80GB", 16384, "fp8"))


def check_users_after(fns, r) -> None:
    for model, gpu, context, kv_dtype in KV_DTYPE_CASES:
        weight_dtype = "fp8" if model == "llama-3-70b" else "bf16"
        before = memory.fit(model, get_gpu(gpu).memory_bytes, context, weight_dtype=weight_dtype)
        after = memory.fit(model, get_gpu(gpu).memory_bytes, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
        case = (f"{model} on {gpu}, {context:,} tokens: {before.max_users} users with a bf16 KV cache, "
                f"KV budget {before.kv_budget_bytes / 1e9:.1f} GB; now {kv_dtype}")
        got = r.call(fns.users_with_smaller_kv, before.kv_budget_bytes, before.kv_bytes_per_user, 2,
                     memory.kv_bytes_per_element(kv_dtype), case=case)
        r.close(case, got, after.max_users, unit="users",
                wrong={"the old users times two, not the budget over the new per-user bytes":
                       2 * before.max_users} if 2 * before.max_users != after.max_users else None)


EXERCISES = [
    Exercise("kv_transfer_s", "Disaggregated serving: moving the KV", "predict",
             "Predict the time to send a prefilled prompt's KV cache from a prefill GPU to a decode GPU; "
             "checked against analysis.parallel's point-to-point transfer.", check_kv_transfer),
    Exercise("recompute_over_reload", "Offload: reload a prefix or recompute it", "predict",
             "Predict how many times longer recomputing a prefix takes than reloading its KV from CPU memory; "
             "checked against the roofline's prefill and the PCIe transfer (within 10 %).",
             check_recompute_over_reload),
    Exercise("users_with_smaller_kv", "KV compression: more users", "predict",
             "Predict the users that fit once the KV cache is stored in 8 bits; checked against the memory "
             "equation's fit.", check_users_after),
]
