"""The pieces of a Llama-family decoder layer, written once: RMSNorm, RoPE, attention, SwiGLU.

A decoder layer is ``h -> h + o(attend(rope(q), rope(k), v)) -> h + down(silu(gate) * up)``,
with an RMSNorm before each half. It is split at the one place where engines differ: how the
new K/V is stored and how each query finds its context. :func:`decoder_layer` takes that part
as a function (``attend``); every path of the engine (per-sequence, batched decode, static
shapes, CUDA graphs, torch.compile) runs this same layer with its own ``attend``.

The two halves around attention, :func:`attention_inputs` and :func:`layer_output`, take
tensors and plain numbers only, so ``torch.compile`` can compile each of them once for every
layer (a weights object as an argument would be a new guard, and a recompile, per layer).

The arithmetic follows transformers' ``LlamaForCausalLM`` (RMSNorm in fp32, the same RoPE
formula, SDPA with grouped-query heads), so greedy outputs match it token for token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..shape import ModelShape
from .cpu.prepack import linear

# ---------------------------------------------------------------------------------------------
# Normalization and rotary position embeddings


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, with the statistics in fp32 whatever the input dtype."""
    if x.dtype == torch.float32:  # the same arithmetic, two conversions fewer
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inverse_frequencies(
    head_dim: int, theta: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """RoPE's per-pair rotation speeds ``theta ** (-2i / head_dim)``, i in [0, head_dim / 2), fp32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim
    return 1.0 / (theta**exponents)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``(T, head_dim)`` for integer positions ``(T,)`` (angles in fp32)."""
    freqs = positions[:, None].float() * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension: the 90-degree turn RoPE mixes in."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (i, i + d/2) of ``x``'s last dimension by its position's angle.

    ``cos`` and ``sin`` broadcast against ``x``: ``(T, 1, d)`` for ``x`` of ``(T, heads, d)``
    (the engine's flat batch), ``(T, d)`` for ``x`` of ``(batch, heads, T, d)``.
    """
    return x * cos + rotate_half(x) * sin


# ---------------------------------------------------------------------------------------------
# Attention over a cache


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention of ``q (1, heads, n, d)`` over ``k, v (1, kv_heads, ctx, d)``, ctx >= n.

    The n queries are the last n positions of the context: query i sees keys 0 .. ctx - n + i.
    Grouped-query heads are shared by SDPA (``enable_gqa``) rather than copied.
    """
    n, ctx = q.shape[2], k.shape[2]
    if n == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    if n == ctx:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    offset = ctx - n
    allowed = torch.arange(ctx, device=q.device)[None, :] <= (
        torch.arange(n, device=q.device)[:, None] + offset
    )
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)


def context_mask(context_slots: torch.Tensor, context_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded context slots ``(B, L)`` made safe to gather, and the mask of real positions.

    Positions at or past ``context_lens[b]`` may point at slots never written, which can hold
    NaN (the store is ``torch.empty``), and 0 * NaN is NaN even through a masked softmax. They
    are pointed at the sequence's first slot, which always holds a token.
    """
    length = context_slots.shape[1]
    visible = torch.arange(length, device=context_slots.device)[None, :] < context_lens[:, None]
    return torch.where(visible, context_slots, context_slots[:, :1]), visible


def grouped_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query per sequence over its gathered context: ``q (B, heads, d)``, ``k, v (B, L, kv_heads, d)``.

    The heads sharing one KV head become that head's "query rows", so every K/V is read once
    for its whole group and no kernel needs to know about grouped-query attention.
    Returns ``(B, heads, d)``.
    """
    batch, heads, d = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, d)
    out = F.scaled_dot_product_attention(
        grouped, k.transpose(1, 2), v.transpose(1, 2), attn_mask=visible[:, None, None, :], scale=scale
    )
    return out.reshape(batch, heads, d)


def span_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, grouped: bool | None = None
) -> torch.Tensor:
    """One sequence's newest token over a context read in place: no gather, no mask.

    ``q (1, heads, d)``; ``k, v (L, kv_heads, d)``: views of the cache's consecutive slots that
    hold the whole context (its newest token included). Returns ``(1, heads * d)``.

    Two SDPA calls compute this attention. ``grouped``: the heads that share one KV head become
    that head's query rows, as in :func:`grouped_decode_attention`. Otherwise each head has one
    query row and SDPA shares the KV heads (``enable_gqa``): transformers' own call for one
    decoding token. SDPA's CPU kernel rounds a row differently when several rows share a call, so
    only the second is bit for bit transformers' (in bf16 the difference decides near-ties; tested).
    ``None`` picks by dtype, as measured on the course's 2-core EPYC: grouped below fp32, where it
    is several times faster; transformers' call in fp32, where it is the faster one.
    """
    _, heads, d = q.shape
    kv_heads = k.shape[1]
    if grouped is None:
        grouped = q.dtype != torch.float32
    keys, values = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if grouped:
        out = F.scaled_dot_product_attention(q.reshape(1, kv_heads, heads // kv_heads, d), keys, values, scale=scale)
    else:
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, scale=scale, enable_gqa=True)
    return out.reshape(1, heads * d)


def decode_attention(
    q: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
    context_slots: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence against its cached context, for ``B`` sequences in one call.

    Args:
        q: ``(B, heads, head_dim)``: each sequence's newest token (its K/V already in the store).
        k_store, v_store: ``(num_slots, kv_heads, head_dim)``: one layer of the cache.
        context_slots: ``(B, L)`` int64: the slot of context position j of sequence b; entries
            at ``j >= context_lens[b]`` may be any valid slot, written or not (they are masked).
        context_lens: ``(B,)`` int64, each >= 1.
        scale: softmax scale, ``head_dim ** -0.5``.
    Returns:
        ``(B, heads, head_dim)``.

    The gather copies the context once (PagedAttention kernels read blocks in place instead;
    here the copy keeps the idea visible and lets SDPA do the arithmetic).
    """
    safe, visible = context_mask(context_slots, context_lens)
    return grouped_decode_attention(q, k_store[safe], v_store[safe], visible, scale)


# ---------------------------------------------------------------------------------------------
# The decoder layer


@dataclass
class LayerWeights:
    """One decoder layer's tensors, projections fused: q|k|v is one matrix, gate|up is another.

    At batch 1 a GEMV streams its matrix once; a small k or v projection does not reach full
    memory bandwidth on its own, the fused one does. The fusion happens once, when the model
    is loaded (:func:`infer_lab.engine.model.fuse_projections`).
    """

    input_norm: torch.Tensor
    qkv_proj: torch.Tensor  # (heads * d + 2 * kv_heads * d, hidden)
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_up_proj: torch.Tensor  # (2 * intermediate, hidden)
    down_proj: torch.Tensor


def attention_inputs(
    h: torch.Tensor,
    input_norm: torch.Tensor,
    qkv_proj: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    fused: bool = True,
    mm: Callable[..., torch.Tensor] = linear,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first half of a layer: norm, the q, k, v projections, RoPE on q and k.

    ``h`` is ``(T, hidden)``; returns q ``(T, heads, d)`` and k, v ``(T, kv_heads, d)``.
    ``fused``: one GEMM over the stacked q|k|v matrix; otherwise three GEMMs over its rows
    (the same numbers, for measuring what the fusion buys). ``mm(x, weight, bias)`` multiplies
    (``x @ weight.T + bias``): the engine's GEMM, or :func:`~.cpu.cpu_decode.gemv` for one token.
    """
    x = rms_norm(h, input_norm, eps)
    sizes = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    if fused:
        # q and k side by side in the GEMM's output: one RoPE over both (fewer, larger ops).
        qkv = mm(x, qkv_proj, qkv_bias)
        qk = apply_rope(qkv[:, : sizes[0] + sizes[1]].reshape(-1, heads + kv_heads, head_dim), cos, sin)
        q, k = qk.split((heads, kv_heads), dim=1)
        return q, k, qkv[:, sizes[0] + sizes[1] :].reshape(-1, kv_heads, head_dim)
    biases = qkv_bias.split(sizes) if qkv_bias is not None else (None, None, None)
    q, k, v = (F.linear(x, w, b) for w, b in zip(qkv_proj.split(sizes), biases, strict=True))
    q = apply_rope(q.reshape(-1, heads, head_dim), cos, sin)
    k = apply_rope(k.reshape(-1, kv_heads, head_dim), cos, sin)
    return q, k, v.reshape(-1, kv_heads, head_dim)


def layer_output(
    h: torch.Tensor,
    attn: torch.Tensor,
    o_proj: torch.Tensor,
    post_attention_norm: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    eps: float,
    fused: bool = True,
    mm: Callable[..., torch.Tensor] = linear,
) -> torch.Tensor:
    """The second half: output projection and residual, then the SwiGLU MLP and its residual.

    ``mm`` multiplies, as in :func:`attention_inputs`.
    """
    h = h + mm(attn, o_proj)
    x = rms_norm(h, post_attention_norm, eps)
    if fused:
        gate, up = mm(x, gate_up_proj).chunk(2, dim=-1)
    else:
        gate_w, up_w = gate_up_proj.chunk(2, dim=0)
        gate, up = F.linear(x, gate_w), F.linear(x, up_w)
    return h + mm(F.silu(gate) * up, down_proj)


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class LayerFunctions:
    """How an engine runs the two halves of every layer: fused GEMMs or not, compiled or not.

    Each engine has its own; the model's weights are the same either way. ``custom`` and
    ``logits`` replace the halves and the LM head outright (``custom``: ``(first, second)``
    with the signatures of :func:`attention_inputs` and :func:`layer_output`; ``logits``:
    ``(h, final_norm, lm_head, eps) -> logits``); :mod:`.cpu.cpu_decode` gives such a set for one token.
    """

    fused: bool = True
    compiled: bool = False
    custom: tuple[Callable[..., Any], Callable[..., Any]] | None = None
    logits: Callable[..., torch.Tensor] | None = None

    def halves(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """``(attention_inputs, layer_output)``, through torch.compile when ``compiled``."""
        if self.custom is not None:
            return self.custom
        return _compiled_halves() if self.compiled else (attention_inputs, layer_output)


@functools.cache
def _compiled_halves() -> tuple[Callable[..., Any], Callable[..., Any]]:
    # Once per process, dynamic shapes: one graph serves every layer and (nearly) every batch.
    return (
        torch.compile(attention_inputs, dynamic=True),
        torch.compile(layer_output, dynamic=True),
    )


def decoder_layer(
    h: torch.Tensor,
    w: LayerWeights,
    attend: Attend,
    cos: torch.Tensor,
    sin: torch.Tensor,
    shape: ModelShape,
    fns: LayerFunctions,
) -> torch.Tensor:
    """One decoder layer over a flat batch ``h (T, hidden)``.

    ``attend(q, k, v)`` stores the new K/V wherever this engine keeps it and returns each
    query's attention output, ``(T, heads, d)`` or already flat ``(T, heads * d)``.
    """
    first, second = fns.halves()
    eps = shape.rms_norm_eps
    q, k, v = first(
        h, w.input_norm, w.qkv_proj, w.qkv_bias, cos, sin, eps,
        shape.heads, shape.kv_heads, shape.head_dim, fns.fused,
    )  # fmt: skip
    attn = attend(q, k, v).flatten(1)
    return second(
        h, attn, w.o_proj, w.post_attention_norm, w.gate_up_proj, w.down_proj, eps, fns.fused
    )
