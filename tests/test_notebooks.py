"""Every notebook runs headless (script mode), as CI and the tour run it.

The notebooks run two at a time, one torch thread each: on CI's 2 cores that cuts the wall time
of the slowest tests without oversubscribing (two processes of two threads each would spin
against each other). A notebook's own results do not depend on its thread count.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lanes import selected

from infer_lab.package_files import notebooks_dir

NOTEBOOKS = sorted(notebooks_dir().glob("[0-9][0-9]_*.py"))
LONGEST_FIRST = [p.name for key in ("12", "09", "02", "14", "06", "13", "10") for p in NOTEBOOKS
                 if p.name.startswith(key)]


def test_notebooks_exist_in_order():
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert numbers[:2] == ["00", "01"] and numbers == sorted(numbers)


def _run_all(paths: list[Path]) -> dict[str, object]:
    """Script-mode runs of ``paths`` in two worker processes of one torch thread each, longest first
    (tests/notebook_runner.py): each worker imports the heavy libraries once."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import notebook_runner

    order = sorted(paths, key=lambda p: (LONGEST_FIRST.index(p.name) if p.name in LONGEST_FIRST
                                         else len(LONGEST_FIRST), p.name))
    tests_dir = str(Path(__file__).resolve().parent)
    # not a multiprocessing.Pool: its daemonic workers could not start chapter 14's rank processes
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"), initializer=notebook_runner.init_worker,
                             initargs=([tests_dir, *sys.path],)) as pool:
        pending = {p.name: pool.submit(notebook_runner.run_notebook, str(p)) for p in order}
        return {name: job.result(timeout=900) for name, job in pending.items()}


@pytest.fixture(scope="module")
def runs(request) -> dict[str, object]:
    """The selected notebooks' script-mode runs, two at a time, longest first."""
    return _run_all(selected(request, "test_notebook_runs_headless", "path"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(path, runs):
    run = runs[path.name]
    assert run.ok, f"{path.name} failed:\n{run.stderr[-4000:]}"
    # marimo script mode reports a failing cell on stderr without always failing the process
    assert "Traceback" not in run.stderr, run.stderr[-4000:]
