"""Chapter 02's identity (number, title, parts) and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..chapter import choose_size

NUMBER = "02"
SLUG = "feel_the_pain"
TITLE = "02 · Feel the pain: memory, TTFT, sequential serving, ITL"
NEEDS_MODEL = True
PARTS = {
    "memory": "Measure KV memory",
    "ttft": "Measure TTFT vs prompt length",
    "serving": "Serve requests one by one, then batched",
    "itl": "Measure the decode step",
}


@dataclass(frozen=True)
class Sizes:
    """Sweep sizes (tokens, users, requests) for the four measurements."""

    size: str
    contexts: tuple[int, ...]  # prompt lengths of the KV measurement (1 user)
    users: tuple[int, ...]  # user counts of the KV measurement (at the first context)
    ttft_lengths: tuple[int, ...]
    itl_contexts: tuple[int, ...]
    itl_batches: tuple[int, ...]
    n_requests: int
    prompt_len: int
    new_tokens: int
    repeats: int
    itl_steps: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Sizes for this device: ``quick`` fits a 2-core CPU in seconds, ``full`` a GPU's 7B model."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        return Sizes(size, contexts=(512, 2048, 8192, 16384), users=(1, 8, 32, 64),
                     ttft_lengths=(128, 512, 2048, 8192, 16384), itl_contexts=(128, 2048, 8192, 16384),
                     itl_batches=(1, 8, 32, 64, 128), n_requests=4, prompt_len=512,
                     new_tokens=32 if size == "quick" else 128, repeats=3 if size == "quick" else 5,
                     itl_steps=8 if size == "quick" else 16)
    if size == "quick":
        return Sizes(size, contexts=(64, 256), users=(1, 4), ttft_lengths=(32, 128, 256),
                     itl_contexts=(64, 256), itl_batches=(1, 4), n_requests=3, prompt_len=32,
                     new_tokens=8, repeats=3, itl_steps=6)
    return Sizes(size, contexts=(128, 512, 1024, 2048), users=(1, 4, 8, 16), ttft_lengths=(64, 256, 1024, 2048),
                 itl_contexts=(128, 1024, 2048), itl_batches=(1, 4, 16), n_requests=8, prompt_len=128,
                 new_tokens=32, repeats=3, itl_steps=8)
