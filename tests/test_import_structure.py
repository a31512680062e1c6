"""Imports sit at the top of a module unless they defer a heavy or optional library.

An import inside a function says why on its own (first) line, with one of:

    # defers torch            a heavy library, or an internal module that imports one, kept off a
                              light import path (``infer-lab --help``, ``import infer_lab.engine``)
    # optional: gguf          a library that may not be installed (the GPU image lacks marimo, gguf,
                              bitsandbytes; fastapi, httpx, uvicorn are the [serve] extra)
    # import cycle: X imports this module

A standard-library import never needs deferring, except where STDLIB_KEPT_OFF_HELP says so.
Marimo notebooks (``notebooks/``) are exempt: their cells are functions, and import inside them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "infer_lab"
EXEMPT = ("notebooks/",)

# Files or folders whose in-function imports are not checked yet (empty: every module is swept).
# test_not_yet_swept_entries_still_need_their_place says when an entry can go.
NOT_YET_SWEPT: tuple[str, ...] = ()

# Standard-library imports that stay inside a function: every command module is imported by
# `infer-lab --help`, and these would add measurable time to it (importlib.metadata ~9 ms,
# subprocess ~2 ms on the course's machine) for one command's use.
STDLIB_KEPT_OFF_HELP = {
    ("commands/env.py", "importlib"),
    ("commands/bench.py", "subprocess"),
}

REASON = re.compile(r"#\s*(defers\s+\S|optional:\s*\S|import cycle:\s*\S)")


def _relpath(path: Path) -> str:
    return path.relative_to(PACKAGE_DIR).as_posix()


def _skipped(rel: str, prefixes) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in prefixes)


def _function_imports(path: Path):
    """(line number, top-level module or None for a relative import, line text) of each import
    inside a function body of ``path``."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    seen = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in seen:
                continue
            seen.add(node.lineno)
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            else:
                tops = [None if node.level else node.module.split(".")[0]]
            for top in tops:
                yield node.lineno, top, lines[node.lineno - 1]


def _violations(path: Path) -> list[str]:
    rel = _relpath(path)
    out = []
    for lineno, top, line in _function_imports(path):
        where = f"{rel}:{lineno}: {line.strip()}"
        if top in sys.stdlib_module_names and (rel, top) not in STDLIB_KEPT_OFF_HELP:
            out.append(f"{where}  <- standard library: import it at the top of the file")
        elif not REASON.search(line):
            out.append(f"{where}  <- move it to the top, or say why not (# defers / # optional: / "
                       f"# import cycle:)")
    return out


def _modules(prefixes):
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = _relpath(path)
        if not _skipped(rel, EXEMPT) and not _skipped(rel, prefixes):
            yield path


def test_imports_inside_functions_defer_something_and_say_what():
    problems = [v for path in _modules(NOT_YET_SWEPT) for v in _violations(path)]
    assert not problems, "imports inside functions:\n" + "\n".join(problems)


def test_the_stdlib_exceptions_are_still_needed():
    """An entry of STDLIB_KEPT_OFF_HELP whose import moved to the top (or went) is stale."""
    found = {(_relpath(p), top) for p in _modules(()) for _, top, _ in _function_imports(p)}
    assert STDLIB_KEPT_OFF_HELP <= found, sorted(STDLIB_KEPT_OFF_HELP - found)


def test_not_yet_swept_entries_still_need_their_place():
    """Once a listed file or folder follows the rule, its entry goes (the list only shrinks)."""
    clean = []
    for entry in NOT_YET_SWEPT:
        target = PACKAGE_DIR / entry
        paths = sorted(target.rglob("*.py")) if entry.endswith("/") else [target]
        paths = [p for p in paths if p.exists()]
        if not any(_violations(p) for p in paths):
            clean.append(entry)
    assert not clean, f"remove from NOT_YET_SWEPT (swept, moved or gone): {clean}"


@pytest.mark.parametrize("line, ok", [
    ("    import torch  # defers torch", True),
    ("    from .linear import X  # import cycle: linear imports this module", True),
    ("        import psutil  # optional: psutil", True),
    ("    import torch", False),
    ("    import torch  # noqa: F401", False),
    ("    import torch  # optional:", False),
])
def test_the_reason_comment(line, ok):
    assert bool(REASON.search(line)) is ok


def test_the_cli_and_the_analysis_import_no_heavy_library():
    """`infer-lab --help` imports every command module and builds every parser: none of that may
    load torch, transformers, matplotlib, marimo or pandas (commands import them when they run)."""
    code = (
        "import sys\n"
        "import infer_lab.analysis, infer_lab.catalog, infer_lab.units\n"
        "from infer_lab.cli import build_parser\n"
        "build_parser()\n"
        "heavy = ['torch', 'transformers', 'matplotlib', 'marimo', 'pandas', 'infer_lab.engine',\n"
        "         'infer_lab.models', 'infer_lab.course']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(PACKAGE_DIR.parent), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported by --help: {done.stdout.strip()}"
