"""The memory equation: weight bytes, KV-cache bytes per token, and what fits on a GPU.

All results are exact integer bytes. Display them with :func:`infer_lab.units.fmt_bytes`, which
prints GB (1e9) and GiB (2^30) side by side. The KV dtype is always a separate argument from the
weight dtype: quantizing weights to int4 does not shrink the KV cache.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

from ..catalog import load_model_config
from ..shape import ModelShape, model_shape
from ..units import GiB, require_positive
from .params import ParamCounts, param_counts

ModelLike = str | os.PathLike | dict[str, Any] | ModelShape


def as_shape(model: ModelLike) -> ModelShape:
    """A :class:`ModelShape` from a name, config path, config dict or an existing shape."""
    return model if isinstance(model, ModelShape) else model_shape(model)


# ---------------------------------------------------------------------------------------------
# Number formats


@dataclass(frozen=True)
class NumberFormat:
    """How a tensor is stored: ``bits`` per element plus one scale of ``scale_bits`` per ``group_size``."""

    name: str
    bits: int
    group_size: int | None = None
    scale_bits: int = 0
    note: str = ""

    def bytes_for(self, n_elements: int) -> int:
        """Exact bytes for ``n_elements`` values (scales included, rounded up to whole bytes)."""
        bits = n_elements * self.bits
        if self.group_size:
            bits += math.ceil(n_elements / self.group_size) * self.scale_bits
        return math.ceil(bits / 8)

    @property
    def bits_per_element(self) -> float:
        """Effective bits per value, scale overhead included."""
        return self.bits + (self.scale_bits / self.group_size if self.group_size else 0.0)


WEIGHT_FORMATS: dict[str, NumberFormat] = {
    f.name: f
    for f in (
        NumberFormat("fp32", 32),
        NumberFormat("bf16", 16),
        NumberFormat("fp16", 16),
        NumberFormat("fp8", 8, note="one scale per tensor (negligible)"),
        NumberFormat(
            "int8", 8, group_size=128, scale_bits=16, note="one fp16 scale per 128 weights"
        ),
        NumberFormat(
            "int4",
            4,
            group_size=128,
            scale_bits=16,
            note="one fp16 scale per 128 weights, symmetric (no zero point)",
        ),
        NumberFormat(
            "nf4",
            4,
            group_size=64,
            scale_bits=32,
            note="bitsandbytes: one fp32 absmax per 64 weights",
        ),
        NumberFormat(
            "mxfp4",
            4,
            group_size=32,
            scale_bits=8,
            note="OCP MX: one 8-bit exponent per 32 weights",
        ),
    )
}

KV_FORMATS: dict[str, NumberFormat] = {
    f.name: f
    for f in (
        NumberFormat("fp32", 32),
        NumberFormat("bf16", 16),
        NumberFormat("fp16", 16),
        NumberFormat("fp8", 8),
        NumberFormat("int8", 8),
    )
}


def weight_format(name: str, group_size: int | None = None) -> NumberFormat:
    """A weight format by name, optionally with a different quantization group size."""
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight dtype {name!r}; known: {', '.join(WEIGHT_FORMATS)}")
    fmt = WEIGHT_FORMATS[name]
    if group_size is not None:
        require_positive("group_size", group_size)
        if not fmt.group_size:
            raise ValueError(
                f"weight dtype {name!r} has no quantization groups; group_size does not apply"
            )
        fmt = NumberFormat(
            fmt.name, fmt.bits, group_size, fmt.scale_bits, f"one scale per {group_size} weights"
        )
    return fmt


def kv_bytes_per_element(kv_dtype: str) -> int:
    """Bytes of one cached K/V value: 4 (fp32), 2 (bf16/fp16) or 1 (fp8/int8)."""
    if kv_dtype not in KV_FORMATS:
        raise ValueError(f"unknown kv dtype {kv_dtype!r}; known: {', '.join(KV_FORMATS)}")
    return KV_FORMATS[kv_dtype].bits // 8


# ---------------------------------------------------------------------------------------------
# Weights


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of the weights: the quantized matmul weights plus what stays 16-bit (embeddings, norms,
    and any module the checkpoint's ``quantization_config`` leaves unconverted)."""

    dtype: str
    matmul_bytes: int  # the weights stored in ``dtype``
    other_bytes: int  # the weights kept in 16 bits
    params: ParamCounts
    kept_modules: tuple[str, ...] = ()  # the checkpoint's modules_to_not_convert, when they applied

    @property
    def total(self) -> int:
        return self.matmul_bytes + self.other_bytes

    def as_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "matmul_bytes": self.matmul_bytes,
            "other_bytes": self.other_bytes,
            "total_bytes": self.total,
            "params": self.params.total,
            "active_params": self.params.active,
            "kept_modules": list(self.kept_modules),
        }


