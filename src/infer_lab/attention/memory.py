"""KV memory and decode speed of attention variants on real model shapes, and the scorecard.

Every byte count here comes from the analytic model (:mod:`infer_lab.analysis`): this module
only builds variant shapes (the same model with other KV-head counts, a sliding window or MLA)
and asks the analysis for KV bytes, max users and the roofline decode time. All comparisons are
over ALL layers (or one layer on both sides): comparing one MLA layer with a whole MHA model inflates
the ratio by the layer count (see :func:`mla_ratio_explained`).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

VARIANT_MODELS = ("mistral-7b", "llama-3-70b", "deepseek-v3")


def analysis() -> Any:
    """The analytic memory module :mod:`infer_lab.analysis.memory` (imported on first use)."""
    return importlib.import_module("infer_lab.analysis.memory")


def _roofline() -> Any:
    return importlib.import_module("infer_lab.analysis.roofline")


def variant_shapes(model: str, window: int = 4096) -> dict[str, Any]:
    """The model's shape as MHA, its own GQA, MQA, sliding-window (its KV heads) and MLA when it has it.

    Shapes are :class:`infer_lab.shape.ModelShape` copies with one field changed.
    """
    shape = analysis().as_shape(model)
    if shape.mla:
        head_dim = shape.mla.v_head_dim
        base = dataclasses.replace(shape, mla=None, kv_heads=shape.heads, head_dim=head_dim)
        variants = {"MHA": base, "MQA": dataclasses.replace(base, kv_heads=1), "MLA": shape}
    else:
        variants = {"MHA": dataclasses.replace(shape, kv_heads=shape.heads)}
        if 1 < shape.kv_heads < shape.heads:
            variants[f"GQA-{shape.kv_heads}"] = shape
        variants["MQA"] = dataclasses.replace(shape, kv_heads=1)
    own = shape if not shape.mla else variants["MHA"]
    variants[f"sliding-{window} (own KV heads)"] = (
        dataclasses.replace(shape, layer_windows=(window,) * shape.layers)
        if not shape.mla
        else dataclasses.replace(own, layer_windows=(window,) * shape.layers)
    )
    return variants


def gpus_to_hold(model_shape: Any, gpu_memory_bytes: int, weight_dtype: str = "bf16") -> int:
    """Fewest GPUs whose memory holds the weights with 25% to spare (tensor parallel, as a node would)."""
    weights = analysis().weight_bytes(model_shape, weight_dtype).total
    return max(1, -(-int(weights * 1.25) // gpu_memory_bytes))


def variant_memory_table(
    models: tuple[str, ...] = VARIANT_MODELS,
    gpu: str = "H100-SXM",
    context: int = 32768,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    n_gpus: int | None = None,
    window: int = 4096,
) -> list[dict[str, Any]]:
    """KV bytes per token (all layers), KV per user at ``context`` and max users on ``gpu``, per variant.

    ``n_gpus`` defaults to the fewest GPUs that hold the weights (so the 671B model gets a node).
    """
    from ..catalog import get_gpu

    mem = analysis()
    spec = get_gpu(gpu)
    rows = []
    for model in models:
        variants = variant_shapes(model, window)
        gpus = n_gpus or gpus_to_hold(variants["MHA"], spec.memory_bytes, weight_dtype)
        mha_per_user = mem.kv_bytes(variants["MHA"], context, 1, kv_dtype)
        for name, shape in variants.items():
            per_user = mem.kv_bytes(shape, context, 1, kv_dtype)
            rows.append(
                {
                    "model": model,
                    "variant": name,
                    "kv_bytes_per_token": mem.kv_bytes_per_token(shape, kv_dtype),
                    "context": context,
                    "kv_bytes_per_user": per_user,
                    "mha_over_variant": mha_per_user / per_user,
                    "gpu": spec.name,
                    "n_gpus": gpus,
                    "max_users": mem.max_users(
                        shape,
                        spec.memory_bytes,
                        context,
                        n_gpus=gpus,
                        weight_dtype=weight_dtype,
                        kv_dtype=kv_dtype,
                    ),
                }
            )
    return rows


def predicted_decode(
    model_shape: Any, gpu: str, batch: int, context: int, kv_dtype: str = "bf16", n_gpus: int = 1
) -> dict[str, float]:
    """Roofline decode step of a (variant) shape on ``n_gpus``: seconds per step, tokens/s and KV bytes read."""
    roof_mod = _roofline()
    step = roof_mod.predict_decode(
        model_shape, roof_mod.gpu_roof(gpu, n_gpus=n_gpus), batch, context, kv_dtype=kv_dtype
    )
    ops = roof_mod.decode_ops(model_shape, batch, context, kv_dtype=kv_dtype)
    kv_read = sum(getattr(o, "kv_read_bytes", 0.0) for o in ops)
    return {
        "step_s": step.time_s,
        "tokens_per_s": batch / step.time_s,
        "kv_read_bytes": kv_read,
        "bytes": step.bytes,
    }


def decode_time_vs_kv_heads(
    model: str = "mistral-7b",
    gpu: str = "H200",
    context: int = 32768,
    batch: int = 1,
    kv_heads: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
) -> list[dict[str, Any]]:
    """Predicted decode attention bytes and step time as the number of KV heads changes (memory-bound)."""
    shape = analysis().as_shape(model)
    rows = []
    for kv in kv_heads:
        if shape.heads % kv:
            continue
        pred = predicted_decode(dataclasses.replace(shape, kv_heads=kv), gpu, batch, context)
        rows.append({"kv_heads": kv, "context": context, "batch": batch, **pred})
    return rows


# Quality evidence we cannot measure here, with its source. Measured rows override these.
CITED_QUALITY = {
    "MHA": "reference quality (GQA paper, Ainslie et al. 2023)",
    "GQA": "close to MHA after uptraining 5% of pre-training compute (GQA paper)",
    "MQA": "small drop after uptraining (GQA paper); large without it (measured on SmolLM2 in module 06)",
    "MLA": "matches or beats MHA in DeepSeek-V2's ablations (DeepSeek-V2 report)",
    "sliding": "local context only; mixed with full layers in Mistral/Gemma/GPT-OSS",
}


def constant_state_models(
    model: str = "mistral-7b",
    context: int = 32768,
    kv_dtype: str = "bf16",
    mamba_state_dim: int = 16,
    mamba_expand: int = 2,
    mamba_conv: int = 4,
    dsa_top_k: int = 2048,
) -> list[dict[str, Any]]:
    """Memory models of architectures without a growing KV cache, at this model's widths.

    * Linear attention keeps a ``head_dim x head_dim`` matrix (sum of k vᵀ) per head per layer:
      constant in context, but it must compress all history into that matrix.
    * Mamba (selective SSM) keeps ``d_inner x state_dim`` plus a short convolution window per layer.
    * DeepSeek sparse attention (DSA) still caches every token (MLA-sized), but each query reads
      only ``dsa_top_k`` of them, so the bytes *read* per step stop growing, not the bytes stored.
    These state sizes are properties of those architectures, not of the KV formula.
    """
    mem = analysis()
    shape = mem.as_shape(model)
    element = mem.kv_bytes_per_element(kv_dtype)
    linear = (
        shape.layers * shape.heads * (shape.head_dim * shape.head_dim + shape.head_dim) * element
    )
    d_inner = mamba_expand * shape.hidden
    mamba = shape.layers * d_inner * (mamba_state_dim + mamba_conv - 1) * element
    full = mem.kv_bytes(shape, context, 1, kv_dtype)
    return [
        {
            "architecture": "full attention (this model)",
            "state_bytes_per_user": full,
            "grows_with_context": True,
        },
        {
            "architecture": "linear attention",
            "state_bytes_per_user": linear,
            "grows_with_context": False,
        },
        {"architecture": "Mamba (SSM)", "state_bytes_per_user": mamba, "grows_with_context": False},
        {
            "architecture": f"DSA (reads top-{dsa_top_k})",
            "state_bytes_per_user": full,
            "grows_with_context": True,
            "bytes_read_per_step": mem.kv_bytes(shape, min(context, dsa_top_k), 1, kv_dtype),
        },
    ]


def big_model_fit_table(
    gpus: tuple[str, ...] = ("H100-SXM", "H200", "A100-80GB", "L40S", "RTX-Pro-6000-Blackwell"),
    models: tuple[str, ...] = ("gpt-oss-120b", "llama-3-70b", "mistral-7b"),
    dtypes: tuple[str, ...] = ("bf16", "fp8", "int8", "int4", "mxfp4"),
    context: int = 4096,
) -> list[dict[str, Any]]:
    """Weight bytes per dtype (from the analysis) and whether one GPU holds weights + one user's KV."""
    from ..catalog import get_gpu, list_gpus

    mem = analysis()
    known = set(list_gpus())
    rows = []
    for model in models:
        for dtype in dtypes:
            weights = mem.weight_bytes(model, dtype).total
            row: dict[str, Any] = {"model": model, "weight_dtype": dtype, "weight_bytes": weights}
            for gpu in gpus:
                if gpu not in known:
                    continue
                report = mem.fit(model, get_gpu(gpu).memory_bytes, context, weight_dtype=dtype)
                row[f"max_users@{gpu}"] = report.max_users if report.kv_budget_bytes > 0 else 0
            rows.append(row)
    return rows


