"""The Jupyter / Colab notebooks: generated in sync, a setup cell that installs from a clone, a
package file or the repository's address, and a covering set executed headless with every panel
part auto-running (INFER_LAB_AUTORUN=1). Every notebook runs in a real JupyterLab in
tests/test_jupyterlab.py."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lanes import in_lanes, selected
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
JUPYTER = ROOT / "jupyter"


builder = load_script("build_jupyter")
NOTEBOOKS = sorted(JUPYTER.glob("[0-9][0-9]_*.ipynb"))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_the_committed_notebooks_match_the_generator():
    assert builder.main(["--check"]) == 0, "jupyter/ is out of date: run python scripts/build_jupyter.py"


def test_every_chapter_has_a_notebook_with_a_button_per_part():
    from infer_lab.course import chapters

    for mod in chapters():
        path = JUPYTER / f"{mod.NUMBER}_{mod.SLUG}.ipynb"
        assert path.is_file(), path
        code = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "code")
        for key in mod.PARTS:
            assert f'panel.part("{key}")' in code, (path.name, key)
        assert all(not c.get("outputs") for c in _cells(path) if c["cell_type"] == "code")  # committed clean


def test_markdown_f_strings_keep_what_jupyter_can_compute():
    import ast

    def convert(src: str, known: set[str], labels=None):
        return builder.md_source(ast.parse(src, mode="eval").body, known, labels)

    assert convert('"# plain {braces}"', set()) == ("markdown", "# plain {braces}")
    kind, code = convert('f"""A {ch.price()} and {button} and {pick.value:,} and {x}"""', {"ch"},
                         {"button": "", "pick": "context"})
    assert kind == "code" and "{ch.price()}" in code and "*context*" in code and "…" in code
    assert "button" not in code
    assert convert('f"{a} {{literal}}"', {"a"})[1].endswith('{a} {{literal}}\n""")')
    assert convert('f"only {slider.value}"', set(), {"slider": "s"}) == ("markdown", "only *s*")
    # a control shown in the text is marimo's widget: gone, unless it is a guess box (its question stays)
    assert convert('f"{sizes} {switch if gpu else \'\'} {b}"', set(), {"sizes": "", "switch": "save", "b": ""}) \
        == ("markdown", "")
    assert builder.md_source(ast.parse('f"Guess: {guess}"', mode="eval").body, set(), {"guess": "your guess"},
                             {"guess"}) == ("markdown", "Guess: *your guess*")


def test_prose_reads_as_markdown_and_only_computed_paragraphs_stay_code():
    """A JupyterLab learner reads text, not ``jupyter.md(rf\"\"\"...`` source: an f-string's paragraphs that
    compute nothing are markdown cells, a computed one is a code cell whose source is hidden."""
    import ast

    src = 'f"""## 2 · A heading\n\nPlain words, {{literal}} braces.\n\nA number: {sizes.n:,}.\n\n- a list\n  that goes on\n"""'
    cells = builder.prose_cells(builder.md_source(ast.parse(src, mode="eval").body, {"sizes"}))
    assert [kind for kind, _ in cells] == ["markdown", "code", "markdown"]
    assert cells[0][1] == "## 2 · A heading\n\nPlain words, {literal} braces."
    assert "{sizes.n:,}" in cells[1][1] and builder.only_shows_text(cells[1][1])
    assert cells[2][1] == "- a list\n  that goes on"
    # a fenced code block keeps its blank lines; an indented paragraph stays with the one above it
    def split(src: str) -> list[tuple[str, str]]:
        return builder.prose_cells(builder.md_source(ast.parse(src, mode="eval").body, {"x"}))

    assert split('f"""{x}\n\n```\na\n\nb\n```\n"""')[1] == ("markdown", "```\na\n\nb\n```")
    assert [kind for kind, _ in split('f"""Words.\n\n    indented {x}\n"""')] == ["code"]
    # a control removed from the start of a line leaves a space: the words above stay markdown
    assert split('f"""**Predict first:** words.\n\n {x}\n"""') == [
        ("markdown", "**Predict first:** words."), ("code", 'jupyter.md(rf"""\n{x}\n""")')]
    assert [kind for kind, _ in split('f"""- a list item\n\n  continued {x}\n"""')] == ["code"]  # one item
    assert builder.only_shows_text("_trap = ch.trap()\njupyter.md(ch.text(_trap))")  # computed, nothing to change
    # a cell with a knob to change is shown whole, and its code stays visible
    knob = builder.control_line("pick", "3", "context") + "\njupyter.md(rf\"\"\"\n{pick}\n\"\"\")"
    assert builder.prose_cells(("code", knob)) == [("code", knob)] and not builder.only_shows_text(knob)
    assert builder.only_shows_text("lm = panel.lm()\njupyter.md(ch.text(lm))")
    assert not builder.only_shows_text("jupyter.show_figure(ch.figure())")


