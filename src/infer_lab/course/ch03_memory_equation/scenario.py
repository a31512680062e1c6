"""Chapter 03's identity (number, title, parts) and the sizes of its analytic defaults and its tensor check."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..calculator import DEFAULTS_KV
from ..chapter import choose_size

NUMBER = "03"
SLUG = "memory_equation"
TITLE = "03 · The memory equation: weights, overhead and KV per token"
NEEDS_MODEL = True
PARTS = {
    "equation": "The memory equation for every catalogued model (analytic: runs live)",
    "check": "Load the model and count its bytes",
}


@dataclass(frozen=True)
class Sizes:
    """The analytic defaults (what the notebook's controls start at) and the size of the tensor check."""

    size: str
    model: str
    kv_dtype: str
    context: int
    users: int
    gpu: str
    growth_users: tuple[int, ...]  # one line per user count in the KV-growth figure
    growth_max_tokens: int
    check_batch: int
    check_prompt_len: int
    check_new_tokens: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """The check is a 2 x 16-token prompt at ``quick`` (under a second on a CPU), 2 x 256 at ``full``."""
    size = choose_size(device, size)
    d = DEFAULTS_KV
    return Sizes(size, model=d["model"], kv_dtype=d["kv_dtype"], context=d["context"], users=d["users"],
                 gpu=d["gpu"], growth_users=(1, 8, 32, 80), growth_max_tokens=32768, check_batch=2,
                 check_prompt_len=16 if size == "quick" else 256, check_new_tokens=4)
