"""What the notebook-page tests share.

* :func:`edited_notebook`: a notebook with one knob of a cell changed, as a learner would. The
  learner's experiment is a visible cell with its knobs written in it (``users = sizes.users``); a
  test that proves "change the number, the result follows" writes the notebook with that knob's
  value changed (``edited_notebook("02", tmp_path, users=(1, 8))``) and imports it through marimo's
  own API (``app`` cells become ``module.<cell>.run(...)``). The knob is found by its name in the
  cell's syntax tree, so a reworded comment or a reformatted line changes nothing.
* :func:`cell_call`: what a cell hands its experiment, as shipped or once a learner changed its knob;
  :func:`chapter_call`: what the chapter's runner hands it (one home for their numbers: the two agree).
* :func:`experiment_calls`: which of the page's ``@app.function`` experiments a chapter's runner
  calls, with what arguments (recorded, not read from source).
* :func:`shows_the_real_code`: a page that shows library code shows the real function, docstring left out.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from infer_lab.course.notebook_code import notebook_function, notebook_path


def edited_notebook(number: str, tmp_path: Path, **knobs: object) -> ModuleType:
    """Notebook ``number`` with each knob's value changed, imported as a module (no knobs: as shipped).

    A knob is an assignment ``name = value`` in one of the page's ``@app.cell`` cells (``k = 4``,
    ``slots = sizes.steps_slots``): the learner's change is its value, written here as ``repr(value)``,
    and nothing else (the comment after it and the line's layout stay as they are). Each knob must be
    assigned in exactly one cell, so the edit cannot land on another cell's variable.
    """
    path = notebook_path(number)
    lines = path.read_text().splitlines(keepends=True)
    cells = [node for node in ast.parse("".join(lines), str(path)).body if isinstance(node, ast.FunctionDef)
             and any(_is_app_cell(d) for d in node.decorator_list)]
    edits = []
    for knob, value in knobs.items():
        found = [(cell.name, stmt.value) for cell in cells for stmt in cell.body if isinstance(stmt, ast.Assign)
                 and [getattr(t, "id", None) for t in stmt.targets] == [knob]]
        if len(found) != 1:
            raise AssertionError(f"notebook {number}: the knob {knob!r} should be set in one cell, "
                                 f"is set in {[name for name, _ in found]}")
        edits.append((found[0][1], repr(value)))
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):  # bottom up
        first, last = (lines[node.lineno - 1].encode(), lines[node.end_lineno - 1].encode())  # offsets are UTF-8 bytes
        joined = first[:node.col_offset].decode() + text + last[node.end_col_offset:].decode()
        lines[node.lineno - 1:node.end_lineno] = [joined]
    name = f"infer_lab_notebook_{number}_edited"
    edited = tmp_path / f"{name}.py"
    edited.write_text("".join(lines))
    return imported_notebook(edited, name)


def _is_app_cell(decorator: ast.expr) -> bool:
    """``@app.cell`` or ``@app.cell(...)``."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(node, ast.Attribute) and node.attr == "cell" and getattr(node.value, "id", None) == "app"


def imported_notebook(path: Path, name: str) -> ModuleType:
    """The marimo notebook at ``path`` imported as module ``name``, as marimo imports it
    (``@app.function`` experiments become attributes, cells ``module.<cell>.run(...)``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


class Stop(Exception):
    """Raised by a stubbed experiment: the runner reached it, there is nothing more to run."""


def cell_call(number: str, tmp_path: Path, experiment: str, refs: dict, defining: str, **knobs: object) -> dict:
    """What the page's cell that defines ``defining`` hands its ``@app.function`` ``experiment``: the
    notebook as shipped, or with ``knobs`` changed as a learner would (:func:`edited_notebook`). The
    cell runs through marimo with ``refs`` and a stand-in experiment that records the call (by
    parameter name) and stops the cell there; of ``refs``, the cell gets those it reads."""
    page = edited_notebook(number, tmp_path, **knobs)
    cell = next(data.cell for data in page.app._cell_manager.cell_data()
                if data.cell is not None and defining in data.cell.defs)
    signature, calls = inspect.signature(notebook_function(number, experiment)), []

    def record(*args, **kwargs):
        calls.append(dict(signature.bind(*args, **kwargs).arguments))
        raise Stop

    with pytest.raises(Stop):
        cell.run(**{name: value for name, value in refs.items() if name in cell.refs}, **{experiment: record})
    return calls[0]


def experiment_calls(monkeypatch, module, run, *args, stop_at: str | None = None) -> list[tuple[str, dict]]:
    """The notebook experiments that ``run(*args)`` calls through ``module.notebook_function``, each with
    its arguments by parameter name; each runs for real except ``stop_at``, which stops the run (without
    ``stop_at``, something the experiments call must raise :class:`Stop`)."""
    calls = []

    def recording(number: str, name: str):
        assert number == module.NUMBER
        experiment = notebook_function(number, name)  # the real one, from the notebook file

        def record(*a, **k):
            calls.append((name, dict(inspect.signature(experiment).bind(*a, **k).arguments)))
            if name == stop_at:
                raise Stop
            return experiment(*a, **k)
        return record

    monkeypatch.setattr(module, "notebook_function", recording)
    with pytest.raises(Stop):
        run(*args)
    return calls


def chapter_call(monkeypatch, runner, *args, experiment: str) -> dict:
    """What the chapter's ``runner(*args)`` hands the page's ``experiment``, by parameter name (the
    experiments before it run for real; see :func:`experiment_calls`)."""
    calls = experiment_calls(monkeypatch, importlib.import_module(runner.__module__), runner, *args, stop_at=experiment)
    return calls[-1][1]


def without_args(call: dict, *names: str) -> dict:
    """``call`` without the arguments ``names`` (a model each side wraps in its own copy)."""
    return {name: value for name, value in call.items() if name not in names}


def without_docstring(function) -> str:
    """``function``'s real source, dedented, its docstring's lines left out (computed here, from the library)."""
    source = textwrap.dedent(inspect.getsource(function))
    first = ast.parse(source).body[0].body[0]
    lines = source.splitlines()
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        del lines[first.lineno - 1:first.end_lineno]
    return "\n".join(lines).rstrip()


def shows_the_real_code(shown: str, *functions) -> None:
    """``shown`` holds each function's real code, and none of their docstrings."""
    for function in functions:
        assert without_docstring(function) in shown, function.__qualname__
        assert inspect.getdoc(function).splitlines()[0] not in shown, function.__qualname__


class RecordingEngine:
    """Stands in for the library's ``Engine`` inside a notebook function: records each engine made
    (``made``, its ``config``) and each ``generate`` call by parameter name (``generated``), and serves
    nothing: each prompt gets :meth:`output`, the step log is one marker. A test subclasses it to
    hand back what its experiment reads (``output``), and resets ``made`` with monkeypatch."""

    made: list = []

    def __init__(self, config) -> None:
        self.config, self.step_log, self.generated, self.prefix_cache = config, ["step"], [], None

    @classmethod
    def from_loaded(cls, lm, config):
        engine = cls(config)
        cls.made.append(engine)
        return engine

    def output(self, prompt):
        """What the engine hands back for one prompt (no tokens)."""
        return SimpleNamespace(token_ids=[])

    def generate(self, *args, **kwargs):
        from infer_lab.engine import Engine

        call = inspect.signature(Engine.generate).bind(self, *args, **kwargs).arguments  # by parameter name
        self.generated.append(call)
        return [self.output(prompt) for prompt in call["prompts"]]
