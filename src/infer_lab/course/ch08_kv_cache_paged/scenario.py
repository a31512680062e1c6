"""Chapter 08's identity (number, title, parts), the figures it cites, the workload and the sizes each part runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...analysis.kv_waste import mixed_lengths
from ...shape import ModelShape, model_shape
from ...units import GiB
from ..chapter import choose_size

NUMBER = "08"
SLUG = "kv_cache_paged"
TITLE = "08 · KV cache and PagedAttention"
NEEDS_MODEL = True
PARTS = {
    "cache": "Measure no cache vs KV cache",
    "waste": "Simulate where KV memory goes",
    "fit": "Reserve the workload with the engine's allocators",
}
# Parts that need no model and measure nothing here (computed or simulated): the saved-only deck keeps them.
ANALYTIC_PARTS = ("waste", "fit")

# What the vLLM paper reports (cited, not measured here): share of KV memory wasted.
PAPER = "the vLLM paper (Kwon et al., 2023)"
PAPER_WASTE_BEFORE = (0.60, 0.80)  # earlier systems (contiguous reservations)
PAPER_WASTE_PAGED = 0.04  # vLLM with PagedAttention: under this
# What paging buys in requests or throughput, as cited (neither is measured here):
PAPER_THROUGHPUT = (2, 4)  # the vLLM paper's abstract: 2-4x the throughput of FasterTransformer and Orca, same latency
TALK_REQUESTS = 3  # the system talk (talk 2): paging lets you "serve three times more requests"
RATIO_EXPLAINED = 0.15  # a measured ratio within 15% of max_model_len / mean request is "close to it"
BYTES_PER_VALUE = {"bf16": 2, "fp32": 4}


LENGTH_DIVISOR = 4  # the workload's longest prompt and longest output are each max_model_len // LENGTH_DIVISOR


@dataclass(frozen=True)
class WasteSettings:
    """One KV-memory experiment: a model shape, a mixed workload and a KV budget. Analytic: no model runs.

    Prompt and output lengths are drawn log-uniformly up to ``max_model_len // LENGTH_DIVISOR`` each
    (:func:`mixed_lengths`, seeded); request ``i`` arrives at step ``i``. ``max_tokens`` is the
    limit each client declares (``None``: an oracle that declares exactly its output length).
    """

    shape_name: str = "mistral-7b"
    requests: int = 64
    max_model_len: int = 2048
    max_tokens: int | None = 512
    budget_bytes: int = 2 * GiB
    block_size: int = 16
    kv_dtype: str = "bf16"
    seed: int = 0

    @property
    def shape(self) -> ModelShape:
        return model_shape(self.shape_name)

    @property
    def bytes_per_value(self) -> int:
        return BYTES_PER_VALUE[self.kv_dtype]

    def lengths(self) -> tuple[list[int], list[int]]:
        """(prompt lengths, output lengths) of the workload, in tokens."""
        longest = self.max_model_len // LENGTH_DIVISOR
        return mixed_lengths(self.requests, seed=self.seed, max_prompt=longest, max_output=longest)

    def describe(self) -> str:
        declared = self.max_tokens if self.max_tokens is not None else "oracle"
        return (f"{self.shape_name} shape, {self.kv_dtype} K/V, {self.requests} mixed-length requests (one per "
                f"step), max_model_len {self.max_model_len:,}, max_tokens {declared}, "
                f"{self.budget_bytes / GiB:g} GiB budget")


@dataclass(frozen=True)
class Sizes:
    """The generation of part 1 (tokens) and the workload of parts 2 and 3."""

    size: str
    prompt_len: int
    new_tokens: int
    waste: WasteSettings = field(default_factory=WasteSettings)


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` (a few seconds on a 2-core CPU) or ``full``; a GPU gets longer contexts.

    The no-cache run recomputes the whole context at every step, so its cost grows with the
    square of ``new_tokens``: on a CPU the quick size keeps it to a few dozen tokens.
    """
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        return (Sizes(size, prompt_len=128, new_tokens=128) if size == "quick"
                else Sizes(size, prompt_len=512, new_tokens=512, waste=WasteSettings(requests=256)))
    if size == "quick":
        return Sizes(size, prompt_len=16, new_tokens=16)
    return Sizes(size, prompt_len=16, new_tokens=96, waste=WasteSettings(requests=256))
