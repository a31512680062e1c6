"""Chapter 16's identity (number, title, parts), the links and GPU counts it uses, and its sizes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..chapter import choose_size

NUMBER = "16"
SLUG = "where_next"
TITLE = "16 · Where to go next: eviction and compression, memory tiers, disaggregation, kernels"
NEEDS_MODEL = False
PARTS = {
    "directions": "Four directions, each with the number that motivates it (analytic and saved: runs live)",
    "tiers": "Fetch the KV of a cached prefix, or recompute it? (analytic: runs live)",
}
TIER_LINKS = {"CPU memory over PCIe Gen5": "pcie5-x16", "another GPU over NVLink 4": "nvlink4-nvswitch",
              "another server over InfiniBand NDR": "infiniband-ndr400"}
GPU_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Sizes:
    """The workload the directions are computed for, and the context sweep of the tiers part."""

    size: str
    model: str
    gpu: str
    long_context: int  # one long request (eviction, compression, offload)
    prompt: int  # one long prompt arriving among decoding users (disaggregation)
    decode_batch: int
    contexts: tuple[int, ...]  # the tiers sweep


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Analytic either way; ``full`` sweeps more contexts."""
    size = choose_size(device, size)
    step = 2 if size == "quick" else 1
    contexts = tuple(1024 * 2**i for i in range(0, 8, step))
    # Llama-3.1-70B: Llama-3-70B's shape (the same KV per token) with the 131,072 positions these contexts need
    return Sizes(size, model="llama-3.1-70b", gpu="H100-SXM", long_context=131072, prompt=32768, decode_batch=32,
                 contexts=contexts)
