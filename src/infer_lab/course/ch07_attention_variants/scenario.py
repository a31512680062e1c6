"""Chapter 07's identity (number, title, parts), its default GPU and context, and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..chapter import choose_size

NUMBER = "07"
SLUG = "attention_variants"
TITLE = "07 · Attention variants and FlashAttention"
NEEDS_MODEL = True
PARTS = {
    "equivalence": "Check every variant against SDPA",
    "quality": "Measure the quality price on real weights",
    "timing": "Time SDPA backends and decode attention here",
}
DEFAULT_GPU = "H100-SXM"
DEFAULT_CONTEXT = 32768


@dataclass(frozen=True)
class Sizes:
    """Evaluation tokens for the quality part and the timing shapes."""

    size: str
    eval_tokens: int
    eval_window: int
    quality_include: tuple[str, ...]  # "mqa", "window", "kv"
    sdpa_lengths: tuple[int, ...]
    heads: int
    head_dim: int
    decode_context: int
    decode_kv_heads: tuple[int, ...]
    repeats: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: 128 tokens and two variants, tiny timing shapes; ``full``: more text, KV caches, longer shapes."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        return Sizes(size, eval_tokens=1024, eval_window=256, quality_include=("mqa", "window", "kv"),
                     sdpa_lengths=(1024, 4096, 16384), heads=32, head_dim=128, decode_context=32768,
                     decode_kv_heads=(1, 2, 4, 8, 16, 32), repeats=5)
    if size == "quick":
        return Sizes(size, eval_tokens=128, eval_window=128, quality_include=("mqa", "window"),
                     sdpa_lengths=(256, 512), heads=8, head_dim=64, decode_context=16384,
                     decode_kv_heads=(1, 2, 8), repeats=3)
    return Sizes(size, eval_tokens=1024, eval_window=256, quality_include=("mqa", "window", "kv"),
                 sdpa_lengths=(512, 2048), heads=8, head_dim=64, decode_context=32768,
                 decode_kv_heads=(1, 2, 4, 8), repeats=5)
