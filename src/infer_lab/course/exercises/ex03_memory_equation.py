"""Chapter 03's exercises: the often-quoted 42 GB, MLA's cache, quantized weight bytes, and who fits."""

from __future__ import annotations

import math

from ...analysis import memory
from ...analysis.params import param_counts
from ...catalog import get_gpu
from ...shape import load_config, model_shape
from ...units import GB
from . import Exercise
from .checking import GIB_FOR_GB, Mistake, _as_float, factor_of_2, forgot_layers, gib_not_gb

NUMBER = "03"
SLUG = "memory_equation"
TITLE = "03 · The memory equation"

# Llama-3.1-70B: Llama-3-70B's KV shape with the 131,072-token context this case needs (Llama-3 stops at 8,192).
TALK_MODEL, TALK_CONTEXT = "llama-3.1-70b", 128 * 1024


def check_kv_gb_70b_128k(fns, r) -> None:
    s = model_shape(TALK_MODEL)
    case = f"{TALK_MODEL}, one sequence of {TALK_CONTEXT:,} tokens, bf16 KV, in GB"
    got = r.call(fns.kv_gb_70b_128k, case=case)
    thousand = 128_000 / TALK_CONTEXT
    expected = memory.kv_bytes(TALK_MODEL, TALK_CONTEXT, 1, "bf16") / GB
    value = _as_float(got)
    if value is not None and value.is_integer() and abs(value - expected) < 1:
        r.record(case, False, f"expected {expected:.4g} GB, got {value:g} GB: that is the answer rounded to whole "
                              "GB (the talk's rounding); give the equation's value to 3 significant figures")
        return
    r.close(case, got, expected, rel_tol=0.005, unit="GB",
            mistakes=[gib_not_gb(),
                      Mistake(thousand, f"128k here is 128 x 1024 = {TALK_CONTEXT:,} tokens, not 128,000"),
                      Mistake(thousand * GIB_FOR_GB, "two slips: GiB instead of GB, and 128,000 tokens "
                                                     f"instead of {TALK_CONTEXT:,}"),
                      Mistake(0.5, "half of it: count both K and V"),
                      forgot_layers(s.layers),
                      Mistake(s.heads / s.kv_heads, f"{s.heads // s.kv_heads}x too large: the cache holds the "
                                                    f"{s.kv_heads} KV heads, not the {s.heads} query heads (GQA)")])


def _mla_configs() -> list[tuple[str, dict]]:
    v3 = load_config("deepseek-v3")
    lite = dict(v3, num_hidden_layers=27, first_k_dense_replace=1, kv_lora_rank=512, qk_rope_head_dim=64)
    narrow = dict(v3, num_hidden_layers=40, kv_lora_rank=256, qk_rope_head_dim=32)
    return [("deepseek-v3", v3), ("a 27-layer MLA model (DeepSeek-V2-Lite's cache)", lite),
            ("a made-up 40-layer MLA with latent 256, RoPE key 32", narrow)]


def check_mla_kv(fns, r) -> None:
    for name, config in _mla_configs():
        s = model_shape(config)
        for kv_dtype in ("bf16", "fp8"):
            nbytes = memory.kv_bytes_per_element(kv_dtype)
            case = (f"{name}: {s.layers} layers, latent {s.mla.kv_lora_rank}, RoPE key {s.mla.qk_rope_head_dim}, "
                    f"{kv_dtype}")
            got = r.call(fns.mla_kv_bytes_per_token, s.layers, s.mla.kv_lora_rank, s.mla.qk_rope_head_dim,
                         nbytes, case=case)
            naive = memory.naive_kv_bytes_per_token(s, kv_dtype)
            r.close(case, got, memory.kv_bytes_per_token(s, kv_dtype), unit="B/token",
                    mistakes=[forgot_layers(s.layers),
                              Mistake(2.0, "twice the answer: MLA caches ONE latent (plus the RoPE key), "
                                           "not a K and a V")],
                    wrong={"the GQA formula applied blindly (2 x layers x KV heads x head dim)": naive})


WEIGHT_CASES = (("llama-3-70b", "int4"), ("llama-3-70b", "int8"), ("mistral-7b", "nf4"),
                ("gpt-oss-120b", "mxfp4"), ("llama-3-8b", "bf16"))
# Small tensors whose last group is partial and whose bits are no whole number of bytes:
# (what, weights, format). A 4-bit tensor of 1,001 values, a 3-value bias, one 8-bit row of 4,100.
SMALL_CASES = (("a 4-bit tensor of 1,001 values", 1001, "int4"), ("a 3-value bias", 3, "nf4"),
               ("an 8-bit row of 4,100 values", 4100, "int8"), ("5 values in mxfp4", 5, "mxfp4"))


