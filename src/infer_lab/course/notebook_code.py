"""Each experiment exists once: in its notebook, where the learner reads and changes it.

The pattern, for every chapter (notebook 09 is the first to follow it):

1. The experiment is a top-level function of the marimo notebook, ``@app.function``, about 15
   lines that call the library directly (``EngineConfig``, ``Engine.from_loaded``, the engine's
   own step records...). The names it uses come from the notebook's ``with app.setup:`` block.
2. A visible cell of the notebook calls it with numbers the learner can change (``slots = 4``),
   and hands what it returns to the chapter module's figures, tables and text.
3. Everything else that runs the experiment (the tour, the tests, the deck's numbers, the
   Jupyter edition through ``chapter.measure``) calls :func:`notebook_function`, which executes
   that same function from the notebook file. There is no second copy to drift.

:func:`notebook_functions` reads the notebook with :mod:`ast` and executes only its setup block
and its ``@app.function`` definitions (compiled with the notebook's file name and line numbers,
so tracebacks and ``inspect.getsource`` point into the notebook). It needs no marimo: the GPU
image, which lacks marimo, runs the same experiment; ``import marimo`` in the setup block is
skipped. marimo itself imports the same functions when the notebook is imported as a module.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..package_files import NOTEBOOKS_ENV, notebooks_dir

__all__ = ["NOTEBOOKS_ENV", "load_functions", "notebook_function", "notebook_functions", "notebook_path",
           "notebooks_dir"]


def notebook_path(number: str) -> Path:
    """The marimo notebook ``NN_<slug>.py`` of chapter ``number`` (``"09"``)."""
    found = sorted(notebooks_dir().glob(f"{number}_*.py"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"expected one notebook {number}_*.py in {notebooks_dir()}, found {len(found)}; "
            f"the experiments run from the notebooks shipped in infer_lab/notebooks "
            f"(set ${NOTEBOOKS_ENV} to point elsewhere)"
        )
    return found[0]


def _is_app_attr(node: ast.AST, attr: str) -> bool:
    node = node.func if isinstance(node, ast.Call) else node
    return (isinstance(node, ast.Attribute) and node.attr == attr
            and isinstance(node.value, ast.Name) and node.value.id == "app")


def _imports_marimo(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import):
        return any(a.name.split(".")[0] == "marimo" for a in stmt.names)
    return isinstance(stmt, ast.ImportFrom) and (stmt.module or "").split(".")[0] == "marimo"


def load_functions(path: Path) -> dict[str, Callable[..., Any]]:
    """Execute ``path``'s ``with app.setup:`` block and ``@app.function`` definitions; return the functions by name."""
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.With) and any(_is_app_attr(i.context_expr, "setup") for i in node.items):
            body += [s for s in node.body if not _imports_marimo(s)]
        elif isinstance(node, ast.FunctionDef) and any(_is_app_attr(d, "function") for d in node.decorator_list):
            node.decorator_list = [d for d in node.decorator_list if not _is_app_attr(d, "function")]
            body.append(node)
            names.append(node.name)
    namespace: dict[str, Any] = {"__name__": f"infer_lab_notebook_{path.stem}", "__file__": str(path)}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


@functools.cache
def notebook_functions(number: str) -> dict[str, Callable[..., Any]]:
    """The ``@app.function`` experiments of notebook ``number``, executed from its file (cached)."""
    return load_functions(notebook_path(number))


def notebook_function(number: str, name: str) -> Callable[..., Any]:
    """One experiment of notebook ``number`` by name (a clear error when the notebook has none)."""
    functions = notebook_functions(number)
    if name not in functions:
        raise LookupError(f"notebook {number} has no @app.function {name!r}; it has {sorted(functions)}")
    return functions[name]
