"""Chapter 06's identity (number, title, parts) and the sizes each part runs."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from ..chapter import choose_size

NUMBER = "06"
SLUG = "quantization"
TITLE = "06 · Quantization: fewer bytes per weight, checked on real weights"
NEEDS_MODEL = True
PARTS = {
    "formats": "Quantize every layer and measure the error",
    "compare": "Quantize the model: bytes, speed, quality",
    "outliers": "Find the outlier features",
    "kv": "Measure KV-cache quantization",
}


ALL_METHODS = ("int8", "fp8", "int4-g128", "int4-g64", "int4-g128-sym", "nf4", "q4_1")
FORMAT_GROUP = 64  # weights per scale of the 4-bit rows in "formats"; the notebook's formats cell reads it


def format_methods(group: int = FORMAT_GROUP) -> tuple[str, ...]:
    """The formats checked layer by layer in "formats": Q4_1 and int4 at 32 weights per scale, int4
    and NF4 at ``group`` weights per scale, and int8 (one scale per row)."""
    return ("q4_1-g32", "int4-g32", f"int4-g{group}", f"nf4-g{group}", "int8")


@dataclass(frozen=True)
class Sizes:
    """What each part measures: methods, evaluation tokens, decode timing, layers checked."""

    size: str
    methods: tuple[str, ...]  # side by side in "compare"
    format_methods: tuple[str, ...]  # per-layer errors in "formats"
    format_block_stride: int  # check every n-th decoder block (1 = all)
    eval_tokens: int  # of the evaluation text, scored for perplexity
    eval_window: int
    prompt_tokens: int  # per held-out prompt, for top-1 agreement
    new_tokens: int  # decode timing
    repeats: int
    kv_eval_tokens: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: three methods on 128 tokens, seconds a part on 2 cores; ``full``: every method."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    formats = format_methods()
    if size == "quick":
        return Sizes(size, methods=("int8", "q4_1", "int4-g64"), format_methods=formats, format_block_stride=10,
                     eval_tokens=128, eval_window=128, prompt_tokens=16, new_tokens=2, repeats=1,
                     kv_eval_tokens=128)
    methods = ALL_METHODS + (("bnb-int8", "bnb-nf4") if on_gpu and importlib.util.find_spec("bitsandbytes") else ())
    return Sizes(size, methods=methods, format_methods=formats + ("int4-g128", "fp8"), format_block_stride=1,
                 eval_tokens=2048, eval_window=256, prompt_tokens=96, new_tokens=32, repeats=5,
                 kv_eval_tokens=1024)


def part_number(key: str) -> int:
    """The 1-based number of part ``key`` on the page, in :data:`PARTS` order."""
    return list(PARTS).index(key) + 1
