"""Chapter 13's identity (number, title, parts), the variants and workload it serves, and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..chapter import choose_size

NUMBER = "13"
SLUG = "engines"
TITLE = "13 · Engines: one load generator, every engine, and the decision chart"
NEEDS_MODEL = True
PARTS = {
    "variants": "Serve and measure every variant",
    "sweep": "Sweep concurrency on our engine",
}
WORKLOAD = "shared-prefix"
HF_VARIANT = "hf (one at a time)"

# Each optimization of our engine switched on one at a time (options of infer_lab.engine.EngineConfig).
OUR_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    HF_VARIANT: ("hf", {}),
    "ours: contiguous KV, static batch": (
        "ours", {"kv_mode": "contiguous", "policy": "static", "prepack_weights": False}),
    "ours: paged + continuous": ("ours", {"kv_mode": "paged", "policy": "continuous", "prepack_weights": False}),
    # On a CPU, GEMMs on weights reordered once for oneDNN (engine/cpu/prepack.py); on a GPU, the rung above.
    "+ prepacked weights": ("ours", {"kv_mode": "paged", "policy": "continuous"}),
    "+ prefix cache (hash)": ("ours", {"prefix_cache": "hash"}),
    "+ prefix cache (radix)": ("ours", {"prefix_cache": "radix"}),
    "+ chunked prefill": (
        "ours",
        {"prefix_cache": "radix", "chunked_prefill": True, "max_num_batched_tokens": 64},
    ),
    # The ladder as talks on inference present it: KV quantization shrinks KV memory for about the same throughput.
    "+ KV cache int8": ("ours", {"prefix_cache": "radix", "kv_dtype": "int8"}),
    "+ speculative (n-gram)": ("ours", {"prefix_cache": "radix", "speculative": "ngram"}),
}


# The chapter's shared-prefix workload (words); the sizes' prefix and question lengths go on top.
WORKLOAD_DEFAULTS = {"input_words": 32, "prefix_words": 128, "turns": 2, "branches": 2}


@dataclass(frozen=True)
class Sizes:
    """The load: which variants, how many requests at what concurrency, and their lengths."""

    size: str
    variants: tuple[str, ...]  # keys of OUR_VARIANTS
    concurrency: int  # requests in flight, the same for every variant
    requests: int  # measured requests per variant and repeat
    output_tokens: int  # tokens generated per request (EOS ignored)
    repeats: int
    prefix_words: int  # words of the shared system prompt
    input_words: int  # words of each request's own question
    sweep_variant: str
    sweep_concurrencies: tuple[int, ...]
    slo_ttft_ms: float  # the TTFT objective of the sweep's goodput (ms)
    max_model_len: int = 512

    def workload_options(self) -> dict[str, int]:
        """The shared-prefix workload's shape (words; see :func:`infer_lab.loadgen.build_workload`)."""
        return {**WORKLOAD_DEFAULTS, "prefix_words": self.prefix_words, "input_words": self.input_words}


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: 4 short requests per variant, 3 variants (seconds each on 2 cores); ``full``: every
    variant, 32 requests at concurrency 16, 2 repeats."""
    size = choose_size(device, size)
    if size == "quick":
        return Sizes(size, variants=(HF_VARIANT, "+ prepacked weights", "+ prefix cache (radix)"),
                     concurrency=4, requests=4, output_tokens=4, repeats=1, prefix_words=32, input_words=8,
                     sweep_variant="+ prefix cache (radix)", sweep_concurrencies=(1, 4), slo_ttft_ms=2000.0)
    return Sizes(size, variants=tuple(OUR_VARIANTS), concurrency=16, requests=32, output_tokens=64,
                 repeats=2, prefix_words=128, input_words=32, sweep_variant="+ prefix cache (radix)",
                 sweep_concurrencies=(1, 4, 16, 32), slo_ttft_ms=2000.0)
