"""What the notebook-page tests share.

* :func:`edited_notebook` / :func:`cell_line`: a notebook with one line of a cell changed, as a learner
  would. The learner's experiment is a visible cell with its knobs written in it (``users = (1, 8)``);
  a test that proves "change the number, the result follows" writes the notebook with that one line
  changed and imports it through marimo's own API (``app`` cells become ``module.<cell>.run(...)``).
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


def edited_notebook(number: str, tmp_path: Path, old: str, new: str) -> ModuleType:
    """Notebook ``number`` with the one line ``old`` replaced by ``new``, imported as a module.

    ``old`` must occur exactly once, so the edit is the learner's change and nothing else.
    """
    source = notebook_path(number).read_text()
    if source.count(old) != 1:
        raise AssertionError(f"notebook {number} should hold {old!r} exactly once, holds it {source.count(old)} times")
    name = f"infer_lab_notebook_{number}_edited"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return imported_notebook(path, name)


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


def cell_line(number: str, starts_with: str) -> str:
    """The one line of notebook ``number`` that starts with ``starts_with`` (the knob's line, whatever its value)."""
    lines = [x for x in notebook_path(number).read_text().splitlines() if x.startswith(starts_with)]
    if len(lines) != 1:
        raise AssertionError(f"notebook {number} should have one line starting {starts_with!r}, has {len(lines)}")
    return lines[0]


class Stop(Exception):
    """Raised by a stubbed experiment: the runner reached it, there is nothing more to run."""


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
