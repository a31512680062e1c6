"""Quantized weights that decode faster: PyTorch's own weight-only int8 and int4 CPU matmuls.

:class:`~.linear.DequantLinear` is the readable reference: it rebuilds the float weight from
its codes on every call and then multiplies, so it reads the small codes *and* writes and reads
a full float matrix: slower than not quantizing at all. A fused kernel reads only the codes and
scales and dequantizes inside the matmul's inner loop, so decode, which streams every weight
once per token, gets faster by about the ratio of the bytes.

PyTorch ships two such kernels for the CPU (the ones gpt-fast uses on a GPU):

* ``aten._weight_int8pack_mm(x, codes, scales)``: int8 codes ``(out, in)``, one scale per
  output row: exactly :func:`~.formats.quantize_int8_absmax`'s codes and scales.
* ``aten._weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)``: 4-bit codes
  reordered once by ``aten._convert_weight_to_int4pack_for_cpu``, a scale and an offset per
  group of ``group_size`` inputs: :func:`~.formats.quantize_int4`'s and
  :func:`~.formats.quantize_q4_1`'s codes, with the offset rewritten for the kernel's
  ``w = (code - 8) * scale + offset`` convention.

Their fast paths take bf16 activations (fp32 ones run a scalar loop, ~5x slower), so each call
rounds its input to bf16 and returns the model's dtype: the one difference from the reference's
arithmetic, measured by the quality checks like any other quantization error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import fast_paths
from .formats import Int4Weight, quantize_int8_absmax, quantize_q4_1, unpack_int4
from .linear import DequantLinear

ACT_DTYPE = torch.bfloat16  # what the kernels' vectorized paths multiply in
INT4_GROUPS = (32, 64, 128, 256)
KERNEL_METHODS = ("int8", "int4")  # engine weight_quant values: int8, int4 (g32), int4-gN


def available() -> bool:
    """True when this PyTorch has both CPU kernels."""
    ops = torch.ops.aten
    return all(hasattr(ops, name) for name in
               ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu"))


def _probe(scheme: str) -> str | None:
    if not available():
        return "this PyTorch build lacks the CPU kernels (aten._weight_int8pack_mm, _weight_int4pack_mm_for_cpu)"
    w, x = fast_paths.numbers(16, 64, 2), fast_paths.numbers(3, 64, 3)
    weight = quantize_weight(w, scheme)
    if isinstance(weight, Int8KernelWeight):
        reference = F.linear(x.to(ACT_DTYPE).float(), weight.codes.float() * weight.scales.float()[:, None])
        rel = 2e-2  # the same codes: bf16 rounding only
    else:
        reference, rel = F.linear(x, w), 0.25  # 4 bits of 16 numbers: loosely, against the float weight
    if not fast_paths.close(weight.linear(x), reference, rel):
        return f"the {scheme} kernel gave other numbers than its dequantized weights"
    return None


def verdict(method: str) -> fast_paths.Verdict:
    """Whether this PyTorch runs ``method``'s fused kernel (int8, or int4 in any group size) here:
    probed once per process on a tiny weight (:mod:`infer_lab.fast_paths`)."""
    scheme, _ = parse_method(method)
    return fast_paths.ask(f"{scheme}-kernel", lambda: _probe(scheme))


def refusal(method: str) -> str | None:
    """Why an engine model quantized by ``method`` cannot run here, or None when it can.

    A 4-bit model keeps its LM head in int8 (:meth:`~infer_lab.engine.model.EngineModel.quantized`),
    so it needs both kernels.
    """
    scheme, _ = parse_method(method)
    for needed in (("int8",) if scheme == "int8" else ("int4", "int8")):
        why = verdict(needed).refusal()
        if why is not None:
            return why
    return None


@dataclass(frozen=True)
class Int8KernelWeight:
    """int8 codes ``(out, in)`` and bf16 per-row scales ``(out,)`` for ``aten._weight_int8pack_mm``."""

    codes: torch.Tensor
    scales: torch.Tensor
    kernel = "aten._weight_int8pack_mm"

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + self.scales.numel() * self.scales.element_size()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T (+ bias)`` for ``x (..., in)``, in ``x``'s dtype."""
        flat = x.reshape(-1, x.shape[-1]).to(ACT_DTYPE)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.codes, self.scales).to(x.dtype)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if bias is None else y + bias


