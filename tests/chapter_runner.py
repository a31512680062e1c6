"""Worker side of tests/test_chapters.py: runs chapters at quick sizes in a pool of processes.

Each worker loads the embedded model once and uses one torch thread; the test process gets each
chapter's :class:`infer_lab.tour.ChapterRun` back (results are plain dataclasses, so they pickle).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

_LM: Any = None


def init_worker(paths: list[str]) -> None:
    """Make the test's import paths importable here, and use one torch thread."""
    sys.path[:0] = [p for p in paths if p not in sys.path]
    import matplotlib

    matplotlib.use("Agg")
    import torch

    torch.set_num_threads(1)


def run_one(name: str, out_dir: str) -> Any:
    """``run_chapter`` for one chapter module name, the embedded model shared by the worker's chapters."""
    global _LM
    from infer_lab.tour import TourContext, run_chapter

    mod = importlib.import_module(f"infer_lab.course.{name}")
    ctx = TourContext(out_dir=Path(out_dir), quick=True)
    if mod.NEEDS_MODEL:
        if _LM is None:
            from infer_lab.models import load_model

            _LM = load_model("smollm2-135m", device="cpu")
        ctx._lm = _LM
    return run_chapter(mod, ctx)
