"""A layer against torch SDPA: in one prefill, and token by token through its own KV cache.

Every attention layer of :mod:`infer_lab.attention` (:class:`~.variants.Attention` and
:class:`~.mla.MultiHeadLatentAttention`) computes the same function whichever path it takes; these
two helpers measure how far a path is from the SDPA reference (chapter 07, part 1).
"""

from __future__ import annotations

from typing import Any

import torch


def decode_token_by_token(layer: Any, x: torch.Tensor, prefix: int, **kwargs: Any) -> torch.Tensor:
    """``layer``'s outputs for ``x (b, n, d_model)``: the first ``prefix`` tokens as one prefill into a
    fresh cache, then one token per call, as a decode loop runs it. ``kwargs`` pick the path."""
    cache = layer.new_cache()
    outs = [layer(x[:, :prefix], cache, **kwargs)]
    outs += [layer(x[:, i : i + 1], cache, **kwargs) for i in range(prefix, x.shape[1])]
    return torch.cat(outs, dim=1)


@torch.inference_mode()
def diff_from_sdpa(layer: Any, x: torch.Tensor, prefix: int, **kwargs: Any) -> tuple[float, float]:
    """Max |output - SDPA's output| of ``layer`` on the path ``kwargs`` pick (``backend="flash"``,
    ``decode="absorbed"``...), in one prefill and in cached decode after a ``prefix``-token prefill."""
    reference = layer(x, backend="sdpa")
    prefill = float((layer(x, **kwargs) - reference).abs().max())
    decode = float((decode_token_by_token(layer, x, prefix, **kwargs) - reference).abs().max())
    return prefill, decode
