"""What every chapter module shares: choosing sizes, timing its parts, the base of its results."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

SIZES = ("quick", "full")
QUICK_ENV = "INFER_LAB_QUICK"


def choose_size(device: torch.device | str | None = None, size: str | None = None) -> str:
    """``"quick"`` or ``"full"``: the learner's choice, else ``$INFER_LAB_QUICK``, else by device.

    A CPU gets ``"quick"`` (every run button done in well under a minute on 2 cores), a GPU
    ``"full"``. ``INFER_LAB_QUICK=1`` (CI, the instructor's pre-run) forces ``"quick"``.
    """
    if size is not None:
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
        return size
    env = os.environ.get(QUICK_ENV)
    if env is not None and env != "":
        return "quick" if env not in ("0", "false", "no") else "full"
    dev = torch.device(device) if device is not None else None
    on_gpu = dev.type == "cuda" if dev is not None else torch.cuda.is_available()
    return "full" if on_gpu else "quick"


@dataclass
class ChapterResult:
    """Base of every chapter's ``Result``: its size and how long each part took (seconds)."""

    size: str = "quick"
    seconds: dict[str, float] = field(default_factory=dict)

    def parts_run(self) -> list[str]:
        return list(self.seconds)


# What a chapter's result names as its model when it ran without one (its analytic parts only).
NO_MODEL = "no model loaded (analytic and simulated parts only)"


def selected_parts(parts: Iterable[str] | None, known: dict[str, str]) -> list[str]:
    """The requested parts in course order; an unknown key is a clear error."""
    if parts is None:
        return list(known)
    wanted = list(parts)
    unknown = [p for p in wanted if p not in known]
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; this chapter has {', '.join(known)}")
    return [p for p in known if p in wanted]


def run_parts(
    result: ChapterResult,
    parts: Iterable[str] | None,
    known: dict[str, str],
    functions: dict[str, Callable[[], Any]],
) -> ChapterResult:
    """Run each selected part's function, store its value on ``result.<part>`` and time it."""
    for key in selected_parts(parts, known):
        t0 = time.perf_counter()
        setattr(result, key, functions[key]())
        result.seconds[key] = time.perf_counter() - t0
    return result
