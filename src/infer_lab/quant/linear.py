"""A linear layer that stores quantized weights and dequantizes them on the fly in ``forward``.

This is the simplest correct weight-only scheme: memory shrinks to the stored codes and scales,
while the matmul still runs in the activation dtype. A fused kernel would dequantize inside the
matmul tile instead of materializing the float weight; the bytes read from memory are the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .formats import (
    Int4Weight,
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    dequantize_nf4,
    quantize_fp8,
    quantize_int4,
    quantize_int8_absmax,
    quantize_nf4,
    quantize_q4_1,
)

SCHEMES = ("int8", "int4", "nf4", "q4_1", "fp8")


class DequantLinear(nn.Module):
    """``y = x @ dequant(W)^T + b`` with ``W`` kept as int8, packed int4/NF4/Q4_1 or fp8 codes plus scales.

    Build it with :meth:`from_linear`. The stored tensors are buffers, so ``state_dict`` and
    :meth:`weight_bytes` see exactly what is kept in memory.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        scheme: str,
        group_size: int | None = None,
        symmetric: bool = False,
        compute_dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
        self.in_features, self.out_features = in_features, out_features
        self.scheme, self.group_size, self.symmetric = scheme, group_size, symmetric
        self.compute_dtype = compute_dtype
        self.register_buffer("bias", None)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, scheme: str, group_size: int = 128, symmetric: bool = False
    ) -> DequantLinear:
        """Quantize an ``nn.Linear``'s weight with ``scheme`` (``'int8'``, ``'int4'``, ``'nf4'``, ``'q4_1'`` or ``'fp8'``).

        ``group_size`` applies to the 4-bit schemes, ``symmetric`` to int4 only (NF4 is always
        symmetric, Q4_1 always has a float minimum).
        """
        weight = linear.weight.data
        grouped = scheme in ("int4", "nf4", "q4_1")
        layer = cls(
            linear.in_features,
            linear.out_features,
            scheme,
            group_size if grouped else None,
            symmetric,
            compute_dtype=weight.dtype,
        )
        if scheme == "int8":
            q, scale = quantize_int8_absmax(weight)
            layer.register_buffer("qweight", q)
            layer.register_buffer("scale", scale)
        elif scheme == "fp8":
            q, scale = quantize_fp8(weight)
            layer.register_buffer("qweight", q)
            layer.register_buffer("scale", scale)
        else:
            if scheme == "nf4":
                packed = quantize_nf4(weight, group_size=group_size)
            elif scheme == "q4_1":
                packed = quantize_q4_1(weight, group_size=group_size)
            else:
                packed = quantize_int4(weight, group_size=group_size, symmetric=symmetric)
            layer.register_buffer("qweight", packed.packed)
            layer.register_buffer("scale", packed.scale)
            for name in ("zero", "minimum"):
                if getattr(packed, name) is not None:
                    layer.register_buffer(name, getattr(packed, name))
        if linear.bias is not None:
            layer.bias = linear.bias.data.clone()
        return layer

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight ``(out, in)`` this layer multiplies by, in ``compute_dtype``."""
        if self.scheme == "int8":
            return dequantize_int8(self.qweight, self.scale, self.compute_dtype)
        if self.scheme == "fp8":
            return dequantize_fp8(self.qweight, self.scale, self.compute_dtype)
        stored = Int4Weight(
            self.qweight,
            self.scale,
            getattr(self, "zero", None),
            self.group_size,
            (self.out_features, self.in_features),
            getattr(self, "minimum", None),
        )
        if self.scheme == "nf4":
            return dequantize_nf4(stored, self.compute_dtype)
        return dequantize_int4(stored, self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight().to(x.dtype), self.bias)

    def weight_bytes(self) -> int:
        """Exact bytes of everything stored for the weight (codes, scales, zero points), bias excluded."""
        return sum(
            b.numel() * b.element_size()
            for name, b in self.named_buffers()
            if name != "bias" and b is not None
        )

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        if self.scheme == "int4":
            group += f", symmetric={self.symmetric}"
        return f"in={self.in_features}, out={self.out_features}, scheme={self.scheme}{group}"
