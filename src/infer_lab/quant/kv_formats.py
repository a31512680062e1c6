"""KV-cache quantization: int8 or fp8 (e4m3) with one scale per token per head.

K and V are laid out ``(batch, kv_heads, tokens, head_dim)``. Each (token, head) vector gets its
own scale, so a new token is quantized once when it is written and never re-scaled later: that is
what lets a serving engine append to a quantized cache block by block. Scales are fp32 here, one
per token per head (4 bytes per ``head_dim`` codes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .formats import FP8_E4M3_MAX, INT8_MAX, require_fp8

KV_DTYPES = ("int8", "fp8")


@dataclass
class QuantizedKV:
    """Quantized K or V: ``codes`` shaped like the input, ``scale`` shaped ``(..., tokens, 1)``."""

    codes: torch.Tensor
    scale: torch.Tensor
    kv_dtype: str

    @property
    def nbytes(self) -> int:
        """Exact bytes stored: codes plus scales."""
        return (
            self.codes.numel() * self.codes.element_size()
            + self.scale.numel() * self.scale.element_size()
        )


def quantize_kv(x: torch.Tensor, kv_dtype: str = "int8") -> QuantizedKV:
    """Quantize K or V ``(..., tokens, head_dim)`` with one absmax scale per token per head."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")
    xf = x.detach().float()
    absmax = xf.abs().amax(dim=-1, keepdim=True)
    if kv_dtype == "int8":
        scale = torch.where(absmax > 0, absmax / INT8_MAX, torch.ones_like(absmax))
        codes = torch.round(xf / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    else:
        require_fp8()
        scale = torch.where(absmax > 0, absmax / FP8_E4M3_MAX, torch.ones_like(absmax))
        codes = (xf / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return QuantizedKV(codes=codes, scale=scale, kv_dtype=kv_dtype)


def dequantize_kv(q: QuantizedKV, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reconstruct K or V in ``dtype`` from :func:`quantize_kv`'s output."""
    return (q.codes.float() * q.scale).to(dtype)


def fake_quantize_kv(x: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """Round-trip ``x`` through the quantized KV format (what attention reads back from the cache)."""
    return dequantize_kv(quantize_kv(x, kv_dtype), x.dtype)


def kv_bytes_per_element(kv_dtype: str, head_dim: int) -> float:
    """Stored bytes per K or V element including the per-(token, head) fp32 scale, e.g. int8 at head_dim 64: 1.0625."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown KV dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")
    return 1 + 4 / head_dim


def attention_output_error(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_dtype: str
) -> dict[str, float]:
    """Relative error of the attention output when K and V come from a quantized cache.

    ``q`` is ``(batch, heads, q_len, d)`` and ``k``/``v`` ``(batch, kv_heads, kv_len, d)``; the query
    attends to all keys (decode-style, no mask). Returns ``rel_fro`` (||ΔO|| / ||O||) and ``max_abs``.
    """
    gqa = q.shape[1] != k.shape[1]
    exact = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    approx = F.scaled_dot_product_attention(
        q, fake_quantize_kv(k, kv_dtype), fake_quantize_kv(v, kv_dtype), enable_gqa=gqa
    )
    diff = (exact - approx).float()
    return {
        "rel_fro": float(diff.norm() / exact.float().norm()),
        "max_abs": float(diff.abs().max()),
    }
