"""Worker side of tests/test_notebooks.py: runs notebooks in script mode in a pool of processes.

Each worker imports torch, transformers, marimo and the course once and then runs its share of
the notebooks one after another, each exactly as ``python src/infer_lab/notebooks/NN_x.py`` does (the file run
as ``__main__``, so marimo runs the app in script mode and every run button counts as pressed).
That saves the few seconds of imports each notebook's own process would spend. Every notebook
starts from one torch thread and INFER_LAB_QUICK=1; what it writes to stderr comes back with it.
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
import time
import traceback
from dataclasses import dataclass


@dataclass
class NotebookRun:
    """One notebook's script-mode run."""

    ok: bool  # it ran to the end without an exception escaping
    stderr: str
    seconds: float


def init_worker(paths: list[str]) -> None:
    """The test's import paths, the quick sizes, Agg and one torch thread; the heavy imports once."""
    sys.path[:0] = [p for p in paths if p not in sys.path]
    os.environ.update(INFER_LAB_QUICK="1", MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    import marimo  # noqa: F401
    import matplotlib

    matplotlib.use("Agg")
    import torch
    import transformers  # noqa: F401

    import infer_lab.course  # noqa: F401

    torch.set_num_threads(1)


def run_notebook(path: str) -> NotebookRun:
    """``python path`` in this process: the notebook run as ``__main__`` (marimo's script mode)."""
    import matplotlib.pyplot as plt
    import torch

    torch.set_num_threads(1)
    err = io.StringIO()
    start = time.perf_counter()
    ok = True
    with contextlib.redirect_stderr(err):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            ok = exc.code in (0, None)
        except BaseException:  # noqa: BLE001 - reported with the notebook, like a failing process
            ok = False
            traceback.print_exc()
    plt.close("all")
    return NotebookRun(ok=ok, stderr=err.getvalue(), seconds=time.perf_counter() - start)
