"""Quantization, from scratch and through production libraries (course module 05).

* :mod:`.core`: int8 absmax per output channel, group-wise int4 (zero-point or symmetric) with
  real two-per-byte packing, NF4, fp8 e4m3, error statistics.
* :mod:`.linear`: :class:`DequantLinear`, dequantizing on the fly in ``forward``.
* :mod:`.model`: :func:`quantize` swaps a model's linear layers and reports exact bytes.
* :mod:`.bnb`: bitsandbytes LLM.int8 / NF4 through transformers (CUDA only).
* :mod:`.kv`: int8/fp8 KV-cache quantization with per-token-per-head scales.
"""

from .bnb import QuantBackendUnavailable, load_quantized, require_bitsandbytes
from .core import (
    dequantize_fp8,
    dequantize_int4,
    dequantize_int8,
    dequantize_nf4,
    error_stats,
    nf4_levels,
    outlier_channels,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    quantize_int8_absmax,
    quantize_nf4,
    unpack_int4,
)
from .kv import QuantizedKV, attention_output_error, dequantize_kv, fake_quantize_kv, quantize_kv
from .linear import DequantLinear
from .model import (
    METHODS,
    QuantReport,
    linear_input_outliers,
    model_weight_bytes,
    parse_method,
    quantize,
    quantize_lm,
)

__all__ = [
    "METHODS",
    "DequantLinear",
    "QuantBackendUnavailable",
    "QuantReport",
    "QuantizedKV",
    "attention_output_error",
    "dequantize_fp8",
    "dequantize_int4",
    "dequantize_int8",
    "dequantize_kv",
    "dequantize_nf4",
    "error_stats",
    "fake_quantize_kv",
    "linear_input_outliers",
    "load_quantized",
    "model_weight_bytes",
    "nf4_levels",
    "outlier_channels",
    "pack_int4",
    "parse_method",
    "quantize",
    "quantize_fp8",
    "quantize_int4",
    "quantize_int8_absmax",
    "quantize_kv",
    "quantize_lm",
    "quantize_nf4",
    "require_bitsandbytes",
    "unpack_int4",
]
