"""Arguments several commands share, defined once so their help and defaults agree."""

from __future__ import annotations

import sys

from ..shape import model_shape


def add_model_arguments(p, dtype: bool = True) -> None:
    """``--model``, ``--weights``, ``--device`` (and ``--dtype``): which model, from which source, where."""
    p.add_argument("--model", default="smollm2-135m", help="catalog name, config.json path or hub id")
    p.add_argument("--weights", choices=["pretrained", "random"], default="pretrained",
                   help="pretrained (embedded or hub) or random (exact shape, nothing downloaded)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu or cuda")
    if dtype:
        p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: fp32 on CPU, bf16 on GPU)")


def context_warnings(model: str, context: int | None) -> list[str]:
    """A warning when ``context`` is past the model's position limit (printed to stderr too).

    The arithmetic still answers, but the model itself cannot attend that far: the numbers
    extrapolate past what it supports.
    """
    if context is None:
        return []
    limit = model_shape(model).max_position_embeddings
    if context <= limit:
        return []
    text = (f"context {context:,} tokens is past {model}'s limit of {limit:,} positions "
            "(max_position_embeddings): these numbers extrapolate beyond what the model can attend to")
    print(f"warning: {text}", file=sys.stderr)
    return [text]
