"""Chapter 06 · Quantization: reference solutions."""

import math

import torch


def quantize_int8_absmax(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row from its absmax; round to nearest; clamp to the symmetric range."""
    w = weight.float()
    absmax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    codes = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return codes, scale


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Each code times its row's scale (the (out, 1) scales broadcast along the row), in fp32."""
    return codes.float() * scale


def int4_stored_bytes(out_features: int, in_features: int, group_size: int, symmetric: bool) -> int:
    """Half a byte per code, 2 bytes per fp16 scale, 1 byte per zero point when asymmetric."""
    groups = out_features * math.ceil(in_features / group_size)
    codes = out_features * in_features // 2
    return codes + groups * (2 if symmetric else 3)


def int8_relative_error(absmax: float, rms: float) -> float:
    """Uniform rounding error over a step of absmax / 127: rms step / sqrt(12), over the row's rms."""
    return absmax / 127 / math.sqrt(12) / rms
