"""Quantization, from scratch and through production libraries (the library under chapter 06).

* :mod:`.formats`: int8 absmax per output channel, group-wise int4 (zero-point or symmetric) with
  real two-per-byte packing, NF4, GGUF's Q4_1, fp8 e4m3, error statistics.
* :mod:`.linear`: :class:`DequantLinear`, dequantizing on the fly in ``forward``.
* :mod:`.stored_bytes`: exact weight bytes of a model, counted from the tensors it keeps.
* :mod:`.bnb`: bitsandbytes LLM.int8 / NF4 through transformers (CUDA only).
* :mod:`.quantize_model`: method names, and :func:`quantize` swapping a model's linear layers.
* :mod:`.comparison`: methods side by side: exact bytes, decode speed, perplexity, top-1 agreement.
* :mod:`.outliers`: the weight columns and activation features that break one scale per row.
* :mod:`.kv_formats`: int8/fp8 KV-cache quantization with per-token-per-head scales.

Every name below is importable from here, but each submodule loads only when one of its names is
first used (PEP 562 ``__getattr__``): ``comparison`` needs the harness, the evaluator and the
model loader, and the engine, which only needs ``kv_formats``, must not pull those in."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .bnb import QuantBackendUnavailable, load_quantized, require_bitsandbytes
    from .comparison import compare_methods, decode_tokens_per_s
    from .formats import (
        Int4Weight,
        dequantize_fp8,
        dequantize_int4,
        dequantize_int8,
        dequantize_nf4,
        error_stats,
        nf4_levels,
        pack_int4,
        quantize_fp8,
        quantize_int4,
        quantize_int8_absmax,
        quantize_nf4,
        quantize_q4_1,
        unpack_int4,
    )
    from .kv_formats import (
        QuantizedKV,
        attention_output_error,
        dequantize_kv,
        fake_quantize_kv,
        kv_bytes_per_element,
        quantize_kv,
    )
    from .linear import DequantLinear
    from .outliers import linear_input_outliers, outlier_channels
    from .quantize_model import (
        METHODS,
        QuantReport,
        layer_error_stats,
        parse_method,
        quantize,
        quantize_lm,
    )
    from .stored_bytes import QuantizedLoadedModel, model_weight_bytes

# name -> the submodule that defines it
_WHERE = {
    "QuantBackendUnavailable": "bnb",
    "load_quantized": "bnb",
    "require_bitsandbytes": "bnb",
    "compare_methods": "comparison",
    "decode_tokens_per_s": "comparison",
    "Int4Weight": "formats",
    "dequantize_fp8": "formats",
    "dequantize_int4": "formats",
    "dequantize_int8": "formats",
    "dequantize_nf4": "formats",
    "error_stats": "formats",
    "nf4_levels": "formats",
    "pack_int4": "formats",
    "quantize_fp8": "formats",
    "quantize_int4": "formats",
    "quantize_int8_absmax": "formats",
    "quantize_nf4": "formats",
    "quantize_q4_1": "formats",
    "unpack_int4": "formats",
    "QuantizedKV": "kv_formats",
    "attention_output_error": "kv_formats",
    "dequantize_kv": "kv_formats",
    "fake_quantize_kv": "kv_formats",
    "kv_bytes_per_element": "kv_formats",
    "quantize_kv": "kv_formats",
    "DequantLinear": "linear",
    "linear_input_outliers": "outliers",
    "outlier_channels": "outliers",
    "METHODS": "quantize_model",
    "QuantReport": "quantize_model",
    "layer_error_stats": "quantize_model",
    "parse_method": "quantize_model",
    "quantize": "quantize_model",
    "quantize_lm": "quantize_model",
    "QuantizedLoadedModel": "stored_bytes",
    "model_weight_bytes": "stored_bytes",
}

__all__ = [
    "METHODS",
    "DequantLinear",
    "Int4Weight",
    "QuantBackendUnavailable",
    "QuantReport",
    "QuantizedKV",
    "QuantizedLoadedModel",
    "attention_output_error",
    "compare_methods",
    "decode_tokens_per_s",
    "dequantize_fp8",
    "dequantize_int4",
    "dequantize_int8",
    "dequantize_kv",
    "dequantize_nf4",
    "error_stats",
    "fake_quantize_kv",
    "kv_bytes_per_element",
    "layer_error_stats",
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
    "quantize_q4_1",
    "require_bitsandbytes",
    "unpack_int4",
]


def __getattr__(name: str):
    """Load the submodule that defines ``name`` on first use (see the module docstring)."""
    try:
        module = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