def test_the_jupyter_edition_never_builds_marimo_controls():
    """nb.size_picker / nb.model_pickers return marimo elements (marimo is absent on Colab, and the
    element renders as nothing in Jupyter): no generated cell calls them or names their labels."""
    for path in NOTEBOOKS:
        for cell in _cells(path):
            text = _source(cell)
            assert not re.search(r"\b(size_picker|model_pickers)\b", text), path.name
            assert "*also save the results" not in text, path.name
            # "…" stands for a placeholder the builder could not compute (a prediction went missing)
            assert not [line for line in text.splitlines() if line.strip() in ("…", "> …")], (path.name, text[:300])


def _setup_cell() -> str:
    return _source(_cells(JUPYTER / "05_capacity_planner.ipynb")[1])


def _run_setup(monkeypatch, cwd: Path, repo_url: str = "") -> list[list[str]]:
    """Run the notebooks' setup cell as if infer_lab were not installed; pip is recorded, not run."""
    import importlib.util as iu

    calls: list[list[str]] = []
    real_find_spec = iu.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "infer_lab" else real_find_spec(name, *args, **kwargs)

    def check_call(cmd, *args, **kwargs):
        calls.append([str(c) for c in cmd])
        return 0

    monkeypatch.setattr(iu, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "check_call", check_call)
    monkeypatch.chdir(cwd)
    path_before = list(sys.path)
    try:
        exec(compile(_setup_cell().replace('REPO_URL = ""', f"REPO_URL = {repo_url!r}"), "setup", "exec"), {})
    finally:
        sys.path[:] = path_before
    return calls


def test_setup_cell_installs_the_clone_it_sits_in(monkeypatch):
    calls = _run_setup(monkeypatch, JUPYTER)
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", "-e", f"{ROOT}[widgets]"]]


def test_setup_cell_installs_from_repo_url_when_there_is_no_clone(monkeypatch, tmp_path):
    calls = _run_setup(monkeypatch, tmp_path, repo_url="https://example.org/owner/infer-lab")
    assert calls == [[sys.executable, "-m", "pip", "install", "-q",
                      "infer-lab[widgets] @ git+https://example.org/owner/infer-lab"]]


def test_setup_cell_installs_a_wheel_beside_it_offline(monkeypatch, tmp_path):
    wheel = tmp_path / "infer_lab-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert _run_setup(monkeypatch, tmp_path) == [[sys.executable, "-m", "pip", "install", "-q", f"{wheel}[widgets]"]]


def test_setup_cell_explains_what_to_do_without_a_clone(monkeypatch, tmp_path):
    with pytest.raises(RuntimeError, match="does not know where to install it from.*REPO_URL"):
        _run_setup(monkeypatch, tmp_path)