@dataclass(frozen=True)
class Int4KernelWeight:
    """4-bit codes packed for ``aten._weight_int4pack_mm_for_cpu``, bf16 ``(groups, out, 2)`` scales and offsets."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    group_size: int
    shape: tuple[int, int]
    kernel = "aten._weight_int4pack_mm_for_cpu"

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(ACT_DTYPE)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size,
                                                        self.scales_and_zeros).to(x.dtype)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y if bias is None else y + bias


KernelWeight = Int8KernelWeight | Int4KernelWeight
# weight (out, in) -> (int8 codes (out, in), one scale per output row, (out, 1) or (out,))
Int8Quantizer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def int8_weight(weight: torch.Tensor, quantizer: Int8Quantizer = quantize_int8_absmax) -> Int8KernelWeight:
    """Quantize a float ``(out, in)`` weight to int8 per output row (the reference's codes by default)."""
    codes, scale = quantizer(weight)
    return int8_from_codes(codes, scale)


def int8_from_codes(codes: torch.Tensor, scale: torch.Tensor) -> Int8KernelWeight:
    return Int8KernelWeight(codes.contiguous(), scale.reshape(-1).to(ACT_DTYPE).contiguous())


def int4_from_stored(stored: Int4Weight) -> Int4KernelWeight:
    """The kernel's layout of a reference 4-bit weight (int4 with or without zero points, or Q4_1)."""
    out_f, in_f = stored.shape
    g = stored.group_size
    if g not in INT4_GROUPS or in_f % g:
        raise ValueError(f"the int4 kernel needs a group size in {INT4_GROUPS} that divides the "
                         f"{in_f} inputs; got {g}")
    codes = unpack_int4(stored.packed).to(torch.int32)  # (out, in), 0..15
    scale = stored.scale.float()
    if stored.minimum is not None:  # Q4_1: w = code * scale + minimum
        offset = stored.minimum.float() + 8 * scale
    elif stored.zero is not None:  # int4 zero-point: w = (code - zero) * scale
        offset = (8 - stored.zero.float()) * scale
    else:  # symmetric: w = (code - 8) * scale
        offset = torch.zeros_like(scale)
    sz = torch.stack([scale.t(), offset.t()], dim=-1).to(ACT_DTYPE).contiguous()  # (groups, out, 2)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
    return Int4KernelWeight(packed, sz, g, (out_f, in_f))


def int4_weight(weight: torch.Tensor, group_size: int = 32) -> Int4KernelWeight:
    """Quantize a float ``(out, in)`` weight to 4 bits in groups of ``group_size`` inputs.

    The codes are GGUF's Q4_1 (:func:`~.formats.quantize_q4_1`: a scale and a float minimum per
    group), not int4 with an integer zero point: the kernel takes a float offset anyway, and a
    float minimum represents each group's range exactly (on the course's Q4_1-derived weights
    it gives the shipped codes back).
    """
    return int4_from_stored(quantize_q4_1(weight, group_size=group_size))


def parse_method(method: str) -> tuple[str, int]:
    """``int8`` -> ("int8", 0); ``int4`` -> ("int4", 32); ``int4-g64`` -> ("int4", 64)."""
    if method == "int8":
        return "int8", 0
    if method == "int4":
        return "int4", 32
    if method.startswith("int4-g") and method[6:].isdigit() and int(method[6:]) in INT4_GROUPS:
        return "int4", int(method[6:])
    raise ValueError(f"weight quantization must be int8, int4 or int4-gN (N in {INT4_GROUPS}); got {method!r}")


def quantize_weight(weight: torch.Tensor, method: str,
                    int8_quantizer: Int8Quantizer = quantize_int8_absmax) -> KernelWeight:
    """One float weight quantized for its kernel by ``method`` (see :func:`parse_method`).

    ``int8_quantizer`` makes the codes and per-row scales of an int8 weight.
    """
    scheme, group = parse_method(method)
    return int8_weight(weight, int8_quantizer) if scheme == "int8" else int4_weight(weight, group)


def from_dequant_linear(layer: Any) -> KernelWeight | None:
    """The kernel weight holding exactly a :class:`~.linear.DequantLinear`'s codes, or None if none fits."""
    if layer.scheme == "int8":
        return int8_from_codes(layer.qweight, layer.scale)
    if layer.scheme in ("int4", "q4_1"):
        stored = Int4Weight(layer.qweight, layer.scale, getattr(layer, "zero", None), layer.group_size,
                            (layer.out_features, layer.in_features), getattr(layer, "minimum", None))
        try:
            return int4_from_stored(stored)
        except ValueError:
            return None
    return None


@contextlib.contextmanager
def kernel_linears(model: nn.Module) -> Iterator[list[str]]:
    """Run every :class:`~.linear.DequantLinear` of ``model`` through its fused kernel while inside.

    Yields the kernels used (empty when no layer has one: NF4, fp8, a group size the kernel
    does not take, or a kernel this machine refuses, :func:`verdict`). The kernel weights are built on entry and dropped on exit; the reference
    layers are unchanged afterwards.
    """
    swapped: list[nn.Module] = []
    kernels: list[str] = []
    try:
        if available():
            for module in model.modules():
                if isinstance(module, DequantLinear):
                    w = from_dequant_linear(module)
                    if w is None or not verdict("int8" if isinstance(w, Int8KernelWeight) else "int4").supported:
                        continue  # no kernel for it here: the reference layer runs
                    module.forward = lambda x, _w=w, _b=module.bias: _w.linear(x, _b)
                    swapped.append(module)
                    if w.kernel not in kernels:
                        kernels.append(w.kernel)
        yield kernels
    finally:
        for module in swapped:
            del module.forward
