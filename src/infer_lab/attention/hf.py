"""Attention changes applied to a real transformers model (Llama-family, e.g. the embedded SmolLM2).

* :func:`convert_to_mqa` turns a GQA model into MQA (or fewer KV heads) by mean-pooling the K
  and V projection heads of each group, the starting point the GQA paper uses before uptraining.
  Without uptraining the quality drop is the honest price of the conversion.
* :func:`patched_attention` runs the model with its attention computed by our code, optionally
  through a quantized KV cache (int8/fp8 round trip) or with a sliding-window mask, to measure
  the quality cost of each choice with :func:`infer_lab.evaluation.perplexity`.
"""

from __future__ import annotations

import copy
import itertools
from contextlib import contextmanager

import torch
from torch import nn

from ..quant.kv_formats import fake_quantize_kv
from .reference import expand_kv_heads, position_mask

_registered = itertools.count()


def _attention_layers(model: nn.Module) -> list[nn.Module]:
    layers = [
        m
        for m in model.modules()
        if hasattr(m, "k_proj") and hasattr(m, "v_proj") and hasattr(m, "q_proj")
    ]
    if not layers:
        raise ValueError(
            "no attention layers with q_proj/k_proj/v_proj found: only Llama-style models are supported"
        )
    return layers


def convert_to_mqa(model: nn.Module, n_kv_heads: int = 1, inplace: bool = False) -> nn.Module:
    """Mean-pool K/V heads down to ``n_kv_heads`` (1 = MQA); returns the converted model (a copy by default).

    Each new KV head is the mean of the old KV heads it replaces, for the K and the V projection.
    The query heads are untouched; the config's ``num_key_value_heads`` is updated.
    """
    config = model.config
    old_kv, n_heads = config.num_key_value_heads, config.num_attention_heads
    if n_kv_heads < 1 or old_kv % n_kv_heads or n_heads % n_kv_heads:
        raise ValueError(
            f"cannot pool {old_kv} KV heads into {n_kv_heads}: it must divide both {old_kv} "
            f"KV heads and {n_heads} query heads"
        )
    target = model if inplace else copy.deepcopy(model)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    for attn in _attention_layers(target):
        for name in ("k_proj", "v_proj"):
            proj: nn.Linear = getattr(attn, name)
            weight = proj.weight.data.view(
                n_kv_heads, old_kv // n_kv_heads, head_dim, proj.in_features
            )
            pooled = nn.Linear(
                proj.in_features,
                n_kv_heads * head_dim,
                bias=proj.bias is not None,
                dtype=proj.weight.dtype,
                device=proj.weight.device,
            )
            pooled.weight.data.copy_(
                weight.mean(dim=1).reshape(n_kv_heads * head_dim, proj.in_features)
            )
            if proj.bias is not None:
                pooled.bias.data.copy_(
                    proj.bias.data.view(n_kv_heads, -1, head_dim).mean(dim=1).reshape(-1)
                )
            setattr(attn, name, pooled)
        attn.num_key_value_groups = n_heads // n_kv_heads
    target.config.num_key_value_heads = n_kv_heads
    return target


@contextmanager
def patched_attention(model: nn.Module, kv_dtype: str | None = None, window: int | None = None):
    """Inside the ``with`` block, ``model`` attends through our function: K/V round-tripped through
    ``kv_dtype`` ('int8'/'fp8', per token per head) and/or a sliding ``window`` (tokens).

    The model's previous attention implementation is restored on exit.
    """
    from transformers import AttentionInterface  # defers transformers
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # defers transformers

    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 token, got {window}")

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if kv_dtype is not None:
            key, value = fake_quantize_kv(key, kv_dtype), fake_quantize_kv(value, kv_dtype)
        q_len, kv_len = query.shape[-2], key.shape[-2]
        allowed = position_mask(
            torch.arange(kv_len - q_len, kv_len, device=query.device),
            torch.arange(kv_len, device=query.device),
            causal=True,
            window=window,
        )
        if attention_mask is not None:
            extra = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
            allowed = allowed & extra
        out = torch.nn.functional.scaled_dot_product_attention(
            query,
            expand_kv_heads(key, query.shape[1]),
            expand_kv_heads(value, query.shape[1]),
            attn_mask=allowed,
            scale=scaling,
        )
        return out.transpose(1, 2).contiguous(), None

    name = f"infer_lab_patched_{next(_registered)}"
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    previous = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield model
    finally:
        model.config._attn_implementation = previous
