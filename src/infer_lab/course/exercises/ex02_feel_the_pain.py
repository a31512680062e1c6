"""Chapter 02's exercises: the KV bytes the cache holds, and the floor under every decode step."""

from __future__ import annotations

import torch

from ...analysis.memory import kv_bytes_per_token, weight_bytes
from ...analysis.roofline import gpu_roof, predict_decode
from ...engine.kv_cache import SlotStore
from ...shape import model_shape
from . import Exercise
from .checking import Mistake, factor_of_2, forgot_layers

NUMBER = "02"
SLUG = "feel_the_pain"
TITLE = "02 · Feel the pain"

ITL_TOL = 0.08  # the roofline reads the LM head, not the whole embedding table, and counts activations
DTYPES = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}


def _store_bytes_per_token(model: str, dtype: torch.dtype) -> int:
    """K and V bytes of one token in every layer, from the engine's own KV tensors (numel x element size)."""
    shape = model_shape(model)
    return SlotStore(shape.layers, 1, shape.kv_heads, shape.head_dim, dtype, torch.device("cpu")).bytes_per_token


def check_kv_cache_bytes(fns, r) -> None:
    for model, dtype, tokens, users in (("smollm2-135m", "fp32", 512, 1), ("smollm2-135m", "fp32", 2048, 8),
                                        ("smollm2-135m", "bf16", 1024, 4), ("mistral-7b", "bf16", 4096, 80)):
        s = model_shape(model)
        torch_dtype, nbytes = DTYPES[dtype]
        case = (f"{model} ({s.layers} layers, {s.kv_heads} KV heads, head dim {s.head_dim}), {dtype}, "
                f"{tokens:,} tokens x {users} users")
        got = r.call(fns.kv_cache_bytes, s.layers, s.kv_heads, s.head_dim, tokens, users, nbytes, case=case)
        mistakes = [Mistake(0.5, "half of it: the cache holds a K AND a V vector per KV head"),
                    forgot_layers(s.layers), Mistake(8.0, "8x too large: bits where bytes were asked")]
        if users > 1:
            mistakes.append(Mistake(1 / users, f"off by the users ({users}): every user has a cache of their own"))
        r.close(case, got, _store_bytes_per_token(model, torch_dtype) * tokens * users, unit="B", mistakes=mistakes)


ITL_CASES = (("mistral-7b", "H100-SXM", 16, 4096), ("llama-3-70b", "H200", 8, 8192),
             ("llama-3-8b", "A100-80GB", 32, 2048), ("smollm2-135m", "L4", 64, 512))


def check_itl_floor(fns, r) -> None:
    for model, gpu, batch, context in ITL_CASES:
        roof = gpu_roof(gpu)
        weights, kv = weight_bytes(model).total, kv_bytes_per_token(model)
        case = f"{model} on {gpu}: batch {batch}, context {context:,}"
        got = r.call(fns.itl_floor_s, weights, kv, context, batch, roof.bandwidth_Bps, case=case)
        step = predict_decode(model, roof, batch, context)
        wrong = {"the weights alone: every sequence also reads its own KV cache": weights / roof.bandwidth_Bps,
                 "one sequence's KV: each of the batch reads its own": (weights + context * kv) / roof.bandwidth_Bps}
        r.close(case, got, step.time_s, rel_tol=ITL_TOL, unit="s", wrong=wrong,
                mistakes=[Mistake(1e3, "1000x too large: the answer is in seconds, not ms"), *factor_of_2()])


EXERCISES = [
    Exercise("kv_cache_bytes", "Bytes of the KV cache", "predict",
             "Predict the bytes the KV cache holds for some tokens and users; checked exactly against "
             "the engine's own K/V tensors (element count x element size).", check_kv_cache_bytes),
    Exercise("itl_floor_s", "The floor under every decode step", "predict",
             "Predict the time of one decode step from the bytes it must read; checked against the "
             "roofline's op-by-op prediction on datasheet GPUs (within 8 %).", check_itl_floor),
]
