"""Exact bytes of a (quantized) model, counted from the tensors it keeps, and a model that reports them.

Memory is always counted from the tensors that are kept (parameters plus the quantized
buffers), never from ``torch.cuda.memory_allocated``: cumulative allocator readings after
earlier loads once made int4 look bigger than int8.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models import LoadedModel
from .linear import DequantLinear


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


class QuantizedLoadedModel(LoadedModel):
    """A :class:`LoadedModel` whose ``weight_bytes`` also counts quantized buffers."""

    @property
    def weight_bytes(self) -> int:
        return model_weight_bytes(self.model)
