"""Every notebook runs headless (script mode), as CI and the tour run it.

The notebooks run two at a time, one torch thread each: on CI's 2 cores that cuts the wall time
of the slowest tests without oversubscribing (two processes of two threads each would spin
against each other). A notebook's own results do not depend on its thread count.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lanes import in_lanes, selected

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.py"))
LONGEST_FIRST = [p.name for key in ("12", "09", "02", "14", "06", "13", "10") for p in NOTEBOOKS
                 if p.name.startswith(key)]


def test_notebooks_exist_in_order():
    numbers = [p.name[:2] for p in NOTEBOOKS]
    assert numbers[:2] == ["00", "01"] and numbers == sorted(numbers)


def _run(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, INFER_LAB_QUICK="1", MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def runs(request) -> dict[str, subprocess.CompletedProcess]:
    """The selected notebooks' script-mode runs, two at a time, longest first."""
    return in_lanes(_run, selected(request, "test_notebook_runs_headless", "path"),
                    name=lambda p: p.name, first=LONGEST_FIRST)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(path, runs):
    proc = runs[path.name]
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stderr[-4000:]}"
    # marimo script mode reports a failing cell on stderr without always failing the process
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
