"""Model-wide quantization: swap every ``nn.Linear`` for a :class:`DequantLinear`, count exact bytes.

Method names (``int8``, ``int4-g64-sym``, ``nf4``, ``q4_1``, ``fp8``, ``bnb-int8``...) are parsed
here; the bitsandbytes methods reload the model through :mod:`.bnb` instead of swapping layers.
Bytes are counted by :mod:`.stored_bytes`, from the tensors that are kept.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..models import LoadedModel
from .bnb import load_quantized
from .formats import error_stats
from .linear import DequantLinear
from .stored_bytes import QuantizedLoadedModel, model_weight_bytes

FROM_SCRATCH_METHODS = ("int8", "int4", "nf4", "q4_1", "fp8")
LIBRARY_METHODS = ("bnb-int8", "bnb-nf4")
METHODS = FROM_SCRATCH_METHODS + LIBRARY_METHODS
DEFAULT_SKIP = ("lm_head",)
DEFAULT_GROUPS = {"int4": 128, "nf4": 64, "q4_1": 32}


@dataclass(frozen=True)
class MethodSpec:
    """A parsed method name: ``'int4-g64-sym'`` is scheme int4, group 64, symmetric."""

    scheme: str
    group_size: int = 128
    symmetric: bool = False

    @property
    def label(self) -> str:
        if self.scheme == "int4":
            return f"int4-g{self.group_size}" + ("-sym" if self.symmetric else "")
        if self.scheme in ("nf4", "q4_1"):
            return f"{self.scheme}-g{self.group_size}"
        return self.scheme


def parse_method(method: str) -> MethodSpec:
    """Parse ``int8``, ``fp8``, ``int4[-gN][-sym]``, ``nf4[-gN]`` or ``q4_1[-gN]``.

    Default groups: int4 128, NF4 64, Q4_1 32 (GGUF's block).
    """
    match = re.fullmatch(r"(int8|fp8|int4|nf4|q4_1)(?:-g(\d+))?(-sym)?", method)
    if (
        not match
        or (match.group(1) in ("int8", "fp8") and (match.group(2) or match.group(3)))
        or (match.group(1) in ("nf4", "q4_1") and match.group(3))
    ):
        raise ValueError(
            f"unknown quantization method {method!r}; use one of {', '.join(METHODS)} "
            "(int4 also as int4-g64, int4-g128-sym; nf4 as nf4-g64; q4_1 as q4_1-g32)"
        )
    scheme, group, sym = match.group(1), match.group(2), bool(match.group(3))
    default_group = DEFAULT_GROUPS.get(scheme, 128)
    return MethodSpec(scheme, int(group) if group else default_group, sym)


@dataclass
class QuantReport:
    """What :func:`quantize` did: the model, exact bytes before/after and per-layer error."""

    model: nn.Module
    method: str
    weight_bytes: int
    weight_bytes_unquantized: int
    layers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def compression(self) -> float:
        """Unquantized bytes / quantized bytes (the whole model, embeddings included)."""
        return self.weight_bytes_unquantized / self.weight_bytes

    def layer_frame(self):
        """Per-layer error statistics as a pandas DataFrame."""
        import pandas as pd  # defers pandas

        return pd.DataFrame(self.layers)


def quantize(
    model: nn.Module,
    method: str,
    skip: tuple[str, ...] = DEFAULT_SKIP,
    inplace: bool = False,
    error_stats_per_layer: bool = True,
) -> QuantReport:
    """Replace every ``nn.Linear`` (except names ending in ``skip``) by a quantized :class:`DequantLinear`.

    Args:
        model: any torch model; the embedding and norms stay in their dtype.
        method: ``int8``, ``fp8``, ``int4[-gN][-sym]``, ``nf4[-gN]`` or ``q4_1[-gN]`` (see :func:`parse_method`).
            bitsandbytes methods load a fresh model instead: use :func:`infer_lab.quant.load_quantized`.
        skip: module-name suffixes left unquantized; the LM head by default (in tied models it
            is the embedding, and quantizing it would untie and grow the model).
        inplace: modify ``model`` instead of a deep copy.
        error_stats_per_layer: compute the reconstruction error of every layer (costs a dequantization).
    """
    if method in LIBRARY_METHODS:
        raise ValueError(
            f"{method} is a bitsandbytes method: use infer_lab.quant.load_quantized(lm, {method!r})"
        )
    spec = parse_method(method)
    before = model_weight_bytes(model)
    target = model if inplace else copy.deepcopy(model)
    layers = []
    for name, module in list(target.named_modules()):
        if not isinstance(module, nn.Linear) or name.endswith(skip):
            continue
        qlayer = DequantLinear.from_linear(module, spec.scheme, spec.group_size, spec.symmetric)
        row: dict[str, Any] = {
            "layer": name,
            "out_features": module.out_features,
            "in_features": module.in_features,
            "bytes_before": module.weight.numel() * module.weight.element_size(),
            "bytes_after": qlayer.weight_bytes(),
        }
        if error_stats_per_layer:
            row.update(error_stats(module.weight.data, qlayer.dequantized_weight()))
        layers.append(row)
        parent_name, _, child = name.rpartition(".")
        setattr(target.get_submodule(parent_name) if parent_name else target, child, qlayer)
    if not layers:
        raise ValueError(
            f"the model has no nn.Linear layers to quantize (after skipping {', '.join(skip)})"
        )
    return QuantReport(
        model=target,
        method=spec.label,
        weight_bytes=model_weight_bytes(target),
        weight_bytes_unquantized=before,
        layers=layers,
    )


def layer_error_stats(
    model: nn.Module, method: str, skip: tuple[str, ...] = DEFAULT_SKIP
) -> list[dict[str, Any]]:
    """Per-layer stored bytes and reconstruction error of ``method``, without building a quantized model."""
    spec = parse_method(method)
    rows = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and not name.endswith(skip):
            qlayer = DequantLinear.from_linear(module, spec.scheme, spec.group_size, spec.symmetric)
            rows.append(
                {
                    "layer": name,
                    "out_features": module.out_features,
                    "in_features": module.in_features,
                    "bytes_after": qlayer.weight_bytes(),
                    **error_stats(module.weight.data, qlayer.dequantized_weight()),
                }
            )
    return rows


def quantize_lm(
    lm: LoadedModel, method: str, **kwargs: Any
) -> tuple[QuantizedLoadedModel, QuantReport]:
    """Quantize a loaded model (a copy) and wrap it so the harness reports its true weight bytes.

    ``method`` may also be ``bnb-int8``/``bnb-nf4``, which reload the weights through
    bitsandbytes (CUDA only) and return a report without per-layer errors.
    """
    if method in LIBRARY_METHODS:
        qlm = load_quantized(lm, method)
        report = QuantReport(
            model=qlm.model,
            method=method,
            weight_bytes=model_weight_bytes(qlm.model),
            weight_bytes_unquantized=model_weight_bytes(lm.model),
        )
        return qlm, report
    report = quantize(lm.model, method, **kwargs)
    fields = {
        k: getattr(lm, k)
        for k in ("tokenizer", "name", "source", "device", "dtype", "load_seconds")
    }
    qlm = QuantizedLoadedModel(model=report.model, extra={"quantization": report.method}, **fields)
    return qlm, report
