"""KV bytes, max users and predicted decode speed of attention variants on real model shapes.

Every byte count here comes from the analytic model (:mod:`infer_lab.analysis.memory`): this
module only builds variant shapes (the same model with other KV-head counts, a sliding window
or MLA) and asks the analysis for KV bytes, max users and the roofline decode time. All
comparisons are over ALL layers (or one layer on both sides): comparing one MLA layer with a
whole MHA model inflates the ratio by the layer count (see :func:`mla_ratio_explained`).

An MHA built from an MLA model's shape needs a head dim. :func:`variant_shapes` uses the value
head dim (128 for DeepSeek-V3) for K and V alike, because the shape holds one head dim;
DeepSeek's own K head is 192 (128 without RoPE + 64 with it). :func:`mla_ratio_explained`
shows the ratio both ways.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..analysis import memory as kv_memory
from ..analysis import roofline
from ..catalog import get_gpu
from ..shape import ModelShape

VARIANT_MODELS = ("mistral-7b", "llama-3.1-70b", "deepseek-v3")  # each reads the 32k contexts used here


def variant_shapes(model: str, window: int = 4096) -> dict[str, ModelShape]:
    """The model's shape as MHA, its own GQA, MQA, MLA when it has it, and a sliding window over its own KV.

    Shapes are :class:`infer_lab.shape.ModelShape` copies with one field changed. For an MLA
    model the MHA and MQA use the value head dim for K too (see the module docstring).
    """
    shape = kv_memory.as_shape(model)
    if shape.mla:
        head_dim = shape.mla.v_head_dim
        base = dataclasses.replace(shape, mla=None, kv_heads=shape.heads, head_dim=head_dim)
        variants = {"MHA": base, "MQA": dataclasses.replace(base, kv_heads=1), "MLA": shape}
    else:
        variants = {"MHA": dataclasses.replace(shape, kv_heads=shape.heads)}
        if 1 < shape.kv_heads < shape.heads:
            variants[f"GQA-{shape.kv_heads}"] = shape
        variants["MQA"] = dataclasses.replace(shape, kv_heads=1)
    # The window applies to the model's own cache: its KV heads, or MLA's latent (not the MHA expansion).
    variants[f"sliding-{window} (own KV)"] = dataclasses.replace(shape, layer_windows=(window,) * shape.layers)
    return variants


# The precision a model's released checkpoint ships in, where it is not bf16: the weights a deployment
# actually loads. DeepSeek-V3: FP8 e4m3 with one fp32 scale per 128 x 128 block (README_WEIGHTS.md of the
# deepseek-ai/DeepSeek-V3 repository: "natively supports FP8 weight format with 128x128 block scaling", and
# its config.json's quantization_config). GPT-OSS-120B: MXFP4 MoE experts (its config.json's
# quantization_config). The byte counts use the planner's formats (analysis/memory.py).
SHIPPED_WEIGHT_DTYPE = {"deepseek-v3": "fp8", "gpt-oss-120b": "mxfp4"}
WEIGHT_SPARE = 0.25  # room left beside the weights when choosing a GPU count (KV, activations)


def shipped_weight_dtype(model_shape: Any) -> str:
    """The weight format ``model_shape``'s released checkpoint ships in (``'bf16'`` unless listed)."""
    return SHIPPED_WEIGHT_DTYPE.get(kv_memory.as_shape(model_shape).name, "bf16")


