"""Chapter 14's identity (number, title, parts), the sizes each part runs, and the talk's numbers it quotes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...parallel.bench import default_sizes
from ..chapter import choose_size

NUMBER = "14"
SLUG = "tensor_parallel"
TITLE = "14 · Tensor parallelism: one model on two processes, and on many GPUs"
NEEDS_MODEL = True
PARTS = {
    "tp": "Run tensor parallelism on 2 CPU processes",
    "scaling": "Scale TP on catalogued GPUs",
}
# Parts that need no model and measure nothing here (computed): the saved-only deck keeps them.
ANALYTIC_PARTS = ("scaling",)
TP_WORLD_SIZE = 2  # the ranks of part 1; the notebook's experiment cell reads it
# Part 2's model, users (batch) and context: the notebook's controls start at them.
SCALING_MODEL, SCALING_BATCH, SCALING_CONTEXT = "llama-3-70b", 16, 8192

# Claims quoted in a public talk on LLM inference, kept as cited numbers to compare the model with.
TALK_FAST_MODE_COMPUTE = 6.0  # "what seems to be 6 times as many tokens to process a single token" (read as a price) ...
TALK_FAST_MODE_SPEEDUP = 2.0  # "... for about 2x speed"
TALK_TP_SPEEDUP_AT_4 = 2.0  # "4x GPUs gave about 2x speed"
TP_QUESTIONS = (
    "What is the capital of France?",
    "Explain a KV cache in one sentence.",
    "Give me three prime numbers.",
    "Why is the sky blue? Answer briefly.",
    "Write a haiku about the sea.",
    "How do I boil an egg?",
    "What does a CPU do?",
    "Name a famous painting.",
)


@dataclass(frozen=True)
class Sizes:
    """What each part runs: prompts and tokens of the TP run, the all-reduce sweep, the scaling model."""

    size: str
    world_size: int
    tp_prompts: int
    tp_new_tokens: int
    sweep_quick: bool
    sweep_repeats: int
    scaling_model: str
    scaling_batch: int
    scaling_context: int

    @property
    def sweep_sizes(self) -> tuple[int, ...]:
        """The all-reduce message sizes timed (bytes)."""
        return default_sizes(self.sweep_quick)


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Quick: a few prompts and tokens (about 20 s on 2 busy cores, mostly starting 2 processes)."""
    size = choose_size(device, size)
    common = dict(world_size=TP_WORLD_SIZE, scaling_model=SCALING_MODEL, scaling_batch=SCALING_BATCH,
                  scaling_context=SCALING_CONTEXT)
    if size == "quick":
        return Sizes(size, tp_prompts=4, tp_new_tokens=6, sweep_quick=True, sweep_repeats=15, **common)
    return Sizes(size, tp_prompts=8, tp_new_tokens=16, sweep_quick=False, sweep_repeats=40, **common)