# Where each matmul component of :class:`ParamCounts` lives in a transformers checkpoint (Llama,
# Mistral, Qwen2, DeepSeek-V3, gpt-oss module names; layer 0 stands for every layer). A pattern of
# ``modules_to_not_convert`` that matches one of these paths, or a module above it, keeps it unquantized.
COMPONENT_MODULES: dict[str, tuple[str, ...]] = {
    "attention": ("model.layers.0.self_attn",),
    "mlp_dense": ("model.layers.0.mlp",),
    "experts": ("model.layers.0.mlp.experts",),
    "shared_experts": ("model.layers.0.mlp.shared_experts",),
    "routers": ("model.layers.0.mlp.router", "model.layers.0.mlp.gate"),
}


def modules_not_converted(model: ModelLike, dtype: str) -> tuple[str, ...]:
    """The checkpoint's ``quantization_config.modules_to_not_convert`` when it is stored in ``dtype``.

    A released quantized checkpoint (gpt-oss in mxfp4) says which modules it kept in 16 bits; the
    list applies only to the format it names (``quant_method``), not to a format the course
    applies itself. Empty when the config has no such block or cannot be found (a shape whose name
    is not in the catalog).
    """
    if isinstance(model, dict):
        return _unconverted(model, dtype)
    if isinstance(model, ModelShape):
        return _catalog_unconverted(model.name, dtype, missing_ok=True)
    return _catalog_unconverted(str(model), dtype)


@functools.lru_cache(maxsize=256)
def _catalog_unconverted(name_or_path: str, dtype: str, missing_ok: bool = False) -> tuple[str, ...]:
    """:func:`modules_not_converted` of a catalog name or config path (read once per name)."""
    try:
        config = load_model_config(name_or_path)
    except (KeyError, FileNotFoundError):  # a shape of no catalogued config: no checkpoint to read
        if missing_ok:
            return ()
        raise
    return _unconverted(config, dtype)


def _unconverted(config: dict[str, Any], dtype: str) -> tuple[str, ...]:
    quantization = config.get("quantization_config") or {}
    if str(quantization.get("quant_method", "")).lower() != dtype:
        return ()
    return tuple(quantization.get("modules_to_not_convert") or ())


def _kept(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``path`` or a module above it matches one of ``patterns`` (``*`` as in the config)."""
    parts = path.split(".")
    ancestors = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(a, p) for a in ancestors for p in patterns)


def weight_bytes(
    model: ModelLike, dtype: str = "bf16", group_size: int | None = None, keep_dtype: str = "bf16"
) -> WeightBytes:
    """Bytes of all weights when the decoder matmuls are stored in ``dtype``.

    Quantized formats (fp8, int8, int4, nf4, mxfp4) apply to the matmul weights of the layers;
    embeddings, LM head and norms stay in ``keep_dtype``, as bitsandbytes and most checkpoints do.
    When the model's config describes a released checkpoint in ``dtype`` (its
    ``quantization_config``), the modules it lists in ``modules_to_not_convert`` stay in
    ``keep_dtype`` too: gpt-oss ships only its MoE experts in mxfp4 and keeps attention and
    routers in bf16. Unquantized formats (fp32, bf16, fp16) apply to everything.
    """
    fmt = weight_format(dtype, group_size)
    counts = param_counts(as_shape(model))
    if fmt.bits >= 16:
        return WeightBytes(
            dtype, fmt.bytes_for(counts.matmul), fmt.bytes_for(counts.total - counts.matmul), counts
        )
    kept_modules = modules_not_converted(model, dtype)
    kept = sum(
        getattr(counts, component)
        for component, paths in COMPONENT_MODULES.items()
        if any(_kept(path, kept_modules) for path in paths)
    )
    quantized = counts.matmul - kept
    keep = weight_format(keep_dtype)
    return WeightBytes(
        dtype, fmt.bytes_for(quantized), keep.bytes_for(counts.total - quantized), counts, kept_modules
    )


# ---------------------------------------------------------------------------------------------
# The KV cache


def kv_elements_per_token_per_layer(model: ModelLike) -> int:
    """Cached values per token in one layer.

    * MHA/GQA/MQA: ``2 * kv_heads * head_dim`` (a K and a V vector per KV head).
    * MLA: ``kv_lora_rank + qk_rope_head_dim``: one compressed latent plus the shared RoPE key.
      MLA configs still carry ``num_key_value_heads`` (128 for DeepSeek-V3); it is ignored here
      because the cache does not hold per-head K and V.
    """
    shape = as_shape(model)
    if shape.mla:
        return shape.mla.kv_lora_rank + shape.mla.qk_rope_head_dim
    return 2 * shape.kv_heads * shape.head_dim


def kv_bytes_per_token_per_layer(model: ModelLike, kv_dtype: str = "bf16") -> int:
    """KV bytes one token adds to one layer's cache."""
    return kv_elements_per_token_per_layer(model) * kv_bytes_per_element(kv_dtype)


