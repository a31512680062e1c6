"""Chapter 11's identity (number, title, parts) and the sizes of its scenario."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..chapter import choose_size

NUMBER = "11"
SLUG = "chunked_prefill"
TITLE = "11 · Chunked prefill: a long prompt among running decodes"
NEEDS_MODEL = True
PARTS = {"chunking": "Run with and without chunking"}


@dataclass(frozen=True)
class Sizes:
    """The scenario: who decodes, how long the late prompt is, and the per-step token budget."""

    size: str
    long_prompt: int  # tokens of the prompt that arrives late
    decoders: int  # requests already decoding when it arrives
    decode_tokens: int  # tokens each decoder generates
    max_num_batched_tokens: int  # token budget of one step with chunked prefill
    arrive_at_step: int  # engine step at which the long prompt arrives
    decoder_prompt: int = 16  # prompt tokens of each decoder
    long_output: int = 4  # tokens the long request generates


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: a 1,024-token prompt among 3 decoders (seconds on 2 cores; long enough that its prefill
    step stands well above a decode step's noise); ``full``: more decoders and steps, and a 7B-sized
    scenario on a GPU."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if size == "quick":
        return Sizes(size, long_prompt=1024, decoders=3, decode_tokens=16, max_num_batched_tokens=128, arrive_at_step=4)
    if on_gpu:
        return Sizes(size, long_prompt=4096, decoders=8, decode_tokens=64, max_num_batched_tokens=512, arrive_at_step=8)
    return Sizes(size, long_prompt=1024, decoders=4, decode_tokens=48, max_num_batched_tokens=64, arrive_at_step=8)