def gpus_to_hold(model_shape: Any, gpu_memory_bytes: int, weight_dtype: str | None = None) -> int:
    """GPUs a deployment of the weights takes: the fewest whose memory holds them with 25% to spare,
    rounded up to a power of two, as tensor- and pipeline-parallel layouts split a model (a count
    like 21 divides no model's heads). ``weight_dtype`` defaults to the shipped format."""
    dtype = weight_dtype or shipped_weight_dtype(model_shape)
    weights = kv_memory.weight_bytes(model_shape, dtype).total
    fewest = max(1, -(-int(weights * (1 + WEIGHT_SPARE)) // gpu_memory_bytes))
    return 1 << (fewest - 1).bit_length()


@dataclass(frozen=True)
class VariantMemory:
    """One variant of one model: KV bytes per token (all layers) and per user, and max users."""

    model: str
    variant: str
    kv_bytes_per_token: int
    context: int  # tokens per user
    kv_bytes_per_user: int
    mha_over_variant: float  # MHA's KV per user / this variant's
    gpu: str
    n_gpus: int
    max_users: int
    weight_dtype: str = "bf16"  # the weights the GPU count and max users assume


def variant_memory_table(
    models: tuple[str, ...] = VARIANT_MODELS,
    gpu: str = "H100-SXM",
    context: int = 32768,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = None,
    n_gpus: int | None = None,
    window: int = 4096,
) -> list[VariantMemory]:
    """KV bytes per token (all layers), KV per user at ``context`` and max users on ``gpu``, per variant.

    ``weight_dtype`` defaults to each model's shipped format (:func:`shipped_weight_dtype`: DeepSeek-V3
    in fp8) and ``n_gpus`` to :func:`gpus_to_hold` of those weights (a power of two: the 671B model
    gets 8 H200s or 16 H100s, not 21).
    """
    spec = get_gpu(gpu)
    rows = []
    for model in models:
        variants = variant_shapes(model, window)
        dtype = weight_dtype or shipped_weight_dtype(model)
        gpus = n_gpus or gpus_to_hold(variants["MHA"], spec.memory_bytes, dtype)
        mha_per_user = kv_memory.kv_bytes(variants["MHA"], context, 1, kv_dtype)
        for name, shape in variants.items():
            per_user = kv_memory.kv_bytes(shape, context, 1, kv_dtype)
            users = kv_memory.max_users(shape, spec.memory_bytes, context, n_gpus=gpus,
                                        weight_dtype=dtype, kv_dtype=kv_dtype)
            rows.append(VariantMemory(model, name, kv_memory.kv_bytes_per_token(shape, kv_dtype), context,
                                      per_user, mha_per_user / per_user, spec.name, gpus, users, dtype))
    return rows


@dataclass(frozen=True)
class PredictedDecode:
    """A roofline decode step: seconds per step, tokens/s, KV bytes read and all bytes moved."""

    kv_heads: int
    context: int
    batch: int
    step_s: float
    tokens_per_s: float
    kv_read_bytes: float
    bytes: float


def predicted_decode(
    model_shape: Any, gpu: str, batch: int, context: int, kv_dtype: str = "bf16", n_gpus: int = 1,
    weight_dtype: str = "bf16",
) -> PredictedDecode:
    """Roofline decode step of a (variant) shape on ``n_gpus`` ``gpu``s, weights in ``weight_dtype``."""
    step = roofline.predict_decode(
        model_shape, roofline.gpu_roof(gpu, n_gpus=n_gpus), batch, context, kv_dtype=kv_dtype,
        weight_dtype=weight_dtype,
    )
    ops = roofline.decode_ops(model_shape, batch, context, kv_dtype=kv_dtype)
    kv_read = sum(getattr(o, "kv_read_bytes", 0.0) for o in ops)
    shape = kv_memory.as_shape(model_shape)
    return PredictedDecode(shape.kv_heads, context, batch, step.time_s, batch / step.time_s, kv_read, step.bytes)


def decode_time_vs_kv_heads(
    model: str = "mistral-7b",
    gpu: str = "H200",
    context: int = 32768,
    batch: int = 1,
    kv_heads: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
) -> list[PredictedDecode]:
    """Predicted decode bytes and step time as the number of KV heads changes (memory-bound)."""
    shape = kv_memory.as_shape(model)
    return [predicted_decode(dataclasses.replace(shape, kv_heads=kv), gpu, batch, context)
            for kv in kv_heads if shape.heads % kv == 0]


@dataclass(frozen=True)
class StateSize:
    """What one user's sequence keeps in memory under an architecture, and what a decode step reads."""

    architecture: str
    state_bytes_per_user: int
    grows_with_context: bool
    bytes_read_per_step: int | None = None  # when it differs from the state
    read_grows_with_context: bool | None = None  # None: the read is the state, so as the state


# DeepSeek-V3.2's lightning indexer (DeepSeek-V3.2-Exp report): one 128-value key per token per layer,
# shared by its index heads and cached in fp8 (1 B per value; its per-block scales are left out here).
DSA_INDEXER_KEY_DIM = 128
DSA_INDEXER_BYTES_PER_ELEMENT = 1
DSA_TOP_K = 2048


@dataclass(frozen=True)
class SparseRead:
    """One DSA decode step for one user: the main attention reads the top-k tokens' KV, and the
    indexer first reads its own small key of every cached token to pick them."""

    context: int
    top_k: int
    top_k_kv_bytes: int  # KV of min(context, top_k) tokens, all layers
    indexer_bytes: int  # indexer keys of all ``context`` tokens, all layers
    indexer_bytes_per_token: int  # one cached token's indexer keys, all layers
    indexer_key_dim: int
    indexer_bytes_per_element: int
    layers: int

    @property
    def bytes_read(self) -> int:
        return self.top_k_kv_bytes + self.indexer_bytes


def dsa_read_per_step(
    model: str = "mistral-7b",
    context: int = 32768,
    top_k: int = DSA_TOP_K,
    indexer_key_dim: int = DSA_INDEXER_KEY_DIM,
    indexer_bytes_per_element: int = DSA_INDEXER_BYTES_PER_ELEMENT,
    kv_dtype: str = "bf16",
) -> SparseRead:
    """Bytes one DSA decode step reads at ``context`` cached tokens, at ``model``'s widths.

    The indexer scores every cached token (its cost is O(L) per step, O(L²) over a sequence), so
    its reads grow with the context; only the main attention is capped at ``top_k`` tokens.
    """
    shape = kv_memory.as_shape(model)
    per_token = shape.layers * indexer_key_dim * indexer_bytes_per_element
    return SparseRead(context, top_k, kv_memory.kv_bytes(shape, min(context, top_k), 1, kv_dtype),
                      per_token * context, per_token, indexer_key_dim, indexer_bytes_per_element, shape.layers)


def constant_state_models(
    model: str = "mistral-7b",
    context: int = 32768,
    kv_dtype: str = "bf16",
    mamba_state_dim: int = 16,
    mamba_expand: int = 2,
    mamba_conv: int = 4,
    dsa_top_k: int = DSA_TOP_K,
    dsa_indexer_key_dim: int = DSA_INDEXER_KEY_DIM,
    dsa_indexer_bytes_per_element: int = DSA_INDEXER_BYTES_PER_ELEMENT,
) -> list[StateSize]:
    """Memory models of architectures without a growing KV cache, at this model's widths.

    * Linear attention keeps a ``head_dim x head_dim`` matrix (sum of k vᵀ) per head per layer:
      constant in context, but it must compress all history into that matrix.
    * Mamba (selective SSM) keeps ``d_inner x state_dim`` plus a short convolution window per layer.
    * DeepSeek sparse attention (DSA) caches every token's KV and its indexer key; a step reads the
      KV of ``dsa_top_k`` tokens plus the indexer key of every cached token (:func:`dsa_read_per_step`),
      so what it reads still grows with the context, more slowly than full attention's.
    These state sizes are properties of those architectures, not of the KV formula.
    """
    shape = kv_memory.as_shape(model)
    element = kv_memory.kv_bytes_per_element(kv_dtype)
    linear = shape.layers * shape.heads * (shape.head_dim * shape.head_dim + shape.head_dim) * element
    mamba = shape.layers * mamba_expand * shape.hidden * (mamba_state_dim + mamba_conv - 1) * element
    full = kv_memory.kv_bytes(shape, context, 1, kv_dtype)
    dsa = [dsa_read_per_step(model, c, dsa_top_k, dsa_indexer_key_dim, dsa_indexer_bytes_per_element, kv_dtype)
           for c in (context, 2 * context)]
    return [
        StateSize("full attention (this model)", full, True),
        StateSize("linear attention", linear, False),
        StateSize("Mamba (SSM)", mamba, False),
        StateSize(f"DSA (KV of the top {dsa_top_k:,} tokens + an indexer key of {dsa_indexer_key_dim} × "
                  f"{dsa_indexer_bytes_per_element} B per cached token per layer)",
                  full + dsa[0].indexer_bytes, True, dsa[0].bytes_read, dsa[1].bytes_read > dsa[0].bytes_read),
    ]


# Quality evidence we cannot measure here, with its source. Measured notes override these.
CITED_QUALITY = {
    "MHA": "reference quality (GQA paper, Ainslie et al. 2023)",
    "GQA": "close to MHA after uptraining 5% of pre-training compute (GQA paper)",
    "MQA": "small drop after uptraining (GQA paper)",
    "MLA": "matches or beats MHA in DeepSeek-V2's ablations (DeepSeek-V2 report)",
    "sliding": ("each layer sees the last w tokens, stacked layers reach further; every layer in Mistral-7B "
                "v0.1, interleaved with full-attention layers in Gemma 2/3 and GPT-OSS"),
}


@dataclass(frozen=True)
class ScorecardRow:
    """One variant on quality, KV memory and predicted decode throughput."""

    variant: str
    quality: str
    kv_bytes_per_token: int
    n_gpus: int
    max_users: int
    decode_tok_s_batch1: float
    decode_tok_s_at_max_users: float
    model: str
    gpu: str
    context: int


def variant_family(variant: str) -> str:
    """'MHA', 'GQA', 'MQA', 'MLA' or 'sliding' for a variant name such as 'GQA-8' or 'sliding-4096 (...)'."""
    return "sliding" if variant.startswith("sliding") else variant.split("-")[0].split(" ")[0]


def scorecard(
    model: str = "mistral-7b",
    gpu: str = "H100-SXM",
    context: int = 32768,
    window: int = 4096,
    measured_quality: dict[str, str] | None = None,
) -> list[ScorecardRow]:
    """MHA / GQA / MQA / MLA / sliding window on quality, KV memory and predicted decode throughput.

    KV bytes, max users and the roofline decode rate come from the analysis for ``model``'s
    shape (MLA only for models that have it), on :func:`gpus_to_hold` ``gpu``s for its shipped weights.
    ``measured_quality`` maps a variant family (``'MQA'``, ``'sliding'``...) to a measured
    statement shown beside the cited one, which it never replaces: a measurement on another model or
    setting does not say what the literature's trained variant costs.
    """
    spec = get_gpu(gpu)
    measured = measured_quality or {}
    quality = {family: "; ".join(x for x in (CITED_QUALITY.get(family, ""), measured.get(family, "")) if x)
               for family in {*CITED_QUALITY, *measured}}
    variants = variant_shapes(model, window)
    dtype = shipped_weight_dtype(model)
    gpus = gpus_to_hold(variants["MHA"], spec.memory_bytes, dtype)
    rows = []
    for name, shape in variants.items():
        users = kv_memory.max_users(shape, spec.memory_bytes, context, n_gpus=gpus, weight_dtype=dtype)
        single = predicted_decode(shape, gpu, 1, context, n_gpus=gpus, weight_dtype=dtype)
        full = predicted_decode(shape, gpu, max(users, 1), context, n_gpus=gpus, weight_dtype=dtype)
        rows.append(ScorecardRow(name, quality.get(variant_family(name), ""), kv_memory.kv_bytes_per_token(shape),
                                 gpus, users, single.tokens_per_s, full.tokens_per_s if users else 0.0,
                                 model, spec.name, context))
    return rows


@dataclass(frozen=True)
class MLARatio:
    """One way of stating "MLA caches N times less than MHA", with both sides' bytes per token."""

    key: str
    comparison: str
    mha_bytes_per_token: int
    mla_bytes_per_token: int
    k_head_dim: int  # of the MHA side
    v_head_dim: int
    fair: bool

    @property
    def ratio(self) -> float:
        return self.mha_bytes_per_token / self.mla_bytes_per_token


def mha_bytes_per_token_per_layer(heads: int, k_head_dim: int, v_head_dim: int, kv_dtype: str = "bf16") -> int:
    """An MHA layer caches one K (``k_head_dim``) and one V (``v_head_dim``) per head per token."""
    return heads * (k_head_dim + v_head_dim) * kv_memory.kv_bytes_per_element(kv_dtype)


def mla_ratio_explained(mla_model: str = "deepseek-v3", mha_7b_model: str = "mistral-7b",
                        kv_dtype: str = "bf16") -> dict[str, MLARatio]:
    """Where "57x", "71x", "14x" and the one-layer mistake come from, each computed from the shapes.

    DeepSeek-V3's MLA caches one 512-value latent and one 64-value RoPE key per layer per token.
    Against it:

    * ``same_shape_k128``: an MHA of DeepSeek-V3's own shape (128 heads) with K and V at the
      value head dim, 128: what a shape with one head dim gives. Layer counts cancel.
    * ``same_shape_k192``: the same MHA with DeepSeek's real K head, 192 (128 without RoPE + 64
      with it) and V at 128: the MHA DeepSeek would have had to cache.
    * ``7b_layer``: one MHA layer of a 7B-class model (Mistral-7B's shape, all 32 heads as KV heads)
      against one MLA layer: the "about 14x" often quoted. Per layer, as the models differ in depth.
    * ``one_layer_mistake``: a whole MHA DeepSeek-V3 against ONE MLA layer (not fair).
    """
    mla_shape = kv_memory.as_shape(mla_model)
    if not mla_shape.mla:
        raise ValueError(f"{mla_model} has no MLA attention")
    m = mla_shape.mla
    layers = mla_shape.layers
    mla_layer = kv_memory.kv_bytes_per_token_per_layer(mla_shape, kv_dtype)
    k192 = m.qk_nope_head_dim + m.qk_rope_head_dim
    mha_k128 = mha_bytes_per_token_per_layer(mla_shape.heads, m.v_head_dim, m.v_head_dim, kv_dtype)
    mha_k192 = mha_bytes_per_token_per_layer(mla_shape.heads, k192, m.v_head_dim, kv_dtype)
    seven = kv_memory.as_shape(mha_7b_model)
    mha_7b = mha_bytes_per_token_per_layer(seven.heads, seven.head_dim, seven.head_dim, kv_dtype)
    rows = [
        MLARatio("same_shape_k128", f"MHA of {mla_model}'s shape, K and V at head dim {m.v_head_dim}, all layers",
                 mha_k128 * layers, mla_layer * layers, m.v_head_dim, m.v_head_dim, True),
        MLARatio("same_shape_k192", f"MHA of {mla_model}'s shape with its real K head dim {k192} "
                 f"({m.qk_nope_head_dim} + {m.qk_rope_head_dim} RoPE), V {m.v_head_dim}, all layers",
                 mha_k192 * layers, mla_layer * layers, k192, m.v_head_dim, True),
        MLARatio("7b_layer", f"one MHA layer of a 7B-class model ({mha_7b_model} shape, all heads) vs one MLA layer",
                 mha_7b, mla_layer, seven.head_dim, seven.head_dim, True),
        MLARatio("one_layer_mistake", f"the mistake: a whole MHA {mla_model} (K {m.v_head_dim}) vs ONE MLA layer",
                 mha_k128 * layers, mla_layer, m.v_head_dim, m.v_head_dim, False),
    ]
    return {r.key: r for r in rows}
