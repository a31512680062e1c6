"""Layers run one way: no import cycles, the library never imports the course, the engine stays light.

The graph is read from the source with :mod:`ast` (every ``import`` statement, including the ones
inside functions, which run later but still make one module depend on another), so the test sees
the dependencies a reader of the files sees, not only the ones the interpreter happened to hit.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "src" / "infer_lab"

# Front ends that present the course: they may import it (and the course must not import them).
# The notebook helpers, the tour and the slides sit under ``course/`` but are its top layer.
FRONT_ENDS = ("infer_lab.course.nb", "infer_lab.course.tour", "infer_lab.course.slides", "infer_lab.commands",
              "infer_lab.cli", "infer_lab.__main__",
              "infer_lab.notebooks")  # the marimo pages: package data, the course's top layer
# What measures or loads a model: nothing in analysis (computed from configs only) imports these.
MEASURING = ("infer_lab.harness", "infer_lab.hardware", "infer_lab.models", "infer_lab.evaluation",
             "infer_lab.bench", "infer_lab.server", "infer_lab.loadgen")


def _modules(root: Path = PACKAGE_DIR) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _targets(module: str, is_pkg: bool, node: ast.AST, known: dict) -> list[str]:
    """The infer_lab modules one import statement names (``from pkg import sub`` names ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")[: None if is_pkg else -1]
            base = base[: len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in known else pkg for a in node.names]
    else:
        return []
    out = []
    for name in names:
        if name != "infer_lab" and not name.startswith("infer_lab."):
            continue
        while name not in known and "." in name:  # `import infer_lab.x.y.attr` -> the module
            name = name.rsplit(".", 1)[0]
        out.append(name)
    return out


def import_graph(root: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    """Each infer_lab module -> the infer_lab modules it imports anywhere in its file."""
    known = _modules(root)
    graph = {}
    for module, (path, is_pkg) in known.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            deps.update(_targets(module, is_pkg, node, known))
        deps.discard(module)
        graph[module] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _under(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_reader_sees_relative_absolute_and_function_local_imports(tmp_path):
    pkg = tmp_path / "infer_lab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import thing\n")
    (pkg / "c.py").write_text("import infer_lab.a\n")
    g = import_graph(pkg)
    assert g["infer_lab.a"] == {"infer_lab.sub.b"}
    assert g["infer_lab.sub.b"] == {"infer_lab.c"}
    assert g["infer_lab.c"] == {"infer_lab.a"}
    assert find_cycles(g) == [["infer_lab.a", "infer_lab.c", "infer_lab.sub.b"]]


def test_no_import_cycles(graph):
    assert len(graph) > 100  # the whole package was read
    assert find_cycles(graph) == []


def test_nothing_below_the_course_imports_it(graph):
    offenders = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if not _under(m, ("infer_lab.course", *FRONT_ENDS))
        for d in deps
        if _under(d, "infer_lab.course")
    )
    assert offenders == []


def test_the_course_does_not_import_its_front_ends(graph):
    offenders = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if _under(m, "infer_lab.course") and not _under(m, FRONT_ENDS)
        for d in deps
        if _under(d, FRONT_ENDS)
    )
    assert offenders == []


def test_analysis_computes_from_configs_only(graph):
    offenders = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if _under(m, "infer_lab.analysis")
        for d in deps
        if _under(d, MEASURING)
    )
    assert offenders == []


def test_quant_lazy_names_match_its_all():
    import infer_lab.quant as quant

    assert sorted(quant._WHERE) == sorted(quant.__all__)
    for name in quant.__all__:
        assert getattr(quant, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        quant.nope  # noqa: B018


def test_importing_the_engine_stays_light():
    code = (
        "import sys, infer_lab.engine\n"
        "heavy = ['infer_lab.harness', 'infer_lab.evaluation', 'infer_lab.models', "
        "'infer_lab.quant.comparison', 'infer_lab.course', 'transformers', 'marimo', 'matplotlib']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    src = str(PACKAGE_DIR.parent)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
