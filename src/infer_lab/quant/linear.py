"""A linear layer that stores quantized weights and dequantizes them on the fly in ``forward``.

This is the simplest correct weight-only scheme: memory shrinks to the stored codes and scales,
while the matmul still runs in the activation dtype. A fused kernel would dequantize inside the
matmul tile instead of materializing the float weight; the bytes read from memory are the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .core import (
    Int4Weight,
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    dequantize_nf4,
    quantize_fp8,
    quantize_int4,
    quantize_int8_absmax,
    quantize_nf4,
)

SCHEMES = ("int8", "int4", "nf4", "fp8")


class DequantLinear(nn.Module):
    """``y = x @ dequant(W)^T + b`` with ``W`` kept as int8, packed int4/NF4 or fp8 codes plus scales.

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
        """Quantize an ``nn.Linear``'s weight with ``scheme`` (``'int8'``, ``'int4'``, ``'nf4'`` or ``'fp8'``).

        ``group_size`` and ``symmetric`` apply to the 4-bit schemes (NF4 is always symmetric).
        """
        weight = linear.weight.data
        grouped = scheme in ("int4", "nf4")
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
            packed = (
                quantize_nf4(weight, group_size=group_size)
                if scheme == "nf4"
                else quantize_int4(weight, group_size=group_size, symmetric=symmetric)
            )
            layer.register_buffer("qweight", packed.packed)
            layer.register_buffer("scale", packed.scale)
            if packed.zero is not None:
                layer.register_buffer("zero", packed.zero)
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
        group = (
            f", group_size={self.group_size}, symmetric={self.symmetric}" if self.group_size else ""
        )
        return f"in={self.in_features}, out={self.out_features}, scheme={self.scheme}{group}"
