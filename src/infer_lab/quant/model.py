"""Model-wide quantization: swap every ``nn.Linear`` for a :class:`DequantLinear`, count exact bytes.

Memory is always counted from the tensors that are kept (parameters plus the quantized
buffers), never from ``torch.cuda.memory_allocated``: cumulative allocator readings after
earlier loads once made int4 look bigger than int8.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..models import LoadedModel
from .core import error_stats
from .linear import DequantLinear

FROM_SCRATCH_METHODS = ("int8", "int4", "nf4", "fp8")
LIBRARY_METHODS = ("bnb-int8", "bnb-nf4")
METHODS = FROM_SCRATCH_METHODS + LIBRARY_METHODS
DEFAULT_SKIP = ("lm_head",)


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
        if self.scheme == "nf4":
            return f"nf4-g{self.group_size}"
        return self.scheme


def parse_method(method: str) -> MethodSpec:
    """Parse ``int8``, ``fp8``, ``int4[-gN][-sym]`` or ``nf4[-gN]`` (int4 default g128, NF4 default g64)."""
    match = re.fullmatch(r"(int8|fp8|int4|nf4)(?:-g(\d+))?(-sym)?", method)
    if (
        not match
        or (match.group(1) in ("int8", "fp8") and (match.group(2) or match.group(3)))
        or (match.group(1) == "nf4" and match.group(3))
    ):
        raise ValueError(
            f"unknown quantization method {method!r}; use one of {', '.join(METHODS)} "
            "(int4 also as int4-g64, int4-g128-sym; nf4 as nf4-g64)"
        )
    scheme, group, sym = match.group(1), match.group(2), bool(match.group(3))
    default_group = 64 if scheme == "nf4" else 128
    return MethodSpec(scheme, int(group) if group else default_group, sym)


def model_weight_bytes(model: nn.Module) -> int:
    """Exact bytes of a model's weights: parameters (tied ones once) plus quantized weight buffers.

    Non-weight buffers such as RoPE frequency tables are not weights and are not counted.
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, DequantLinear):
            total += module.weight_bytes()
            if module.bias is not None:
                total += module.bias.numel() * module.bias.element_size()
        total += _bnb_quant_state_bytes(module)
    return total


def _bnb_quant_state_bytes(module: nn.Module) -> int:
    """bitsandbytes 4-bit keeps per-block absmax outside the parameter; count it too."""
    state = getattr(getattr(module, "weight", None), "quant_state", None)
    if state is None:
        return 0
    total = 0
    for name in ("absmax", "code"):
        t = getattr(state, name, None)
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    nested = getattr(state, "state2", None)
    if nested is not None and isinstance(getattr(nested, "absmax", None), torch.Tensor):
        total += nested.absmax.numel() * nested.absmax.element_size()
    return total


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
        import pandas as pd

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
        method: ``int8``, ``fp8``, ``int4[-gN][-sym]`` or ``nf4[-gN]`` (see :func:`parse_method`).
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
    """Per-layer reconstruction error of ``method`` without building a quantized model (no copy)."""
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
                    **error_stats(module.weight.data, qlayer.dequantized_weight()),
                }
            )
    return rows


class QuantizedLoadedModel(LoadedModel):
    """A :class:`LoadedModel` whose ``weight_bytes`` also counts quantized buffers."""

    @property
    def weight_bytes(self) -> int:
        return model_weight_bytes(self.model)


def quantize_lm(
    lm: LoadedModel, method: str, **kwargs: Any
) -> tuple[QuantizedLoadedModel, QuantReport]:
    """Quantize a loaded model (a copy) and wrap it so the harness reports its true weight bytes.

    ``method`` may also be ``bnb-int8``/``bnb-nf4``, which reload the weights through
    bitsandbytes (CUDA only) and return a report without per-layer errors.
    """
    if method in LIBRARY_METHODS:
        from .bnb import load_quantized

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


def linear_input_outliers(
    model: nn.Module, input_ids: torch.Tensor, layer_filter: str = "q_proj", top: int = 6
) -> list[dict[str, Any]]:
    """Per-feature activation magnitudes entering selected linear layers (LLM.int8's motivation).

    Hooks every ``nn.Linear`` whose name contains ``layer_filter``, runs one forward pass and
    reports, per layer, the hidden features with the largest |x| and their ratio to the median
    feature. A few features a hundred times larger than the rest force a per-tensor int8
    scale so coarse that the ordinary features round to zero; LLM.int8 keeps those features
    in 16-bit and quantizes the rest.
    """
    rows: list[dict[str, Any]] = []
    handles = []

    def make_hook(name: str):
        def hook(_module, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            feature_max = x.abs().amax(dim=0)
            values, index = feature_max.topk(min(top, feature_max.numel()))
            median = float(feature_max.median())
            rows.append(
                {
                    "layer": name,
                    "top_features": index.tolist(),
                    "top_absmax": values.tolist(),
                    "median_feature_absmax": median,
                    "max_over_median": float(values[0]) / median,
                }
            )

        return hook

    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, DequantLinear)) and layer_filter in name:
            handles.append(module.register_forward_pre_hook(make_hook(name)))
    try:
        with torch.inference_mode():
            model(input_ids)
    finally:
        for h in handles:
            h.remove()
    return rows
