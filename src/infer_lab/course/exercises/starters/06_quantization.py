"""Chapter 06 · Quantization: exercises.

Fill in each function, then run `infer-lab check 06`. Weights are shaped like nn.Linear's,
(out_features, in_features); "per row" means per output channel.
"""

import torch


def quantize_int8_absmax(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per row: ``weight ≈ codes * scale``.

    Each row's scale maps its largest magnitude to 127; codes are rounded to the nearest
    integer and kept in [-127, 127]. A row of zeros gets scale 1 (any non-zero value works).

    Returns:
        ``(codes, scale)``: int8 codes shaped like ``weight``; fp32 scales shaped ``(out, 1)``.
    """
    raise NotImplementedError


def dequantize_int8(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The inverse of ``quantize_int8_absmax``: float weights back from int8 codes and per-row scales.

    Build exercise: your ``quantize_int8_absmax`` makes the engine's int8 weights (every linear
    layer and the LM head, ``EngineModel.quantized``'s ``int8_quantizer``), and every weight must
    come back within half a step: ``|w - dequantize_int8(*quantize_int8_absmax(w))| <= scale / 2``.

    Args:
        codes: int8, shaped ``(out, in)``.
        scale: fp32, one per row, shaped ``(out, 1)``.

    Returns:
        fp32 weights shaped like ``codes``.
    """
    raise NotImplementedError


def int4_stored_bytes(out_features: int, in_features: int, group_size: int, symmetric: bool) -> int:
    """Predict the stored bytes of a group-wise int4 weight.

    Each row is cut into groups of ``group_size`` consecutive values (the last one may be
    shorter), each with its own fp16 scale; the asymmetric kind also stores a one-byte zero
    point per group. Codes are 4 bits, two per byte (``in_features`` is even).
    """
    raise NotImplementedError


def int8_relative_error(absmax: float, rms: float) -> float:
    """Predict the relative error ||W - Ŵ|| / ||W|| of int8 absmax on one row.

    The step between codes is ``absmax / 127``. Assume each weight's rounding error is
    spread evenly over one step, from -step/2 to +step/2 (the rms of such an error is
    step / sqrt(12)), and the row's own rms is ``rms``.
    """
    raise NotImplementedError
