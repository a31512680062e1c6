"""Every notebook opens cleanly in a real browser, as a learner meets it with `make workshop`.

One ``marimo edit --headless`` server for the notebooks' folder with the command line of ``make workshop``
(scripts/workshop.py; at INFER_LAB_QUICK=1) and one headless Chromium; the course index and
each notebook open in their own page (two at a time), without pressing anything, and must
settle within a minute (times the run's slowness factor, tests/machine_speed.py) with no error
output, their title shown and at least one computed output; each page is closed once read. Through that pass, the server and its kernels together
must stay under 4 GiB resident (marimo's ``--session-ttl`` ends a kernel when its page closes). The checks are those
of scripts/screenshot_notebooks.py: run it to see the screenshots when a test here fails.
Skipped when chromium or playwright is missing (`make test` installs chromium when it can),
except under CI=true, where a missing browser fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from script_module import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "screenshot_notebooks.py"
SETTLE_TIMEOUT_S = 60  # per notebook on the quiet 2-core reference machine; scaled by the slowness factor
SERVER_START_S = 60  # likewise, for marimo's server to answer
PARALLEL = 2  # notebooks open at once: one kernel each, CI has two cores
TITLE_WITHIN_CELLS = 3
COMPUTED_WITHIN_CELLS = 6
PASS_MEMORY_LIMIT_BYTES = 4 * 2**30  # the server and all its kernels, through a whole pass
PASS_MEMORY: dict[str, int] = {}  # filled by the reports fixture


tool = load_script("screenshot_notebooks")
NOTEBOOKS = tool.find_notebooks()

BROKEN_NOTEBOOK = '''
import marimo

app = marimo.App()


@app.cell
def _():
    import sys

    import marimo as mo
    return mo, sys


@app.cell
def _(mo):
    mo.md("# A notebook that goes wrong")
    return


@app.cell
def _():
    1 / 0
    return


@app.cell
def _(mo):
    mo.stop(True)
    stopped = 1
    return (stopped,)


@app.cell
def _(stopped):
    stopped + 1
    return


@app.cell
def _(sys):
    print("Loading weights: 100%|##########| 3/3", file=sys.stderr)
    6 * 7
    return


@app.cell
def _(mo):
    mo.callout(mo.md("cannot be loaded here"), kind="danger")
    return
'''


def _skip_without_browser() -> None:
    """Skip on a developer's machine without the browser; under CI=true its absence is a failure."""
    missing = tool.browser_missing()
    if missing and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the browser check, but {missing}")
    if missing:
        pytest.skip(f"browser check not run: {missing}")


@pytest.fixture(scope="module")
def chromium_context():
    _skip_without_browser()
    with tool.chromium() as context:
        yield context


@pytest.fixture(scope="module")
def reports(request, chromium_context, slowness):
    """The selected notebooks, opened through one ``marimo edit`` server, two at a time."""
    selected = [item.callspec.params["path"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_notebook_opens_cleanly_in_the_browser"]
    selected = selected or NOTEBOOKS  # the memory test alone: the whole pass
    with tool.marimo_server(quick=True, startup_s=slowness.scale(SERVER_START_S)) as server, \
            tool.PeakMemory(server.process.pid) as memory:
        found = {report.name: report for report in tool.visit_notebooks(
            chromium_context, server, selected, timeout_s=slowness.scale(SETTLE_TIMEOUT_S), parallel=PARALLEL)}
    PASS_MEMORY["peak_bytes"], PASS_MEMORY["samples"] = memory.peak_bytes, memory.samples
    PASS_MEMORY["notebooks"] = len(found)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_opens_cleanly_in_the_browser(path, reports, slowness):
    report = reports[path.name]
    rerun = (f"\n{slowness.explain('opening it until the kernel settled', report.seconds, SETTLE_TIMEOUT_S)}"
             f"\n(see it: python scripts/screenshot_notebooks.py {path.name[:2]})")
    assert not report.problems(), report.summary() + rerun
    assert any(c.headings for c in report.cells[:TITLE_WITHIN_CELLS]), (
        f"no title (# heading) in the first {TITLE_WITHIN_CELLS} cells\n" + report.summary() + rerun)
    assert any(c.computed for c in report.cells[:COMPUTED_WITHIN_CELLS]), (
        f"no computed output in the first {COMPUTED_WITHIN_CELLS} cells before any button\n"
        + report.summary() + rerun)


@pytest.mark.slow
def test_browser_check_sees_what_goes_wrong(tmp_path, chromium_context, slowness):
    """The detector itself: a notebook with an exception, a stopped ancestor, stderr and a red
    callout is reported with each of them, and its good outputs are still found."""
    (tmp_path / "pyproject.toml").write_text("[tool.marimo.runtime]\nauto_instantiate = true\n")
    notebook = tmp_path / "99_broken.py"
    notebook.write_text(BROKEN_NOTEBOOK)
    with tool.marimo_server(tmp_path, startup_s=slowness.scale(SERVER_START_S)) as server:
        report = tool.open_notebook(chromium_context, server, notebook, timeout_s=slowness.scale(SETTLE_TIMEOUT_S))
    assert report.ran and not report.timed_out, (
        report.summary() + "\n" + slowness.explain("opening it until the kernel settled", report.seconds,
                                                    SETTLE_TIMEOUT_S))
    problems = "\n".join(report.problems())
    for expected in ("ZeroDivisionError", "Ancestor stopped", "stderr box: Loading weights",
                     "red callout: cannot be loaded here"):
        assert expected in problems, f"{expected!r} not reported:\n{report.summary()}"
    assert report.cells[1].headings == ["A notebook that goes wrong"]
    assert any(c.computed and "42" in c.text for c in report.cells), report.summary()


@pytest.mark.slow
def test_a_pass_through_the_course_stays_under_4_gib(reports):
    """Every notebook opened and its page closed, through the ``make workshop`` server: the peak
    resident memory of the server plus its kernels stays under 4 GiB (kernels do not pile up)."""
    if PASS_MEMORY["notebooks"] < len(NOTEBOOKS):
        pytest.skip(f"only {PASS_MEMORY['notebooks']} of {len(NOTEBOOKS)} notebooks were selected")
    assert PASS_MEMORY["samples"] > 3, PASS_MEMORY
    peak = PASS_MEMORY["peak_bytes"]
    print(f"peak RSS of the marimo server and its kernels over {len(reports)} notebooks: {peak / 2**30:.2f} GiB")
    assert 0 < peak < PASS_MEMORY_LIMIT_BYTES, f"peak {peak / 2**30:.2f} GiB over {len(reports)} notebooks"


def test_workshop_serves_with_a_session_ttl_and_opens_the_index():
    """`make workshop` runs scripts/workshop.py, whose marimo command line ends kernels on tab close
    and whose browser address is the course index (which exists)."""
    workshop = tool._workshop()
    makefile = (SCRIPT.parents[1] / "Makefile").read_text()
    recipe = makefile.split("\nworkshop:", 1)[1].split("\n\n", 1)[0]
    assert "scripts/workshop.py" in recipe
    command = workshop.marimo_command(2718, token="secret")
    assert command[command.index("--session-ttl") + 1] == str(workshop.SESSION_TTL_S)
    assert 0 <= workshop.SESSION_TTL_S <= 30
    assert command[-1] == str(workshop.NOTEBOOKS) and "edit" in command
    url = workshop.index_url(2718, "secret")
    assert url.endswith("?file=index.py&access_token=secret")
    assert (workshop.NOTEBOOKS / workshop.INDEX).is_file()
