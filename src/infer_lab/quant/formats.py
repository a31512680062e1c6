"""Weight formats written from scratch: int8 absmax per row, group-wise int4, NF4, GGUF's Q4_1, fp8 e4m3.

Every quantizer returns the stored tensors (integer codes and scales) and has an exact inverse
that reconstructs an approximate float weight. Shapes follow ``nn.Linear``: a weight is
``(out_features, in_features)`` and "per output channel" means one scale per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..analysis.memory import WEIGHT_FORMATS, NumberFormat

INT8_MAX = 127
INT4_LEVELS = 16  # codes 0..15 in a nibble
FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value


def _require_2d(name: str, weight: torch.Tensor) -> None:
    if weight.dim() != 2:
        raise ValueError(
            f"{name} expects a 2-D (out_features, in_features) weight, got shape {tuple(weight.shape)}"
        )


# ---------------------------------------------------------------------------------------------
# int8 absmax, one scale per output channel


def quantize_int8_absmax(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one fp32 scale per output row: ``w ≈ q * scale``, ``q in [-127, 127]``.

    The scale maps each row's largest magnitude to 127, so one outlier in a row coarsens the
    step for every other weight of that row (the outlier problem).

    Returns:
        ``(q, scale)``: int8 codes shaped like ``weight`` and fp32 scales shaped ``(out, 1)``.
    """
    _require_2d("quantize_int8_absmax", weight)
    w = weight.detach().float()
    absmax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / INT8_MAX, torch.ones_like(absmax))
    q = torch.round(w / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_int8(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`quantize_int8_absmax`: ``q * scale`` in ``dtype``."""
    return (q.float() * scale).to(dtype)


# ---------------------------------------------------------------------------------------------
# int4 group-wise, two codes per byte


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack unsigned 4-bit codes (values 0..15, last dim even) two per byte: low nibble first.

    ``(..., n)`` uint8 codes become ``(..., n // 2)`` uint8 bytes: exactly half a byte per code.
    """
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even last dimension, got {codes.shape[-1]}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= INT4_LEVELS):
        raise ValueError("pack_int4 expects codes in 0..15")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: ``(..., n // 2)`` bytes to ``(..., n)`` uint8 codes 0..15."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)


@dataclass
class Int4Weight:
    """A group-wise 4-bit weight as stored: packed codes plus per-group scales (and offsets).

    ``packed``: uint8 ``(out, in // 2)``; ``scale``: fp16 ``(out, n_groups)`` (NF4: fp32, see
    :data:`NF4_ABSMAX_DTYPE`);
    ``zero``: uint8 ``(out, n_groups)`` integer zero points (int4 zero-point scaling);
    ``minimum``: fp16 ``(out, n_groups)`` float offsets (GGUF's Q4_1); both ``None`` for symmetric.
    """

    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    group_size: int
    shape: tuple[int, int]
    minimum: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Exact stored bytes: codes + scales (+ zero points or minimums)."""
        tensors = [t for t in (self.packed, self.scale, self.zero, self.minimum) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def _grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(out, in)`` to ``(out, n_groups, group_size)``; a short last group is padded with copies of
    the row's last value, which changes neither its min nor its max (and is never stored)."""
    out_f, in_f = weight.shape
    if group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even number >= 2, got {group_size}")
    if in_f % 2:
        raise ValueError(f"4-bit packing needs an even in_features, got {in_f}")
    w = weight.detach().float()
    pad = -in_f % group_size
    if pad:
        w = torch.cat([w, w[:, -1:].expand(out_f, pad)], dim=1)
    return w.reshape(out_f, -1, group_size)


def _ungrouped_codes(w: Int4Weight) -> torch.Tensor:
    """Unpacked codes ``(out, n_groups, group_size)``, the padding of a short last group filled with 0."""
    out_f, in_f = w.shape
    codes = unpack_int4(w.packed)
    pad = -in_f % w.group_size
    if pad:
        codes = torch.cat([codes, codes.new_zeros(out_f, pad)], dim=1)
    return codes.reshape(out_f, -1, w.group_size)


# int4's one definition for the memory equation (chapter 03) and this quantizer: 4-bit codes plus one
# scale per group, as WEIGHT_FORMATS["int4"] counts it. That is exactly what ``symmetric=True`` stores;
# the zero-point variant (the default) also stores one uint8 zero point per group, INT4_ZERO_POINT_BITS more.
INT4_FORMAT: NumberFormat = WEIGHT_FORMATS["int4"]
INT4_SCALE_DTYPE = {16: torch.float16, 32: torch.float32}[INT4_FORMAT.scale_bits]
INT4_ZERO_POINT_DTYPE = torch.uint8  # one per group, zero-point variant only
INT4_ZERO_POINT_BITS = torch.iinfo(INT4_ZERO_POINT_DTYPE).bits


def quantize_int4(
    weight: torch.Tensor, group_size: int = INT4_FORMAT.group_size, symmetric: bool = False
) -> Int4Weight:
    """Group-wise 4-bit quantization of a 2-D weight, packed two codes per byte.

    Each row is cut into groups of ``group_size`` consecutive input columns (the last one may be
    shorter: 576 columns at g128 are 4 full groups and one of 64) with their own scale, so an outlier only coarsens its own group. ``symmetric=False`` (zero-point) maps
    ``[min, max]`` of the group onto codes 0..15; ``symmetric=True`` maps ``[-absmax, absmax]``
    onto -8..7 (stored as code + 8) and needs no zero point. Scales are :data:`INT4_SCALE_DTYPE`, so the
    symmetric variant stores the bits :data:`INT4_FORMAT` counts; the zero-point one adds
    :data:`INT4_ZERO_POINT_BITS` per group.
    """
    _require_2d("quantize_int4", weight)
    out_f, in_f = weight.shape
    groups = _grouped(weight, group_size)
    if symmetric:
        absmax = groups.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(absmax > 0, absmax / 7, torch.ones_like(absmax)).to(INT4_SCALE_DTYPE).float()
        codes = (torch.round(groups / scale).clamp(-8, 7) + 8).to(torch.uint8)
        zero = None
    else:
        low = groups.amin(dim=-1, keepdim=True)
        high = groups.amax(dim=-1, keepdim=True)
        scale = (high - low) / (INT4_LEVELS - 1)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale)).to(INT4_SCALE_DTYPE).float()
        zero_f = torch.round(-low / scale).clamp(0, INT4_LEVELS - 1)
        codes = (torch.round(groups / scale) + zero_f).clamp(0, INT4_LEVELS - 1).to(torch.uint8)
        zero = zero_f.squeeze(-1).to(INT4_ZERO_POINT_DTYPE)
    return Int4Weight(
        packed=pack_int4(codes.reshape(out_f, -1)[:, :in_f]),
        scale=scale.squeeze(-1).to(INT4_SCALE_DTYPE),
        zero=zero,
        group_size=group_size,
        shape=(out_f, in_f),
    )


