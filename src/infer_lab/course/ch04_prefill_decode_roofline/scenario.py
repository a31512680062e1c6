"""Chapter 04's identity (number, title, parts) and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..chapter import choose_size

NUMBER = "04"
SLUG = "prefill_decode_roofline"
TITLE = "04 · Prefill vs decode and the roofline: predicted, then measured"
NEEDS_MODEL = True
PARTS = {
    "datasheet": "Predict prefill and decode on a datasheet GPU (analytic: runs live)",
    "compare": "Measure prefill and decode on this machine",
}


@dataclass(frozen=True)
class Sizes:
    """The datasheet defaults (what the notebook's controls start at) and the measured sweep."""

    size: str
    model: str
    gpu: str
    batch: int
    context: int
    prompt_lengths: tuple[int, ...]  # prefill (TTFT) measurements, batch 1
    contexts: tuple[int, ...]  # decode step measurements ...
    batches: tuple[int, ...]  # ... at each of these batches
    new_tokens: int  # per decode measurement (the first is the prefill's)
    repeats: int
    quick_ceilings: bool


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` on a CPU: two tiny prefills and two tiny decodes (seconds); ``full``: a real sweep."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    common = dict(model="mistral-7b", gpu="H100-SXM", batch=1, context=4096, quick_ceilings=size == "quick")
    if on_gpu:
        if size == "quick":
            return Sizes(size, prompt_lengths=(128, 512, 2048), contexts=(512, 2048), batches=(1, 8),
                         new_tokens=8, repeats=3, **common)
        return Sizes(size, prompt_lengths=(128, 512, 2048, 8192), contexts=(512, 2048, 8192), batches=(1, 8, 32),
                     new_tokens=16, repeats=3, **common)
    if size == "quick":
        return Sizes(size, prompt_lengths=(8, 32), contexts=(16,), batches=(1, 2), new_tokens=4, repeats=1, **common)
    return Sizes(size, prompt_lengths=(16, 64, 256, 1024), contexts=(64, 512, 2048), batches=(1, 4, 16),
                 new_tokens=8, repeats=3, **common)
