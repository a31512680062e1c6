"""The files that ship inside the ``infer_lab`` package, found the same way in a clone and after ``pip install``.

Everything the course reads besides code is package data (``package-data`` in ``pyproject.toml``),
so a wheel, an sdist and ``pip install git+<address>`` all carry it:

* ``infer_lab/notebooks/``: the marimo notebooks (``NN_<slug>.py`` and ``index.py``);
* ``infer_lab/results/``: results measured on a GPU (or timed on a CPU) and saved as JSON;
* ``infer_lab/data/``: the catalogs and cited figures;
* ``infer_lab/course/exercises/`` and ``infer_lab/course/track/``: starters and reference solutions.

Callers ask this module (through :mod:`importlib.resources`), never the repository's layout. With
an editable install (a clone after ``make setup``) these are the checkout's own files: there is one
copy of each. ``$INFER_LAB_NOTEBOOKS`` and ``$INFER_LAB_RESULTS`` point the notebooks and the
saved results elsewhere (a learner's own copy of the notebooks, a folder of fresh GPU runs).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

NOTEBOOKS_ENV = "INFER_LAB_NOTEBOOKS"
RESULTS_ENV = "INFER_LAB_RESULTS"


def package_path(*parts: str) -> Path:
    """A file or folder inside the imported ``infer_lab`` package, as a path on disk.

    pip always installs the package unpacked, so the resource is a real file that marimo, ``exec``
    and ``glob`` can use.
    """
    found = resources.files("infer_lab")
    for part in parts:
        found = found / part
    return Path(str(found))


def notebooks_dir() -> Path:
    """The folder of the marimo notebooks: ``infer_lab/notebooks`` (``$INFER_LAB_NOTEBOOKS`` overrides)."""
    env = os.environ.get(NOTEBOOKS_ENV)
    return Path(env) if env else package_path("notebooks")


def results_dir() -> Path:
    """The folder of the saved results: ``infer_lab/results`` (``$INFER_LAB_RESULTS`` overrides)."""
    env = os.environ.get(RESULTS_ENV)
    return Path(env) if env else package_path("results")


def data_path(*parts: str) -> Path:
    """A file under ``infer_lab/data`` (``data_path("models", "mistral-7b.json")``)."""
    return package_path("data", *parts)