def dequantize_int4(w: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reconstruct the float weight ``(out, in)`` from an :class:`Int4Weight` (int4 or Q4_1)."""
    out_f, in_f = w.shape
    codes = _ungrouped_codes(w).float()
    scale = w.scale.float().unsqueeze(-1)
    if w.minimum is not None:
        values = codes * scale + w.minimum.float().unsqueeze(-1)
    else:
        offset = w.zero.float().unsqueeze(-1) if w.zero is not None else 8.0
        values = (codes - offset) * scale
    return values.reshape(out_f, -1)[:, :in_f].to(dtype)


# ---------------------------------------------------------------------------------------------
# Q4_1: GGUF's 4-bit format, a scale and a float minimum per group of 32


def quantize_q4_1(weight: torch.Tensor, group_size: int = 32) -> Int4Weight:
    """GGUF's Q4_1, written out: each group of ``group_size`` maps ``[min, max]`` onto codes 0..15.

    ``w ≈ code * scale + minimum`` with ``scale = (max - min) / 15`` and ``minimum`` both fp16.
    Unlike int4 zero-point scaling, the offset is a float, not a rounded integer code, so the
    group's minimum and maximum are represented exactly. llama.cpp stores 32 weights per block;
    the embedded SmolLM2 GGUF keeps every linear layer this way.
    """
    _require_2d("quantize_q4_1", weight)
    out_f, in_f = weight.shape
    groups = _grouped(weight, group_size)
    low = groups.amin(dim=-1, keepdim=True).half().float()
    high = groups.amax(dim=-1, keepdim=True)
    scale = ((high - low) / (INT4_LEVELS - 1)).half().float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round((groups - low) / scale).clamp(0, INT4_LEVELS - 1).to(torch.uint8)
    return Int4Weight(
        packed=pack_int4(codes.reshape(out_f, -1)[:, :in_f]),
        scale=scale.squeeze(-1).half(),
        zero=None,
        group_size=group_size,
        shape=(out_f, in_f),
        minimum=low.squeeze(-1).half(),
    )


# ---------------------------------------------------------------------------------------------
# NF4: 16 levels at normal quantiles, blockwise absmax


def nf4_levels() -> torch.Tensor:
    """The 16 NF4 values in [-1, 1], derived as in the QLoRA paper (not copied as constants).

    Weights are roughly normal, so levels placed at equal-probability quantiles of N(0, 1) use
    the 16 codes better than evenly spaced int4. 8 positive and 7 negative quantiles plus an
    exact zero, each side scaled so its outermost level is ±1.
    """
    edge = 0.5 * (1 / 32 + 1 / 30)  # the outermost quantile probability, 1 - 0.9677
    positive = torch.special.ndtri(torch.linspace(1 - edge, 0.5, 9, dtype=torch.float64)[:-1])
    negative = -torch.special.ndtri(torch.linspace(1 - edge, 0.5, 8, dtype=torch.float64)[:-1])
    levels = torch.cat(
        [
            positive / positive.max(),
            torch.zeros(1, dtype=torch.float64),
            negative / negative.abs().max(),
        ]
    )
    return levels.sort().values.float()


# NF4's one definition: the memory equation (chapter 03) counts it and this quantizer stores it, so the
# two agree on its bits per weight. bitsandbytes (0.45, functional.quantize_4bit: blocksize 64, a float32
# absmax per block) stores exactly that when double quantization is off (compress_statistics=False:
# transformers' BitsAndBytesConfig default, and what this course's quant/bnb.py sets).
NF4_FORMAT: NumberFormat = WEIGHT_FORMATS["nf4"]
NF4_ABSMAX_DTYPE = {16: torch.float16, 32: torch.float32}[NF4_FORMAT.scale_bits]


def quantize_nf4(weight: torch.Tensor, group_size: int = NF4_FORMAT.group_size) -> Int4Weight:
    """NF4: each group of ``group_size`` is scaled by its absmax, then rounded to the nearest NF4 level.

    Stored like int4 (two codes per byte, no zero point) with one absmax per group in
    :data:`NF4_ABSMAX_DTYPE` (fp32, as :data:`NF4_FORMAT` counts it); the codes index
    :func:`nf4_levels` instead of an evenly spaced grid.
    """
    _require_2d("quantize_nf4", weight)
    out_f, in_f = weight.shape
    groups = _grouped(weight, group_size)
    absmax = groups.abs().amax(dim=-1, keepdim=True)
    absmax = torch.where(absmax > 0, absmax, torch.ones_like(absmax))
    absmax = absmax.to(NF4_ABSMAX_DTYPE)
    normalized = groups / absmax.float()
    levels = nf4_levels()
    # nearest level via the midpoints between consecutive levels
    codes = torch.bucketize(normalized, (levels[1:] + levels[:-1]) / 2).to(torch.uint8)
    return Int4Weight(
        packed=pack_int4(codes.reshape(out_f, -1)[:, :in_f]),
        scale=absmax.squeeze(-1),
        zero=None,
        group_size=group_size,
        shape=(out_f, in_f),
    )


def dequantize_nf4(w: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reconstruct the float weight from NF4 codes: ``level[code] * absmax``."""
    out_f, in_f = w.shape
    codes = _ungrouped_codes(w).long()
    values = nf4_levels().to(w.packed.device)[codes] * w.scale.float().unsqueeze(-1)
    return values.reshape(out_f, -1)[:, :in_f].to(dtype)


# ---------------------------------------------------------------------------------------------
# fp8 e4m3 weight-only, one scale per output channel


def fp8_available() -> bool:
    """True when this torch build has the ``float8_e4m3fn`` dtype (torch >= 2.1)."""
    return hasattr(torch, "float8_e4m3fn")


def require_fp8() -> None:
    """Raise a clear error when fp8 storage is not supported by this torch build."""
    if not fp8_available():
        raise RuntimeError(
            f"fp8 (e4m3) weights need torch >= 2.1 with torch.float8_e4m3fn; this is torch "
            f"{torch.__version__}. Upgrade torch or pick --method int8/int4."
        )


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 with one fp32 scale per output row (row absmax maps to 448).

    Returns ``(codes, scale)``: ``float8_e4m3fn`` codes shaped like ``weight`` and ``(out, 1)`` scales.
    """
    require_fp8()
    _require_2d("quantize_fp8", weight)
    w = weight.detach().float()
    absmax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / FP8_E4M3_MAX, torch.ones_like(absmax))
    return (w / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn), scale


def dequantize_fp8(
    codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8`."""
    return (codes.float() * scale).to(dtype)


# ---------------------------------------------------------------------------------------------
# Error statistics


def error_stats(original: torch.Tensor, reconstructed: torch.Tensor) -> dict[str, float]:
    """How far a reconstruction is from the original weight (all unitless or in weight units).

    ``rel_fro``: ||W - Ŵ||_F / ||W||_F; ``max_abs``: the largest absolute error; ``rmse``;
    ``sqnr_db``: signal-to-quantization-noise ratio in dB.
    """
    w = original.detach().float()
    err = w - reconstructed.detach().float()
    noise = float(err.pow(2).sum())
    signal = float(w.pow(2).sum())
    return {
        "rel_fro": (noise / signal) ** 0.5 if signal else 0.0,
        "max_abs": float(err.abs().max()),
        "rmse": float(err.pow(2).mean().sqrt()),
        "sqnr_db": 10 * torch.log10(torch.tensor(signal / noise)).item() if noise else float("inf"),
    }
