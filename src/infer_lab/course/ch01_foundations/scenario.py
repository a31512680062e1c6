"""Chapter 01's identity (number, title, parts, the opener it starts with) and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...bench.bandwidth import GIB, KIB, MIB
from ..chapter import choose_size
from ..opener import TITLE as OPENER_TITLE  # noqa: F401 - the part this chapter opens with (build_self_paced)

NUMBER = "01"
SLUG = "foundations"
TITLE = "01 · Foundations: the loop, where the FLOPs are, memory levels, why decode waits on memory"
NEEDS_MODEL = True
PARTS = {
    "loop": "Run the loop, one token at a time",
    "flops": "Count one token's FLOPs by component",
    "bandwidth": "Measure bandwidth across working-set sizes",
    "decode": "Time one decode step",
}
ANALYTIC_PARTS = ("flops",)  # counted from configs: runs without a model (the deck's saved-only build)


@dataclass(frozen=True)
class Sizes:
    """The prompt and tokens of the loop, the context of the FLOP count, the copies, the decode step."""

    size: str
    loop_prompt: str
    loop_new_tokens: int
    flops_context: int  # tokens the new token attends to
    bw_smallest: int  # working set in bytes (source + destination)
    bw_largest: int
    bw_repeats: int  # timed samples per working set
    decode_context: int  # prompt tokens before the timed decode steps
    decode_steps: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` fits a 2-core CPU in well under a minute per part; ``full`` is what a GPU gets."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    prompt = "The capital of France is"
    if on_gpu:
        if size == "quick":
            return Sizes(size, prompt, 6, 1024, 256 * KIB, 1 * GIB, 9, 512, 8)
        return Sizes(size, prompt, 8, 1024, 64 * KIB, 4 * GIB, 15, 1024, 16)
    if size == "quick":
        return Sizes(size, prompt, 6, 1024, 64 * KIB, 256 * MIB, 9, 128, 8)
    return Sizes(size, prompt, 8, 1024, 16 * KIB, 1 * GIB, 15, 512, 16)
