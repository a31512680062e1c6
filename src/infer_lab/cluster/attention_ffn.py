"""Attention/FFN disaggregation for a large MoE, as an analytic model.

In a decode step of a large MoE, attention and the expert FFN want different machines:

- **attention** reads every sequence's K/V once per step: memory-bound at any batch, and its
  batch is capped by how much KV the GPU holds;
- **the expert FFN** is dense matmul: its arithmetic intensity grows with the tokens it sees,
  so it wants a large batch, and its weights (most of the model) want lots of memory.

*Colocated* (the usual DP-attention + expert-parallel deployment): each of n GPUs holds a copy
of the attention weights, 1/n of the experts, and the KV of its own users. Its batch is what
fits next to all of that, and the FFN sees n x that batch. Attention and FFN run one after the
other on the same GPU; the all-to-all token exchange overlaps with them.

*Split* (attention/FFN disaggregation, as in MegaScale-Infer and Step-3): n_a attention GPUs
hold only the attention weights and KV, so each fits a much larger batch; n_f FFN GPUs hold
only the experts and serve the tokens of all attention GPUs at once. With two micro-batches in
ping-pong, attention, FFN and the transfers overlap, so a step takes the slowest of the three
(a lower bound; ``sequential_step_ms`` is the upper bound with no overlap). Two things can pay:
the FFN runs at a larger batch (higher intensity, fewer GPUs for the same tokens), and each side
can use the GPU type that suits it.

Per step, all layers: attention-side ops are the q/k/v (or MLA) projections, attention, o
projection, dense MLP layers and the LM head; FFN-side ops are the router, routed and shared
experts. Token exchange per MoE layer: each token's hidden state goes to its k experts and
back: once per GPU that hosts one of its k experts, over ``link`` (the split default is one
400 Gb/s InfiniBand NIC per GPU, attention and FFN pools in different servers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..analysis.memory import (
    DEFAULT_RUNTIME_OVERHEAD_BYTES,
    as_shape,
    kv_bytes,
    kv_bytes_per_element,
    weight_bytes,
    weight_format,
)
from ..analysis.parallel import p2p_transfer_s
from ..analysis.params import param_counts
from ..analysis.roofline import decode_ops, gpu_roof
from ..catalog import get_gpu

FFN_OPS = ("MoE router", "MoE experts", "MoE shared experts")


@dataclass(frozen=True)
class AFDPoint:
    """One attention/FFN configuration of a decode step. Times in ms, money in USD."""

    mode: str  # colocated or split
    model: str
    context: int
    attention_gpu: str
    ffn_gpu: str
    n_attention_gpus: int
    n_ffn_gpus: int
    batch: int
    batch_per_attention_gpu: int
    attention_ms: float
    ffn_ms: float
    transfer_ms: float
    step_ms: float
    sequential_step_ms: float
    ffn_tokens: int
    ffn_intensity: float
    ffn_flops_utilization: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    usd_per_hour: float
    usd_per_m_tokens: float

    @property
    def n_gpus(self) -> int:
        return self.n_attention_gpus + (self.n_ffn_gpus if self.mode == "split" else 0)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["n_gpus"] = self.n_gpus
        return d


def _sides(shape, weight_dtype: str) -> tuple[int, int]:
    """(attention-side weight bytes, FFN-side weight bytes)."""
    counts = param_counts(shape)
    ffn_params = counts.experts + counts.shared_experts + counts.routers
    total = weight_bytes(shape, weight_dtype).total
    ffn = weight_format(weight_dtype).bytes_for(ffn_params)
    return total - ffn, ffn


def _usable(gpu, memory_fraction: float) -> int:
    return int(gpu.memory_bytes * memory_fraction) - DEFAULT_RUNTIME_OVERHEAD_BYTES


def _phase_times(shape, batch: int, ffn_tokens: int, context: int, attn_roof, ffn_roof, dtypes):
    attn = [o for o in decode_ops(shape, batch, context, **dtypes) if o.name not in FFN_OPS]
    ffn = [o for o in decode_ops(shape, ffn_tokens, context, **dtypes) if o.name in FFN_OPS]
    t_a = sum(attn_roof.time_s(o.flops, o.bytes) for o in attn)
    t_f = sum(ffn_roof.time_s(o.flops, o.bytes) for o in ffn)
    f_flops = sum(o.flops for o in ffn)
    f_bytes = sum(o.bytes for o in ffn)
    return t_a, t_f, f_flops, f_bytes


def _exchange_s(
    shape, tokens_per_gpu: int, n_targets: int, remote_share: float, link, act_bytes: int
) -> float:
    """Dispatch + combine of one step: each token's hidden state goes once to every GPU that
    hosts one of its k experts (with uniform routing over ``n_targets`` GPUs that is
    n (1 - (1 - 1/n)^k) GPUs), ``remote_share`` of them over ``link``, and comes back."""
    k = shape.moe.active_experts
    copies = n_targets * (1.0 - (1.0 - 1.0 / n_targets) ** k)
    moe_layers = sum(shape.is_moe_layer(i) for i in range(shape.layers))
    per_layer = tokens_per_gpu * copies * remote_share * shape.hidden * act_bytes
    return 2 * moe_layers * p2p_transfer_s(per_layer, link)


def _point(
    mode,
    shape,
    context,
    a_gpu,
    f_gpu,
    n_a,
    n_f,
    b,
    t_a,
    t_f,
    t_x,
    f_flops,
    f_bytes,
    ffn_roof,
    overlap_s,
):
    step = overlap_s
    seq = t_a + t_f + t_x
    tokens = n_a * b
    gpus = n_a + (n_f if mode == "split" else 0)
    usd = a_gpu.price_usd_per_hour * n_a + (
        f_gpu.price_usd_per_hour * n_f if mode == "split" else 0.0
    )
    tps = tokens / step
    return AFDPoint(
        mode=mode,
        model=shape.name,
        context=context,
        attention_gpu=a_gpu.name,
        ffn_gpu=f_gpu.name,
        n_attention_gpus=n_a,
        n_ffn_gpus=n_f,
        batch=tokens,
        batch_per_attention_gpu=b,
        attention_ms=t_a * 1e3,
        ffn_ms=t_f * 1e3,
        transfer_ms=t_x * 1e3,
        step_ms=step * 1e3,
        sequential_step_ms=seq * 1e3,
        ffn_tokens=tokens,
        ffn_intensity=f_flops / f_bytes,
        ffn_flops_utilization=(f_flops / t_f) / ffn_roof.peak_flops if t_f else 0.0,
        tokens_per_s=tps,
        tokens_per_s_per_gpu=tps / gpus,
        usd_per_hour=usd,
        usd_per_m_tokens=usd / (tps * 3600) * 1e6,
    )


def colocated_moe(
    model: Any = "deepseek-v3",
    gpu: str = "H200",
    n_gpus: int = 16,
    context: int = 8192,
    batch_per_gpu: int | None = None,
    weight_dtype: str = "fp8",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
    link: Any = None,
) -> AFDPoint:
    """DP attention + expert parallelism over ``n_gpus``: each GPU decodes its own users."""
    shape = as_shape(model)
    if shape.moe is None:
        raise ValueError(
            f"{shape.name} is not a mixture of experts: there is no expert FFN to split off"
        )
    spec = get_gpu(gpu)
    attn_w, ffn_w = _sides(shape, weight_dtype)
    room = _usable(spec, memory_fraction) - attn_w - ffn_w / n_gpus
    per_user = kv_bytes(shape, context, 1, kv_dtype)
    b_max = int(room // per_user)
    if b_max < 1:
        raise ValueError(
            f"{shape.name} does not fit {n_gpus}x {spec.name} with room for KV at {context} tokens"
        )
    b = min(batch_per_gpu or b_max, b_max)
    dtypes = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    one, group = gpu_roof(spec.name), gpu_roof(spec.name, n_gpus=n_gpus)
    t_a, t_f, f_flops, f_bytes = _phase_times(shape, b, n_gpus * b, context, one, group, dtypes)
    t_x = _exchange_s(
        shape, b, n_gpus, (n_gpus - 1) / n_gpus, link or spec.link(), kv_bytes_per_element("bf16")
    )
    return _point(
        "colocated",
        shape,
        context,
        spec,
        spec,
        n_gpus,
        n_gpus,
        b,
        t_a,
        t_f,
        t_x,
        f_flops,
        f_bytes,
        group,
        max(t_a + t_f, t_x),
    )


def split_moe(
    model: Any = "deepseek-v3",
    attention_gpu: str = "H200",
    ffn_gpu: str = "H200",
    n_attention: int = 8,
    n_ffn: int = 8,
    context: int = 8192,
    batch_per_gpu: int | None = None,
    weight_dtype: str = "fp8",
    kv_dtype: str = "bf16",
    memory_fraction: float = 0.9,
    link: Any = "infiniband-ndr400",
) -> AFDPoint:
    """``n_attention`` attention GPUs (attention weights + KV) feeding ``n_ffn`` FFN GPUs (experts)."""
    shape = as_shape(model)
    if shape.moe is None:
        raise ValueError(
            f"{shape.name} is not a mixture of experts: there is no expert FFN to split off"
        )
    a, f = get_gpu(attention_gpu), get_gpu(ffn_gpu)
    attn_w, ffn_w = _sides(shape, weight_dtype)
    if ffn_w / n_ffn > _usable(f, memory_fraction):
        raise ValueError(f"the experts ({ffn_w / 1e9:.0f} GB) do not fit {n_ffn}x {f.name}")
    per_user = kv_bytes(shape, context, 1, kv_dtype)
    b_max = int((_usable(a, memory_fraction) - attn_w) // per_user)
    if b_max < 1:
        raise ValueError(f"the attention weights leave no room for KV on {a.name}")
    b = min(batch_per_gpu or b_max, b_max)
    dtypes = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    ffn_roof = gpu_roof(f.name, n_gpus=n_ffn)
    t_a, t_f, f_flops, f_bytes = _phase_times(
        shape, b, n_attention * b, context, gpu_roof(a.name), ffn_roof, dtypes
    )
    t_x = _exchange_s(shape, b, n_ffn, 1.0, link, kv_bytes_per_element("bf16"))
    return _point(
        "split",
        shape,
        context,
        a,
        f,
        n_attention,
        n_ffn,
        b,
        t_a,
        t_f,
        t_x,
        f_flops,
        f_bytes,
        ffn_roof,
        max(t_a, t_f, t_x),
    )


def min_ffn_gpus(
    model: Any, ffn_gpu: str, weight_dtype: str = "fp8", memory_fraction: float = 0.9
) -> int:
    """The fewest FFN GPUs that hold all the experts."""
    shape = as_shape(model)
    _, ffn_w = _sides(shape, weight_dtype)
    return -(-ffn_w // _usable(get_gpu(ffn_gpu), memory_fraction))


def compare_attention_ffn(
    model: Any = "deepseek-v3",
    gpu: str = "H200",
    n_gpus: int = 16,
    attention_gpu: str | None = None,
    ffn_gpu: str | None = None,
    context: int = 8192,
    weight_dtype: str = "fp8",
    **kwargs: Any,
) -> dict[str, Any]:
    """Colocated on ``n_gpus`` next to every split of the same GPU count, and the best split by
    tokens/s per GPU. Returns ``{"colocated", "splits", "best_split", "gain"}``."""
    attention_gpu = attention_gpu or gpu
    ffn_gpu = ffn_gpu or gpu
    col = colocated_moe(model, gpu, n_gpus, context, weight_dtype=weight_dtype, **kwargs)
    splits = []
    for n_f in range(min_ffn_gpus(model, ffn_gpu, weight_dtype), n_gpus):
        try:
            splits.append(
                split_moe(
                    model,
                    attention_gpu,
                    ffn_gpu,
                    n_gpus - n_f,
                    n_f,
                    context,
                    weight_dtype=weight_dtype,
                    **kwargs,
                )
            )
        except ValueError:
            continue
    best = max(splits, key=lambda p: p.tokens_per_s_per_gpu) if splits else None
    return {
        "colocated": col,
        "splits": splits,
        "best_split": best,
        "gain": best.tokens_per_s_per_gpu / col.tokens_per_s_per_gpu if best else None,
    }
