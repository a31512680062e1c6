"""Worker side of tests/test_chapters.py: runs chapters at quick sizes in a pool of processes.

Each worker loads the embedded model once and uses one torch thread; the test process gets each
chapter's :class:`infer_lab.course.tour.ChapterRun` back (results are plain dataclasses, so they pickle).
"""

from __future__ import annotations

import functools
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


def record_experiments(number: str) -> list[str]:
    """Wrap notebook ``number``'s ``@app.function`` experiments (as the chapter modules fetch them) so
    that each call is recorded; returns the list the names are appended to, in call order."""
    from infer_lab.course.notebook_code import notebook_functions

    called: list[str] = []
    try:
        functions = notebook_functions(number)
    except FileNotFoundError:
        return called
    for fname, fn in list(functions.items()):
        if getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__

        @functools.wraps(fn)
        def recorded(*args: Any, _fn: Any = fn, _name: str = fname, **kwargs: Any) -> Any:
            called.append(_name)
            return _fn(*args, **kwargs)

        functions[fname] = recorded
    return called


def run_one(name: str, out_dir: str) -> Any:
    """``run_chapter`` for one chapter module name, the embedded model shared by the worker's chapters.

    The returned run also carries ``experiments_ran``: the notebook's ``@app.function`` experiments
    that the chapter called, so a test can prove the page's code is the code that ran.
    """
    global _LM
    from infer_lab.course.tour import TourContext, run_chapter

    mod = importlib.import_module(f"infer_lab.course.{name}")
    called = record_experiments(mod.NUMBER)
    ctx = TourContext(out_dir=Path(out_dir), quick=True)
    if mod.NEEDS_MODEL:
        if _LM is None:
            from infer_lab.models import load_model

            _LM = load_model("smollm2-135m", device="cpu")
        ctx._lm = _LM
    run = run_chapter(mod, ctx)
    run.experiments_ran = sorted(set(called))
    return run