def check_weight_bytes(fns, r) -> None:
    cases = [(f"{model}'s {param_counts(model).matmul:,} matmul weights", param_counts(model).matmul, dtype)
             for model, dtype in WEIGHT_CASES] + list(SMALL_CASES)
    for what, n, dtype in cases:
        fmt = memory.weight_format(dtype)
        group = f"one {fmt.scale_bits}-bit scale per {fmt.group_size}" if fmt.group_size else "no scales"
        case = f"{what} in {dtype} ({fmt.bits} bits, {group})"
        got = r.call(fns.quantized_bytes, n, fmt.bits, fmt.group_size, fmt.scale_bits, case=case)
        expected = fmt.bytes_for(n)
        wrong = {}
        if fmt.group_size:
            wrong["the codes without their scales"] = n * fmt.bits / 8
            if n % fmt.group_size:
                wrong["full groups only: the short last group has a scale too (round the groups UP)"] = \
                    math.ceil((n * fmt.bits + n // fmt.group_size * fmt.scale_bits) / 8)
                wrong["a fractional number of groups: a group, even a short one, stores one whole scale"] = \
                    (n * fmt.bits + n / fmt.group_size * fmt.scale_bits) / 8
        bits = n * fmt.bits + (math.ceil(n / fmt.group_size) * fmt.scale_bits if fmt.group_size else 0)
        if bits % 8:
            wrong["the bytes rounded down: a partly used byte is still stored (round UP)"] = bits // 8
            wrong.setdefault("fractional bytes: storage comes in whole bytes (round UP)", bits / 8)
        # Large tensors: a float answer within float32's precision of the byte count is the right formula.
        r.close(case, got, expected, rel_tol=1e-6 if n > 10**6 else 0.0, unit="B",
                mistakes=[Mistake(8.0, "8x too large: bits where bytes were asked")], wrong=wrong or None)


FIT_CASES = (("mistral-7b", "H100-SXM", 4096, "bf16"), ("llama-3-8b", "L4", 8192, "bf16"),
             ("llama-3-70b", "H200", 8192, "fp8"), ("llama-3-70b", "H100-SXM", 4096, "bf16"))


def check_max_users(fns, r) -> None:
    for model, gpu, context, weight_dtype in FIT_CASES:
        fit = memory.fit(model, get_gpu(gpu).memory_bytes, context, weight_dtype=weight_dtype)
        case = (f"{model} ({weight_dtype} weights) on one {gpu}, {context:,} tokens each: usable {fit.usable_bytes / GB:.1f} GB, "
                f"weights {fit.weight_bytes / GB:.1f} GB, overhead {fit.overhead_bytes / GB:.2f} GB")
        got = r.call(fns.max_users, fit.usable_bytes, fit.weight_bytes, fit.overhead_bytes,
                     fit.kv_bytes_per_user, case=case)
        hint = "nobody fits when the weights and overhead leave no room (not a negative number)" \
            if fit.kv_budget_bytes < 0 else ""
        budget = fit.kv_budget_bytes
        wrong = {"the budget without the overhead": (budget + fit.overhead_bytes) // fit.kv_bytes_per_user}
        if budget > 0:
            wrong["not rounded down to whole users"] = budget / fit.kv_bytes_per_user
            if budget % fit.kv_bytes_per_user:
                wrong["rounded up: a user whose KV does not fit whole is not served (round DOWN)"] = \
                    -(-budget // fit.kv_bytes_per_user)
        r.close(case, got, fit.max_users, unit="users", hint=hint, mistakes=factor_of_2(), wrong=wrong)


EXERCISES = [
    Exercise("kv_gb_70b_128k", "The often-quoted 42 GB", "predict",
             f"Predict the KV cache of one 128k-token sequence on {TALK_MODEL} (Llama-3-70B's KV shape with a "
             f"{load_config(TALK_MODEL)['max_position_embeddings']:,}-position context) in GB; checked against the "
             "memory equation on its config.", check_kv_gb_70b_128k),
    Exercise("mla_kv_bytes_per_token", "What MLA caches", "implement",
             "Compute the KV bytes per token of a Multi-head Latent Attention model; checked against the "
             "memory equation for DeepSeek-V3 and other MLA shapes.", check_mla_kv),
    Exercise("quantized_bytes", "Bytes of quantized weights", "implement",
             "Compute the bytes of n weights stored in b bits with one scale per group; checked against "
             "the weight formats of the memory equation.", check_weight_bytes),
    Exercise("max_users", "How many users fit", "implement",
             "From usable memory, weights, overhead and the KV of one user, compute how many users fit; "
             "checked against the memory equation's fit on catalog GPUs.", check_max_users),
]
