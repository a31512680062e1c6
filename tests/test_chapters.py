"""Every chapter module has the same surface and runs on the CPU at quick sizes, as the tour runs it."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import subprocess
import sys

import matplotlib.pyplot as plt
import pytest
from page_helpers import imported_notebook

from infer_lab.course import chapter, chapter_names, chapters
from infer_lab.course.notebook_code import notebook_functions, notebook_path
from infer_lab.package_files import notebooks_dir

NAMES = chapter_names()
SURFACE = ("NUMBER", "SLUG", "TITLE", "NEEDS_MODEL", "PARTS", "Sizes", "sizes", "Result", "measure",
           "figures", "tables", "summary", "saved")


def test_chapters_cover_every_notebook():
    notebooks = sorted(p.stem for p in notebooks_dir().glob("[0-9][0-9]_*.py"))
    assert [n[2:] for n in NAMES] == notebooks  # ch02_feel_the_pain <-> 02_feel_the_pain.py
    assert chapter("02").NUMBER == "02" and chapter("feel_the_pain").SLUG == "feel_the_pain"
    with pytest.raises(KeyError, match="known"):
        chapter("no-such-chapter")


@pytest.mark.parametrize("name", NAMES)
def test_chapter_has_the_common_surface(name):
    mod = importlib.import_module(f"infer_lab.course.{name}")
    missing = [attr for attr in SURFACE if not hasattr(mod, attr)]
    assert not missing, f"{name} lacks {missing}"
    assert mod.NUMBER == name[2:4] and mod.TITLE.startswith(mod.NUMBER)
    assert dataclasses.is_dataclass(mod.Result) and mod.PARTS
    quick, full = mod.sizes("cpu", "quick"), mod.sizes("cpu", "full")
    assert quick.size == "quick" and full.size == "full"
    with pytest.raises(ValueError, match="size must be"):
        mod.sizes("cpu", "huge")


@pytest.fixture(scope="module")
def chapter_runs(tour_runs):
    """Every selected chapter run as the tour runs it (conftest's ``tour_runs``, shared with the page tests)."""
    return tour_runs


@pytest.mark.parametrize("name", NAMES)
def test_chapter_runs_on_the_cpu_at_quick_sizes(name, chapter_runs):
    mod = importlib.import_module(f"infer_lab.course.{name}")
    run = chapter_runs[name]
    assert run.ok, run.traceback
    result = run.result
    assert isinstance(result, mod.Result) and set(result.seconds) == set(mod.PARTS)
    assert run.figures and all(p.stat().st_size > 1000 for p in run.figures)
    json.dumps(dataclasses.asdict(result), default=str)  # results are plain data
    for title, frame in mod.tables(result).items():
        assert len(frame), title
        text = frame.to_string()
        for raw in ("nan", "None", "NaN"):
            assert raw not in text.split(), f"{title} shows {raw}"
    assert mod.summary(result).strip()
    for key, fig in mod.figures(result).items():  # every axis in plain numbers: no mathtext
        fig.canvas.draw()
        labels = [t.get_text() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                  for t in axis.get_ticklabels(which="both")]
        assert not [text for text in labels if "$" in text], (key, labels)
        plt.close(fig)


def _marimo_import(number: str):
    """Notebook ``number`` imported as marimo imports it (``@app.function`` definitions become module attributes)."""
    return imported_notebook(notebook_path(number), f"infer_lab_page_{number}")


def _code_shape(code) -> tuple:
    """What a function's code does (its bytecode, names and constants, nested functions included),
    without where it sits in the file."""
    consts = tuple(_code_shape(c) if hasattr(c, "co_code") else c for c in code.co_consts)
    return code.co_code, code.co_names, consts


def _nested(code) -> list:
    """``code`` and every code object compiled inside it (comprehensions, nested functions)."""
    return [code] + [inner for c in code.co_consts if hasattr(c, "co_code") for inner in _nested(c)]


def _lines(*codes) -> int:
    """How many lines of the file the compiled ``codes`` span, first to last."""
    lines = {line for code in codes for c in _nested(code) for _, _, line in c.co_lines() if line}
    return max(lines) - min(lines) + 1 if lines else 0


def _page_cells(page) -> list[tuple[str, list]]:
    """Each ``@app.cell`` of the page as marimo compiled it: (its name, its code objects)."""
    cells = [(data.name, data.cell._cell) for data in page.app._cell_manager.cell_data() if data.cell is not None]
    return [(name, [c for c in (impl.body, impl.last_expr) if c is not None]) for name, impl in cells]


PAGE_LINES = 15  # an experiment, a function or a cell behind a run button, is read on the page in one look


@pytest.mark.parametrize("name", NAMES)
def test_the_page_code_is_the_code_that_ran(name, chapter_runs):
    """The one structural check of "one copy": the page's code is the code that ran.

    * ``chapter_runs`` records each ``@app.function`` experiment that the chapter module called while the
      tour ran it; each must be the very code that marimo imports from the page (same file, same
      bytecode and constants), so there is no second copy to drift. A chapter whose page defines
      experiments must run at least one of them.
    * No cell of the page runs an experiment through the chapter module (its ``run_*`` or ``measure``):
      the page calls its own experiments, the ones the tour ran. Read from the code marimo compiled
      for each cell (the attributes it loads), not from the file's text.
    * Each experiment is short enough to read on the page: every ``@app.function`` and every cell
      behind a run button (``mo.stop``) spans at most :data:`PAGE_LINES` lines of compiled code.
    """
    pytest.importorskip("marimo")
    mod = importlib.import_module(f"infer_lab.course.{name}")
    run = chapter_runs[name]
    assert run.ok, run.traceback
    ran = run.experiments_ran
    experiments = notebook_functions(mod.NUMBER)
    if experiments:
        assert ran, f"{name} measured nothing through its page's experiments {sorted(experiments)}"
    page = _marimo_import(mod.NUMBER)
    for fname in ran:
        ours, marimos = experiments[fname], getattr(page, fname)
        assert ours.__code__.co_filename == marimos.__code__.co_filename == str(notebook_path(mod.NUMBER))
        assert _code_shape(ours.__code__) == _code_shape(marimos.__code__), fname
    for fname, experiment in experiments.items():
        assert experiment.__code__.co_filename == str(notebook_path(mod.NUMBER)), fname
        assert _lines(experiment.__code__) <= PAGE_LINES, f"{fname}: {_lines(experiment.__code__)} lines"
    runners = {attr for attr in dir(mod) if attr.startswith(("run_", "measure"))}
    for cell, codes in _page_cells(page):
        loaded = {n for code in codes for c in _nested(code) for n in c.co_names}
        assert not loaded & runners, f"cell {cell} runs {sorted(loaded & runners)} of {name}, not the page's own"
        if "stop" in loaded:  # mo.stop: a cell behind a run button
            assert _lines(*codes) <= PAGE_LINES, f"cell {cell}: {_lines(*codes)} lines"


def test_parts_can_be_run_one_at_a_time(embedded):
    ch02 = chapter("02")
    result = ch02.measure(embedded, ch02.sizes("cpu", "quick"), parts=["memory"])
    assert result.memory is not None and result.ttft is None and list(result.seconds) == ["memory"]
    assert result.memory.kv_bytes_per_token == 2 * 30 * 3 * 64 * 4  # SmolLM2-135M, fp32
    assert list(ch02.figures(result)) == ["memory"]
    with pytest.raises(ValueError, match="unknown part"):
        ch02.measure(embedded, ch02.sizes("cpu", "quick"), parts=["nope"])


def test_chapters_in_course_order():
    numbers = [m.NUMBER for m in chapters()]
    assert numbers == sorted(numbers) and numbers[:2] == ["00", "01"]


def test_the_engine_package_imports_no_plotting_or_notebook_library():
    code = ("import sys, infer_lab.engine; "
            "print(sorted(m for m in ('matplotlib', 'pandas', 'marimo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
