"""Outliers: the few large weight columns and activation features that break one scale per row.

LLM.int8's observation: the inputs of a transformer's linear layers carry a handful of hidden
features far larger than the rest, in the same feature index across tokens. A scale sized for
them rounds the ordinary values to a few levels. These functions find them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .linear import DequantLinear


def outlier_channels(weight: torch.Tensor, top: int = 8) -> dict[str, object]:
    """The input channels (columns) with the largest magnitude: what breaks one-scale-per-row.

    Returns the column indices, their max |w|, the median column max |w| and the ratio between
    the largest and the median: a ratio of 10 means a per-row scale wastes ~3 of int8's 7 bits
    on most weights of rows that cross that column.
    """
    if weight.dim() != 2:
        raise ValueError(
            f"outlier_channels expects a 2-D (out_features, in_features) weight, got shape {tuple(weight.shape)}"
        )
    col_max = weight.detach().float().abs().amax(dim=0)
    values, index = col_max.topk(min(top, col_max.numel()))
    median = float(col_max.median())
    return {
        "columns": index.tolist(),
        "col_absmax": values.tolist(),
        "median_col_absmax": median,
        "max_over_median": float(values[0]) / median if median else float("inf"),
    }


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
