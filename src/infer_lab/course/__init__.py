"""The course: one module per chapter, each the single source of its notebook, tour step and checks.

Chapter ``NN`` lives in ``course/chNN_<slug>.py`` (or, once it outgrows one file, the package
``course/chNN_<slug>/`` with a file per part, re-exporting the same names) next to
``infer_lab/notebooks/NN_<slug>.py``. Every
chapter module has the same small surface, and every consumer (the notebook, ``infer-lab
tour``, the tests, the exercises, the slides) calls it and restates nothing:

==================  ==========================================================================
``NUMBER``          ``"02"``; ``SLUG`` and ``TITLE`` name the chapter
``NEEDS_MODEL``     whether :func:`measure` takes a loaded model (``lm``) or works from configs
``PARTS``           ``{key: button label}``: the measurements a learner starts, in order
``Sizes``           the sizes of those measurements; ``sizes(device, size)`` picks them
                    (``"quick"`` on a CPU, ``"full"`` on a GPU, or what the learner asks for)
``measure``         ``measure(lm, sizes, parts=None) -> Result``: a typed dataclass whose
                    fields are the parts' results (``None`` for a part not run) and whose
                    ``seconds`` holds each part's wall time
``figures``         ``figures(result) -> {name: matplotlib Figure}`` for the parts present
``tables``          ``tables(result) -> {name: DataFrame}``, rounded for people, with units
``summary``         ``summary(result) -> str``: the chapter's findings as markdown, every
                    number computed from the result
``saved``           ``saved() -> SavedView | None``: results saved on a GPU, for machines without
==================  ==========================================================================

The notebooks call the per-part functions a chapter exposes (``measure_memory(lm, sizes)``
and friends) behind their run buttons; ``measure`` is the same parts in a row.

Where a chapter has moved to *the page is the experiment* (chapter 09 first), the experiment is
an ``@app.function`` of the notebook that calls the library directly, a visible cell calls it
with numbers the learner can change, and the chapter module keeps presentation only: its
``run_<part>`` executes the notebook's own function for ``measure`` (the tour, the tests, the
Jupyter edition). :mod:`infer_lab.course.notebook_code` explains the pattern.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

# Load the submodule ``course.chapter`` now, so that the function ``chapter`` below keeps the
# package attribute: importing the submodule later (any chapter module does) would rebind it.
from . import chapter as _chapter_module  # noqa: F401


def chapter_names() -> list[str]:
    """Module names of the chapters in course order (``ch00_setup``, ``ch02_feel_the_pain``, ...)."""
    return sorted(i.name for i in pkgutil.iter_modules(__path__) if i.name[:2] == "ch" and i.name[2:4].isdigit())


def chapters(only: list[str] | None = None) -> list[ModuleType]:
    """The chapter modules in order; ``only`` keeps those whose name contains one of its strings."""
    names = chapter_names()
    if only:
        names = [n for n in names if any(key in n for key in only)]
    return [importlib.import_module(f"{__name__}.{n}") for n in names]


def chapter(key: str) -> ModuleType:
    """One chapter by number (``"02"``) or slug (``"feel_the_pain"``); a clear error otherwise."""
    matches = [n for n in chapter_names() if n[2:4] == key.zfill(2) or key in n]
    if len(matches) != 1:
        known = ", ".join(n[2:] for n in chapter_names())
        raise KeyError(f"no single chapter matches {key!r}; known: {known}")
    return importlib.import_module(f"{__name__}.{matches[0]}")
