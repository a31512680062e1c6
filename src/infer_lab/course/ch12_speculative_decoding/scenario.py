"""Chapter 12's identity (number, title, parts) and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..chapter import choose_size

NUMBER = "12"

SLUG = "speculative_decoding"

TITLE = "12 · Speculative decoding: guess k tokens, verify them in one pass"

NEEDS_MODEL = True

PARTS = {
    "passes": "Count the target passes of one request",
    "sweep": "Sweep proposers and k",
    "workloads": "Grounded prompts vs open-ended chat",
    "batch": "Speedup vs batch size",
    "variants": "Size EAGLE, Medusa and MTP",
}

# The page's numbered sections: 0 is the textbook model (computed, nothing to run), then one per part, in
# order. The headings and every "section N" of the learner's text read their number here.
SECTIONS = {key: number for number, key in enumerate(PARTS, start=1)}

# The one counted request of part "passes": its proposer and its guesses per target pass (the notebook's
# cell reads both).
PASSES_PROPOSER, PASSES_K = "ngram", 4

# Parts that need no model and measure nothing here (computed or simulated): the saved-only deck keeps them.
ANALYTIC_PARTS = ("variants",)

K_RANGE = tuple(range(1, 9))


@dataclass(frozen=True)
class Sizes:
    """What each part runs: proposers and k, prompts per workload, new tokens, batches."""

    size: str
    sweep: tuple[tuple[str, tuple[int, ...]], ...]  # (proposer, k values) on grounded prompts
    sweep_prompts: int
    workload_configs: tuple[tuple[str, int], ...]
    workload_prompts: int  # per workload
    batches: tuple[int, ...]
    batch_config: tuple[str, int]
    batch_prompts: int
    max_new_tokens: int
    rounds: int
    variant_models: tuple[str, ...] = ("mistral-7b", "llama-3-8b", "deepseek-v3")
    passes_new_tokens: int = 32  # the one counted request of part "passes"

    def sweep_configs(self) -> list[tuple[str, int]]:
        return [(p, k) for p, ks in self.sweep for k in ks]


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: a few seconds to about 20 s per button on a 2-core CPU; ``full``: every k."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if size == "quick" and not on_gpu:
        return Sizes(size, sweep=(("ngram", (1, 2, 4, 8)), ("self:24", (1,))), sweep_prompts=2,
                     workload_configs=(("ngram", 4),), workload_prompts=2, batches=(1, 4),
                     batch_config=("ngram", 4), batch_prompts=2, max_new_tokens=24, rounds=1)
    if size == "quick":
        return Sizes(size, sweep=(("ngram", (1, 2, 4, 8)), ("self:24", (1, 2, 4))), sweep_prompts=4,
                     workload_configs=(("ngram", 4), ("self:24", 2)), workload_prompts=4,
                     batches=(1, 4, 16), batch_config=("ngram", 4), batch_prompts=8, max_new_tokens=64,
                     rounds=1)
    self_layers = (16, 24, 28) if not on_gpu else (8, 16, 24, 28)
    return Sizes(size, sweep=(("ngram", K_RANGE),) + tuple((f"self:{L}", K_RANGE) for L in self_layers),
                 sweep_prompts=4 if not on_gpu else 8,
                 workload_configs=(("ngram", 2), ("ngram", 4), ("self:24", 2)), workload_prompts=8,
                 batches=(1, 2, 4, 8) if not on_gpu else (1, 2, 4, 8, 16, 32, 64),
                 batch_config=("ngram", 4), batch_prompts=8, max_new_tokens=64 if not on_gpu else 128,
                 rounds=2 if not on_gpu else 3)