def kv_bytes_per_token(model: ModelLike, kv_dtype: str = "bf16") -> int:
    """KV bytes per token summed over all layers, before any sliding-window cap."""
    shape = as_shape(model)
    return shape.layers * kv_bytes_per_token_per_layer(shape, kv_dtype)


def cached_tokens_per_layer(model: ModelLike, context: int) -> list[int]:
    """Tokens each layer keeps for a sequence of ``context`` tokens (sliding layers cap at the window)."""
    require_positive("context", context, allow_zero=True)
    shape = as_shape(model)
    return [context if w is None else min(context, w) for w in shape.layer_windows]


def kv_bytes(model: ModelLike, context: int, users: int = 1, kv_dtype: str = "bf16") -> int:
    """Exact KV-cache bytes for ``users`` sequences of ``context`` tokens each."""
    require_positive("context", context)
    require_positive("users", users)
    per_layer = kv_bytes_per_token_per_layer(model, kv_dtype)
    return users * per_layer * sum(cached_tokens_per_layer(model, context))


@dataclass(frozen=True)
class KVReport:
    """The KV numbers the CLI and notebooks print. Bytes are exact integers."""

    model: str
    attention: str
    kv_dtype: str
    layers: int
    kv_bytes_per_token_per_layer: int
    kv_bytes_per_token: int
    context: int
    users: int
    kv_bytes_per_user: int
    kv_bytes_total: int
    sliding_window_layers: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_report(
    model: ModelLike, context: int = 4096, users: int = 1, kv_dtype: str = "bf16"
) -> KVReport:
    """KV per token (per layer and all layers) and the total for ``context`` x ``users``."""
    require_positive("users", users)
    shape = as_shape(model)
    per_user = kv_bytes(shape, context, 1, kv_dtype)
    return KVReport(
        model=shape.name,
        attention=shape.attention_kind,
        kv_dtype=kv_dtype,
        layers=shape.layers,
        kv_bytes_per_token_per_layer=kv_bytes_per_token_per_layer(shape, kv_dtype),
        kv_bytes_per_token=kv_bytes_per_token(shape, kv_dtype),
        context=context,
        users=users,
        kv_bytes_per_user=per_user,
        kv_bytes_total=per_user * users,
        sliding_window_layers=sum(w is not None for w in shape.layer_windows),
    )


def naive_kv_bytes_per_token(model: ModelLike, kv_dtype: str = "bf16") -> int:
    """The formula ``2 * layers * num_key_value_heads * head_dim * bytes`` applied blindly.

    For MLA models the head dim is the value head dim (128 for DeepSeek-V3). It is correct for
    GQA and wrong for MLA; it exists to show the trap, never to size anything.
    """
    shape = as_shape(model)
    head_dim = shape.mla.v_head_dim if shape.mla else shape.head_dim
    return 2 * shape.layers * shape.kv_heads * head_dim * kv_bytes_per_element(kv_dtype)


