"""Notebook 09's page is the experiment: ``serve`` in the notebook runs the engine, the chapter module
only shows it, and changing a number in the notebook's experiment cell changes the result the way
the chapter says it does."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest

from infer_lab.course import ch09_batching as ch09
from infer_lab.course.notebook_code import load_functions, notebook_function, notebook_path
from infer_lab.engine.scheduler import Scheduler

CELL_NUMBER = "    slots = 4  # batch slots (max_num_seqs)"


def test_the_experiment_runs_from_the_notebook_file():
    serve = notebook_function("09", "serve")
    assert inspect.getsourcefile(serve) == str(notebook_path("09"))
    code = inspect.getsource(serve)
    assert "EngineConfig(policy=policy, max_num_seqs=max_num_seqs" in code
    assert "Engine.from_loaded(lm, config)" in code and "engine.step_log" in code
    assert len(code.splitlines()) <= 15
    # the chapter module calls the notebook's function, it does not build engines of its own for it
    assert "notebook_function(NUMBER, \"serve\")" in inspect.getsource(ch09.run_steps)
    assert CELL_NUMBER in notebook_path("09").read_text()


def test_the_loader_runs_setup_and_functions_only(tmp_path):
    path = tmp_path / "99_x.py"
    path.write_text(
        "import marimo\napp = marimo.App()\n\nwith app.setup:\n    import marimo as mo\n    import math\n\n"
        "@app.function\ndef area(r):\n    return math.pi * r * r\n\n"
        "@app.cell\ndef _():\n    raise RuntimeError('cells do not run')\n"
    )
    functions = load_functions(path)
    assert list(functions) == ["area"]
    assert functions["area"](1.0) == pytest.approx(3.14159, rel=1e-5)
    with pytest.raises(LookupError, match="no @app.function 'nope'"):
        notebook_function("09", "nope")


def test_the_page_shows_the_schedulers_real_admission_step():
    shown = ch09.admission_code()
    assert inspect.getsource(Scheduler.admit).strip().splitlines()[0].strip() in shown
    assert 'cfg.policy == "static" and self.running' in shown
    assert len(shown.splitlines()) <= 32  # short enough for a slide


@pytest.fixture(scope="module")
def quick_steps(tour_runs) -> ch09.StepsResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's 4 slots."""
    return tour_runs.part("ch09_batching", "steps")


def test_static_takes_at_least_1_3x_the_steps_at_quick_size(quick_steps):
    result = quick_steps
    assert result.slots == 4
    static, cont = result.runs["static"], result.runs["continuous"]
    tokens = sum(result.output_lens)
    for records in (static, cont):  # each step gives every running request one token
        assert sum(r.num_seqs for r in records) == tokens
        assert sum(r.decode_tokens for r in records) + len(result.output_lens) == tokens
    assert len(static) >= 1.3 * len(cont)
    static_idle = ch09.idle_slot_steps(static) / len(static)
    assert static_idle >= 1.0  # visibly idle: at least one of the 4 slots per step on average
    assert static_idle > 1.5 * ch09.idle_slot_steps(cont) / len(cont)
    text = ch09.steps_text(result.runs, result.slots)
    assert f"**{len(static)} steps**" in text and f"**{len(cont)}**" in text


def _edited_notebook(tmp_path, slots: int):
    """Notebook 09 with its experiment cell's number changed, imported as a module (marimo's own API)."""
    source = notebook_path("09").read_text()
    assert source.count(CELL_NUMBER) == 1
    path = tmp_path / "nb08_edited.py"
    path.write_text(source.replace(CELL_NUMBER, CELL_NUMBER.replace("= 4", f"= {slots}")))
    spec = importlib.util.spec_from_file_location("nb08_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb08_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb08_edited", None)
    return module


@pytest.mark.slow
def test_changing_the_slots_in_the_cell_changes_the_result_as_the_chapter_says(embedded, tmp_path, quick_steps):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    sizes = ch09.sizes("cpu", "quick")
    cell = _edited_notebook(tmp_path, sizes.steps_requests).static_vs_continuous  # slots = 16
    _, defs = cell.run(ch09=ch09, lm=embedded, mo=mo, nb=nb, sizes=sizes, steps_button=SimpleNamespace(value=True))
    steps = {policy: len(records) for policy, records in defs["runs"].items()}
    before = {policy: len(records) for policy, records in quick_steps.runs.items()}  # the cell's 4 slots
    assert before["static"] >= 1.3 * before["continuous"]
    # as many slots as requests: everyone is admitted in the first step, the gap disappears, and
    # both take as many steps as the longest answer has tokens
    assert steps["static"] == steps["continuous"] == max(quick_steps.output_lens) < before["static"]
    assert all(r.idle_slots == sizes.steps_requests - r.num_seqs for r in defs["runs"]["static"])


BATCHING_CELL = "    concurrency = sizes.concurrency  # batch slots for every contender"


def test_the_contenders_run_from_the_notebook_file():
    contenders = notebook_function("09", "contenders")
    assert inspect.getsourcefile(contenders) == str(notebook_path("09"))
    code = inspect.getsource(contenders)
    assert "baselines.run_contender(kind, lm, requests, concurrency)" in code  # the transformers baselines
    assert 'for policy in ("static", "continuous")' in code and "timed_engine_run(lm, config" in code
    assert len(code.splitlines()) <= 15
    assert 'notebook_function(NUMBER, "contenders")' in inspect.getsource(ch09.run_batching)
    source = notebook_path("09").read_text()
    assert BATCHING_CELL in source and "contenders(lm, _prompts, _output_lens, concurrency)" in source
    assert "ch09.measure" not in source and not hasattr(ch09, "measure_batching")


def test_every_contender_serves_the_same_tokens_as_the_engine(tour_runs):
    """The notebook's contenders at quick size (the tour's run): every transformers baseline and
    the static engine produce the continuous engine's tokens, request by request."""
    result = tour_runs.part("ch09_batching", "batching")
    names = [r.name for r in result.rows]
    assert names[-2:] == ["static batching (engine)", ch09.ENGINE_CONTINUOUS] and len(names) >= 5
    assert all(r.identical for r in result.rows), [(r.name, r.identical) for r in result.rows]
    static, cont = result.row("static batching (engine)"), result.row(ch09.ENGINE_CONTINUOUS)
    assert static.steps >= cont.steps  # static never takes fewer steps than continuous on the same requests
