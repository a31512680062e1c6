"""The Jupyter edition in a real JupyterLab: one button pressed per notebook, its figure read back.

A learner saw button figures come out blank or cut off in JupyterLab (a kernel thread closed the
pyplot figure while the button's callback saved it); headless execution never takes that path.
Here one JupyterLab (from the package index) serves jupyter/, and Debian's chromium opens each
notebook, runs all its cells, presses one run button and inspects the PNG the page shows
(scripts/jupyterlab_buttons.py, which prints the same findings). Skipped when jupyterlab,
playwright or chromium is missing, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import os

import pytest
from script_module import load_script

tool = load_script("jupyterlab_buttons")
NOTEBOOKS = tool.find_notebooks()
WAIT_S = 120  # each wait (Run All, the button's part) on the quiet 2-core reference machine; scaled
SERVER_START_S = 90  # likewise, for JupyterLab to answer


def _skip_without_jupyterlab() -> None:
    missing = tool.jupyterlab_missing()
    if missing and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the JupyterLab check, but {missing}")
    if missing:
        pytest.skip(f"JupyterLab check not run: {missing}")


@pytest.fixture(scope="module")
def lab_pass(request, slowness):
    """The selected notebooks, each opened, run and its button pressed, two JupyterLab pages at a time."""
    _skip_without_jupyterlab()
    selected = [item.callspec.params["path"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_a_button_draws_its_figure_in_jupyterlab"]
    return tool.check_notebooks(selected or NOTEBOOKS, timeout_s=slowness.scale(WAIT_S),
                                startup_s=slowness.scale(SERVER_START_S))


def test_every_notebook_has_a_button_that_draws_a_figure():
    """The table of pressed parts covers every notebook and names a part the chapter has."""
    assert {p.name[:2] for p in NOTEBOOKS} == set(tool.BUTTONS)
    for path in NOTEBOOKS:
        key, label = tool.button_label(path)
        assert label and key in tool.BUTTONS.values()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_button_draws_its_figure_in_jupyterlab(path, lab_pass, slowness):
    report = next(r for r in lab_pass.reports if r.notebook == path.name)
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in report.phases.items())
    assert not report.problems(), (report.summary() + "\n" + slowness.explain(
        f"pressing its button ({phases or 'no phase finished'})", report.seconds, WAIT_S)
        + f"\n(see it: python scripts/jupyterlab_buttons.py {path.name[:2]} --out shots)")
    assert " s at quick sizes" in report.status
    assert report.run_all["outputs"] >= 3  # the scan for tracebacks and raw values read the outputs


@pytest.mark.slow
def test_closing_a_notebook_shuts_its_kernel_down_and_leaves_the_checkout_clean(lab_pass):
    print(f"JupyterLab pass: {len(lab_pass.reports)} notebooks in {lab_pass.seconds:.0f} s; the server "
          f"and its kernels peaked at {lab_pass.peak_bytes / 2**30:.2f} GiB")
    assert lab_pass.kernels_left == 0
    assert lab_pass.files_written == []  # no checkpoints or workspaces left in the checkout
    assert 0 < lab_pass.peak_bytes < 4 * 2**30


def _png(draw) -> bytes:
    from infer_lab.figures import subplots

    fig, ax = subplots(figsize=(4, 3))
    draw(fig, ax)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    return buf.getvalue()


def test_the_check_finds_blank_half_drawn_and_cut_off_figures_and_raw_outputs():
    """The detector itself, in chromium: a real plot passes; a blank figure, one drawn only in its
    left half and a truncated PNG (the browser shows its top rows) are each reported, and so are a
    traceback and raw "None" / "nan" in a notebook's outputs (but not a None inside code)."""
    browser = importlib.util.find_spec("playwright") is not None and tool._marimo_browser().browser_missing() is None
    if not browser:
        _skip_without_jupyterlab()
        pytest.skip("chromium or playwright is missing")

    def plot(fig, ax):
        ax.plot([0, 1, 2, 3], [1, 3, 2, 4], marker="o")
        ax.set_title("a figure")
        ax.set_xlabel("x")

    def blank(fig, ax):
        ax.set_axis_off()

    def left_half(fig, ax):
        ax.set_axis_off()
        fig.patches.append(__import__("matplotlib").patches.Rectangle(
            (0.05, 0.1), 0.3, 0.8, transform=fig.transFigure, color="tab:blue"))

    good = _png(plot)
    images = {"plot": good, "blank": _png(blank), "left": _png(left_half), "cut": good[: len(good) // 3]}
    html = "".join(f'<img id="{k}" src="data:image/png;base64,{base64.b64encode(v).decode()}">'
                   for k, v in images.items())
    outputs = ('<div class="jp-OutputArea-output" data-mime-type="text/markdown"><p>ratio None, or nan</p>'
               '<pre>x = None</pre></div>'
               '<div class="jp-OutputArea-output" data-mime-type="application/vnd.jupyter.stderr">'
               'ZeroDivisionError  Traceback (most recent call last)</div>'
               '<div class="jp-OutputArea-output" data-mime-type="text/html"><p>all fine: 3 tokens</p></div>')
    with tool._marimo_browser().chromium() as context:
        page = context.new_page()
        page.set_content(html + f'<div id="nb">{outputs}</div>')
        page.wait_for_function("() => [...document.images].every(i => i.complete)")
        found = {k: page.evaluate(f"() => ({tool.INK_JS})(document.getElementById('{k}'))") for k in images}
        # a stand-in for JupyterLab's shell, holding one "notebook": the outputs above
        page.evaluate("() => { window.jupyterapp = {shell: {widgets: () => "
                      "[{id: 'nb', node: document.getElementById('nb')}]}}; }")
        run_all = page.evaluate(tool._OUTPUTS_JS, "nb")

    def problems(key: str) -> str:
        report = tool.ButtonReport(notebook="x.ipynb", part="p", label="l", status="1.0 s at quick sizes",
                                   images=[found[key]])
        return "\n".join(report.problems())

    assert problems("plot") == "", found["plot"]
    assert "blank" in problems("blank")
    assert "only part of its area" in problems("left")
    assert "only part of its area" in problems("cut")  # chromium draws the rows it could decode
    assert run_all["outputs"] == 3 and sorted(run_all["raw_words"]) == ["None", "nan"]  # not the code's None
    assert len(run_all["tracebacks"]) == 1
    report = tool.ButtonReport("x", "p", "l", status="1 s at quick sizes", images=[found["plot"]], run_all=run_all)
    assert "Run All left a traceback" in "\n".join(report.problems())
    assert "raw values: " in "\n".join(report.problems())
    assert "no figure appeared" in "\n".join(tool.ButtonReport("x", "p", "l", status="1 s at quick sizes").problems())
    assert "the part failed" in "\n".join(tool.ButtonReport("x", "p", "l", status="failed: ValueError").problems())
