"""Chapter 10's identity (number, title, parts, the caches and workloads it compares) and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...bench.prefix_workloads import PREFIX_WORKLOADS
from ..chapter import choose_size

NUMBER = "10"
SLUG = "prefix_caching"
TITLE = "10 · Prefix caching: hash blocks vs a radix tree"
NEEDS_MODEL = True
PARTS = {
    "granularity": "Measure what each cache matches",
    "workloads": "Run the three workloads",
}
CACHES = ("hash", "radix")
WORKLOADS = PREFIX_WORKLOADS  # name -> label of the three workloads


@dataclass(frozen=True)
class Sizes:
    """Sizes of the two parts, in tokens and requests."""

    size: str
    match_block: int  # KV block size of the granularity probe (tokens)
    match_blocks: int  # its prompts are this many blocks long
    block_size: int  # KV block size of the workloads (tokens)
    system_len: int  # tokens of the shared system prompt
    users: int  # users of the shared-system-prompt workload
    conversations: int  # conversations of the multi-turn workload
    turns: int  # turns of each conversation
    branches: int  # proposals of the agentic workload
    output_len: int  # tokens generated per request

    @property
    def match_prompt_len(self) -> int:
        return self.match_block * self.match_blocks


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: a few hundred prompt tokens per cache (seconds on 2 cores); ``full``: a GPU's run."""
    size = choose_size(device, size)
    if size == "quick":
        return Sizes(size, match_block=4, match_blocks=3, block_size=16, system_len=40, users=4,
                     conversations=2, turns=2, branches=2, output_len=6)
    return Sizes(size, match_block=16, match_blocks=4, block_size=16, system_len=256, users=8,
                 conversations=3, turns=3, branches=3, output_len=8)