def scorecard(
    model: str = "mistral-7b",
    gpu: str = "H100-SXM",
    context: int = 32768,
    window: int = 4096,
    measured_quality: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """MHA / GQA / MQA / MLA / sliding window on quality, KV memory and predicted decode throughput.

    KV bytes, max users and the roofline decode rate come from the analysis for ``model``'s
    shape (MLA only for models that have it), on the fewest ``gpu``s that hold the weights.
    ``measured_quality`` maps a variant family (``'MQA'``, ``'sliding'``...) to a measured
    statement (see :func:`infer_lab.attention.quality.quality_notes`) shown instead of the cited one.
    """
    from ..catalog import get_gpu

    mem = analysis()
    spec = get_gpu(gpu)
    quality = {**CITED_QUALITY, **(measured_quality or {})}
    variants = variant_shapes(model, window)
    gpus = gpus_to_hold(variants["MHA"], spec.memory_bytes)
    rows = []
    for name, shape in variants.items():
        family = "sliding" if name.startswith("sliding") else name.split("-")[0]
        users = mem.max_users(shape, spec.memory_bytes, context, n_gpus=gpus)
        single = predicted_decode(shape, gpu, 1, context, n_gpus=gpus)
        full = predicted_decode(shape, gpu, max(users, 1), context, n_gpus=gpus)
        rows.append(
            {
                "variant": name,
                "quality": quality.get(family, ""),
                "kv_bytes_per_token": mem.kv_bytes_per_token(shape),
                "n_gpus": gpus,
                "max_users": users,
                "decode_tok_s_batch1": single["tokens_per_s"],
                "decode_tok_s_at_max_users": full["tokens_per_s"] if users else 0.0,
                "model": model,
                "gpu": spec.name,
                "context": context,
            }
        )
    return rows


def mla_ratio_explained(mla_model: str = "deepseek-v3", mha_7b_model: str = "mistral-7b") -> list[dict[str, Any]]:
    """Where "14x", "57x" and the one-layer mistake come from, each ratio computed from the analysis.

    Rows compare DeepSeek-V3's MLA cache (one 512-d latent + one 64-d RoPE key per layer) with
    (a) an MHA of DeepSeek-V3's own shape, (b) the MHA layer of a 7B-class model (Mistral-7B's
    shape with all 32 heads as KV heads), and (c) the mistake: one MLA layer against a whole
    MHA model. Layer counts cancel in (a); (b) is per layer because the models differ in depth.
    """
    def by_variant(model: str) -> dict[str, dict[str, Any]]:
        return {r["variant"]: r for r in analysis().attention_variants(model)}

    mla = by_variant(mla_model)["MLA"]
    mha_same = by_variant(mla_model)["MHA"]
    mha_7b = by_variant(mha_7b_model)["MHA"]
    per_layer, total = mla["kv_bytes_per_token_per_layer"], mla["kv_bytes_per_token"]
    return [
        {"comparison": f"MHA of {mla_model}'s own shape, all layers vs all layers",
         "mha_bytes_per_token": mha_same["kv_bytes_per_token"], "mla_bytes_per_token": total,
         "ratio": mha_same["kv_bytes_per_token"] / total, "fair": True},
        {"comparison": f"one MHA layer of a 7B-class model ({mha_7b_model} shape, all heads) vs one MLA layer",
         "mha_bytes_per_token": mha_7b["kv_bytes_per_token_per_layer"], "mla_bytes_per_token": per_layer,
         "ratio": mha_7b["kv_bytes_per_token_per_layer"] / per_layer, "fair": True},
        {"comparison": f"the mistake: a whole MHA {mla_model} vs ONE MLA layer",
         "mha_bytes_per_token": mha_same["kv_bytes_per_token"], "mla_bytes_per_token": per_layer,
         "ratio": mha_same["kv_bytes_per_token"] / per_layer, "fair": False},
    ]