def attention_variants(model: ModelLike, kv_dtype: str = "bf16") -> list[dict[str, Any]]:
    """KV per token of this model's shape under MHA, GQA (its own), MQA and MLA, over ALL layers.

    MHA uses ``heads`` KV heads of ``head_dim`` (for an MLA model: its value head dim). Each row
    has the per-layer bytes, the all-layer bytes and the ratio to MHA computed from the all-layer
    numbers (the per-layer ratio is the same because every variant has the same layer count).
    """
    shape = as_shape(model)
    b = kv_bytes_per_element(kv_dtype)
    head_dim = shape.mla.v_head_dim if shape.mla else shape.head_dim
    per_layer = {"MHA": 2 * shape.heads * head_dim * b, "MQA": 2 * head_dim * b}
    if not shape.mla:
        per_layer[f"GQA ({shape.kv_heads} KV heads)"] = 2 * shape.kv_heads * head_dim * b
    else:
        per_layer["MLA"] = kv_bytes_per_token_per_layer(shape, kv_dtype)
    mha_total = per_layer["MHA"] * shape.layers
    rows = []
    for name, layer_bytes in sorted(per_layer.items(), key=lambda kv: -kv[1]):
        total = layer_bytes * shape.layers
        rows.append(
            {
                "variant": name,
                "kv_bytes_per_token_per_layer": layer_bytes,
                "kv_bytes_per_token": total,
                "mha_over_variant": mha_total / total,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Sizing: what fits


DEFAULT_RUNTIME_OVERHEAD_BYTES = (
    1 * GiB
)  # CUDA context, allocator slack, framework buffers (an assumption)


def activation_workspace_bytes(
    model: ModelLike, chunk_tokens: int, act_dtype: str = "bf16", logits_tokens: int = 1
) -> int:
    """Peak activation bytes of one prefill chunk of ``chunk_tokens`` tokens (batch summed).

    The largest of: the attention block (residual, q, k, v and the attention output) and the MLP
    block (residual, gate, up and their product), plus fp32 logits for ``logits_tokens`` positions
    (1 when only the next token is sampled). Attention scores are not materialized (a fused
    kernel, FlashAttention-style); an eager implementation needs ``heads * chunk^2`` more.
    """
    require_positive("chunk_tokens", chunk_tokens)
    require_positive("logits_tokens", logits_tokens, allow_zero=True)
    shape = as_shape(model)
    b = kv_bytes_per_element(act_dtype)
    if shape.mla:
        m = shape.mla
        attn_width = shape.hidden + shape.heads * (
            2 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + 2 * m.v_head_dim
        )
    else:
        attn_width = (
            shape.hidden + 2 * shape.heads * shape.head_dim + 2 * shape.kv_heads * shape.head_dim
        )
    mlp_inner = shape.intermediate
    if shape.moe:
        mlp_inner = max(
            mlp_inner,
            shape.moe.expert_intermediate * (shape.moe.active_experts + shape.moe.n_shared_experts),
        )
    mlp_width = shape.hidden + 3 * mlp_inner
    return chunk_tokens * max(attn_width, mlp_width) * b + logits_tokens * shape.vocab * 4


@dataclass(frozen=True)
class FitReport:
    """Does a workload fit: all terms in bytes. ``shortfall_bytes`` > 0 means it does not."""

    usable_bytes: int
    weight_bytes: int
    overhead_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_user: int
    users: int
    kv_needed_bytes: int
    max_users: int

    @property
    def fits(self) -> bool:
        return self.shortfall_bytes == 0

    @property
    def shortfall_bytes(self) -> int:
        """Bytes missing for the asked users (0 when it fits)."""
        return max(
            0, self.weight_bytes + self.overhead_bytes + self.kv_needed_bytes - self.usable_bytes
        )

    @property
    def headroom_bytes(self) -> int:
        """Bytes left over when it fits (0 when it does not)."""
        return max(
            0, self.usable_bytes - self.weight_bytes - self.overhead_bytes - self.kv_needed_bytes
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            fits=self.fits, shortfall_bytes=self.shortfall_bytes, headroom_bytes=self.headroom_bytes
        )
        return d


def fit(
    model: ModelLike,
    memory_bytes: int,
    context: int,
    users: int = 1,
    n_gpus: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
    overhead_bytes: int | None = None,
    prefill_chunk: int = 2048,
) -> FitReport:
    """Weights + overhead + KV against ``memory_fraction`` of ``n_gpus`` x ``memory_bytes``.

    ``overhead_bytes`` defaults to a runtime reserve per GPU plus the activation workspace of a
    ``prefill_chunk``-token prefill. Not fitting is a result (``shortfall_bytes``), never an error.
    """
    require_positive("memory_bytes", memory_bytes)
    require_positive("n_gpus", n_gpus)
    require_positive("users", users)
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    shape = as_shape(model)
    usable = int(memory_fraction * memory_bytes) * n_gpus
    weights = weight_bytes(shape, weight_dtype).total
    if overhead_bytes is None:
        overhead_bytes = n_gpus * DEFAULT_RUNTIME_OVERHEAD_BYTES + activation_workspace_bytes(
            shape, prefill_chunk
        )
    require_positive("overhead_bytes", overhead_bytes, allow_zero=True)
    per_user = kv_bytes(shape, context, 1, kv_dtype)
    budget = usable - weights - overhead_bytes
    return FitReport(
        usable_bytes=usable,
        weight_bytes=weights,
        overhead_bytes=overhead_bytes,
        kv_budget_bytes=budget,
        kv_bytes_per_user=per_user,
        users=users,
        kv_needed_bytes=per_user * users,
        max_users=max(0, budget // per_user),
    )


def max_users(model: ModelLike, memory_bytes: int, context: int, **kwargs: Any) -> int:
    """Concurrent sequences of ``context`` tokens whose KV fits next to the weights (0 if none)."""
    return fit(model, memory_bytes, context, **kwargs).max_users


def max_context(model: ModelLike, memory_bytes: int, users: int = 1, **kwargs: Any) -> int:
    """The longest context (tokens) each of ``users`` sequences can have; 0 if the weights do not fit.

    Sliding-window layers stop growing at their window, so the search is over the exact
    :func:`kv_bytes`; a model whose every layer is windowed has no memory limit on context and
    returns its window-capped answer at 2^31 tokens.
    """
    require_positive("users", users)
    probe = fit(model, memory_bytes, 1, users=users, **kwargs)
    budget = probe.kv_budget_bytes
    kv_dtype = kwargs.get("kv_dtype", "bf16")
    if budget < probe.kv_bytes_per_user * users:
        return 0
    lo, hi = 1, 2**31
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kv_bytes(model, mid, users, kv_dtype) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def context_limit(model: ModelLike) -> int:
    """The most positions the model reads (``max_position_embeddings``, tokens): a context past it
    is not a memory question at all."""
    return as_shape(model).max_position_embeddings


def within_limit(model: ModelLike, contexts: list[int]) -> list[int]:
    """The ``contexts`` (tokens) the model can read at all (at most :func:`context_limit`)."""
    limit = context_limit(model)
    return [c for c in contexts if c <= limit]


def scenario_problems(model: ModelLike, memory_bytes: int, context: int, users: int = 1, n_gpus: int = 1,
                      weight_dtype: str = "bf16", kv_dtype: str = "bf16", **kwargs: Any) -> list[str]:
    """Why a described serving scenario cannot exist ([] when it can): a context past the model's
    limit, or weights + overhead + KV of ``users`` x ``context`` tokens over :func:`fit`'s budget
    on ``n_gpus`` GPUs of ``memory_bytes`` each. Chapters check every scenario they describe."""
    problems = []
    limit = context_limit(model)
    if context > limit:
        problems.append(f"{as_shape(model).name} reads at most {limit:,} positions, not {context:,}")
    report = fit(model, memory_bytes, context, users=users, n_gpus=n_gpus, weight_dtype=weight_dtype,
                 kv_dtype=kv_dtype, **kwargs)
    if not report.fits:
        problems.append(f"{users:,} users x {context:,} tokens on {n_gpus} GPU(s) are short by "
                        f"{report.shortfall_bytes / 1e9:.1f} GB (at most {report.max_users:,} users fit)")
    return problems


def context_users_tradeoff(
    model: ModelLike, memory_bytes: int, contexts: list[int], **kwargs: Any
) -> list[dict[str, Any]]:
    """Max users for each context length: the curve you move along at a fixed GPU and model."""
    return [
        {
            "context": c,
            "max_users": max_users(model, memory_bytes, c, **kwargs),
            "kv_bytes_per_user": kv_bytes(model, c, 1, kwargs.get("kv_dtype", "bf16")),
        }
        for c in contexts
    ]