def _outputs(nb) -> list[tuple[str, dict]]:
    return [(_source(c), o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


# These execute headless with every panel part pressed as its cell runs (INFER_LAB_AUTORUN=1):
# figures, tables and markdown, the model, and the explorers' defaults. Every notebook, these
# included, also runs in a real JupyterLab (tests/test_jupyterlab.py: Run All, no traceback or
# raw value in its outputs, and one run button pressed per notebook with its figure read back,
# the load generator off the kernel's event loop among them), and test_chapters measures every
# part; running the other notebooks here as well would add a kernel start and its imports each.
PRESSED = {"00_setup", "04_prefill_decode_roofline", "05_capacity_planner", "16_where_next"}
HEADLESS = [p for p in NOTEBOOKS if p.stem in PRESSED]


CELL_TIMEOUT_S = 600  # nbclient's bound on one cell on the quiet 2-core reference machine (scaled)
ELAPSED: dict[str, float] = {}  # notebook name -> seconds its execution took, failed or not


def _execute(path: Path, cell_timeout_s: float = CELL_TIMEOUT_S):
    """Execute one notebook in a fresh kernel; returns the executed notebook, or the exception."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    # the kernel inherits this process's environment, so it is passed per kernel, not set globally
    src = str(ROOT / "src")  # the kernel imports this checkout's infer_lab, installed or not
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env.update(INFER_LAB_AUTORUN="1", INFER_LAB_QUICK="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]))
    client = nbclient.NotebookClient(nb, timeout=math.ceil(cell_timeout_s), kernel_name="python3",
                                     resources={"metadata": {"path": str(JUPYTER)}})
    start = time.monotonic()
    try:
        client.execute(env=env)  # raises CellExecutionError on the first failing cell
    except Exception as exc:  # reported by the notebook's own test
        return exc
    finally:
        ELAPSED[path.name] = time.monotonic() - start
    return nb


@pytest.fixture(scope="module")
def executed(request, slowness) -> dict:
    """The selected notebooks, executed two at a time, each cell's bound scaled to this machine."""
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    run = functools.partial(_execute, cell_timeout_s=slowness.scale(CELL_TIMEOUT_S))
    return in_lanes(run, selected(request, "test_notebook_executes_headless", "path"), name=lambda p: p.name)


@pytest.mark.slow
@pytest.mark.parametrize("path", HEADLESS, ids=[p.stem for p in HEADLESS])
def test_notebook_executes_headless(path, executed, slowness):
    nb = executed[path.name]
    if isinstance(nb, Exception):
        raise AssertionError(f"{path.name} did not execute: {type(nb).__name__}\n" + slowness.explain(
            "executing it (the bound is per cell)", ELAPSED.get(path.name), CELL_TIMEOUT_S)) from nb
    outputs = _outputs(nb)
    assert not [o for _, o in outputs if o.output_type == "error"]
    parts = [s for s in (_source(c) for c in nb.cells if c.cell_type == "code") if s.startswith("panel.part(")]
    assert parts, f"{path.name} has no panel parts"
    for part in parts:  # each part's cell shows its button and, pressed, then what it measured
        shown = [o for s, o in outputs if s == part]
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in shown), part
        assert any(k in o.get("data", {}) for o in shown for k in ("image/png", "text/html", "text/markdown")), part
    text = " ".join(o.get("data", {}).get("text/markdown", "") + o.get("data", {}).get("text/html", "")
                    for _, o in outputs)
    text = re.sub(r"```.*?```|<pre>.*?</pre>", " ", text, flags=re.S)  # the library's real code may say None
    words = text.replace("<", " <").replace(">", "> ").split()
    for raw in ("nan", "NaN", "None"):
        assert raw not in words, f"{path.name} shows {raw!r}"
    streams = " ".join(o.get("text", "") for _, o in outputs if o.output_type == "stream")
    assert "Traceback" not in streams


def test_parts_run_off_a_running_event_loop():
    import asyncio

    from infer_lab.loadgen.runner import off_the_event_loop

    def nested():  # what the load generator does inside a part
        return asyncio.run(asyncio.sleep(0, result="ran"))

    async def in_a_kernel():  # a Jupyter cell runs inside the kernel's event loop
        return off_the_event_loop(nested)

    assert asyncio.run(in_a_kernel()) == "ran"
    assert off_the_event_loop(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        off_the_event_loop(lambda: 1 / 0)


@pytest.mark.parametrize("number", ["03", "07", "13"])
def test_every_visible_display_cell_runs_in_the_jupyter_edition(number, monkeypatch):
    """A marimo cell that only shows a table, figure or words (chapter 07's MLA table, its scorecard and
    its part-7 prediction among them) has a Jupyter cell, and that cell runs after the edition's
    header: the page's controls become variables at their defaults, nothing is left undefined."""
    import matplotlib

    matplotlib.use("Agg")
    from IPython.display import display as ipython_display

    from infer_lab.course import chapter, jupyter

    shown: list = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.extend(objs))
    monkeypatch.setattr(jupyter, "show_figure", lambda fig: shown.append(fig))
    mod = chapter(number)
    built = builder.build(mod)
    assert built.displays, f"chapter {number}'s page has display cells; the edition translated none"
    header = next(text for kind, text in built.cells if kind == "code" and text.startswith("from infer_lab.course import"))
    namespace: dict = {}
    exec(header.replace("\npanel\n", "\n").removesuffix("\npanel"), namespace)
    for text in built.displays:
        before = len(shown)
        exec(text, namespace)
        assert len(shown) > before, f"this cell showed nothing:\n{text}"
    del ipython_display
    if number == "07":  # the three that the edition used to drop
        wanted = {"mla_table", "scorecard_table", "prediction_table"}
        found = {name for name in wanted if any(f"ch07.{name}(" in text for text in built.displays)}
        assert found == wanted


def test_marimo_only_text_leaves_the_space_between_words():
    assert builder.jupyter_text("(k·c + v). <!-- marimo -->Move the slider. <!-- /marimo -->The rest") == \
        "(k·c + v). The rest"
    assert builder.jupyter_text("Last line.\n\n<!-- marimo -->Press it.<!-- /marimo -->") == "Last line."


def test_a_literal_heading_before_computed_text_is_markdown():
    """"## Heading" + computed text: the heading is a markdown cell (in the outline), the text is computed."""
    import ast

    assert builder.literal_first('jupyter.md("## vLLM and SGLang\\n\\n" + ch13.engines_text())') == (
        "## vLLM and SGLang", "jupyter.md(ch13.engines_text())")
    assert builder.literal_first("jupyter.md(ch13.engines_text())") == ("", "jupyter.md(ch13.engines_text())")
    cells = builder.prose_cells(builder.md_source(ast.parse('"## On a GPU\\n\\n" + ch.note()', mode="eval").body, {"ch"}))
    assert cells[0] == ("markdown", "## On a GPU") and cells[1][0] == "code" and "{ch.note()}" in cells[1][1]


def test_an_accordion_title_stays_above_what_it_opens_to():
    """Chapter 12's sampling rule sits in an accordion on the marimo page: the Jupyter edition keeps its title,
    right above the rule's code, before the guess and the button."""
    sources = [(c["cell_type"], _source(c)) for c in _cells(JUPYTER / "12_speculative_decoding.ipynb")]
    title = sources.index(("markdown", "**The sampling rule, verify_sampling (for temperature > 0)**"))
    assert "acceptance_code('sampling')" in sources[title + 1][1]
    assert "button_time(ch12, 'passes')" in sources[title + 2][1]
