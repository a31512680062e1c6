"""Notebook 09's page is the experiment: ``serve`` in the notebook runs the engine, the chapter module
only shows it, and changing a number in the notebook's experiment cell changes the result the way
the chapter says it does."""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace

import pytest
from page_helpers import (
    RecordingEngine,
    edited_notebook,
    experiment_calls,
    shows_the_real_code,
)

from infer_lab.course import ch09_batching as ch09
from infer_lab.course.notebook_code import load_functions, notebook_function
from infer_lab.engine.scheduler import Scheduler


def _part(name: str):
    """The chapter package's module for one part (``steps``, ``batching``, ...): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch09.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch, embedded):
    sizes = ch09.sizes("cpu", "quick")
    (name, args), = experiment_calls(monkeypatch, _part("steps"), ch09.run_steps, embedded, sizes, stop_at="serve")
    assert name == "serve" and args["lm"] is embedded and args["policy"] == "static"
    assert args["max_num_seqs"] == sizes.steps_slots  # the number the notebook's cell starts at
    prompts, output_lens = ch09.steps_requests(embedded, sizes)
    assert args["prompts"] == prompts and list(args["output_lens"]) == list(output_lens)
    (_, args), = experiment_calls(monkeypatch, _part("steps"), ch09.run_steps, embedded, sizes, 3, stop_at="serve")
    assert args["max_num_seqs"] == 3  # the slots asked for, not the default
    (name, args), = experiment_calls(monkeypatch, _part("batching"), ch09.run_batching, embedded, sizes, stop_at="contenders")
    assert name == "contenders" and args["max_num_seqs"] == sizes.max_num_seqs
    assert (args["prompts"], args["output_lens"]) == ch09.batching_requests(embedded, sizes)
    (_, args), = experiment_calls(monkeypatch, _part("batching"), ch09.run_batching, embedded, sizes, 2, stop_at="contenders")
    assert args["max_num_seqs"] == 2
    assert not hasattr(ch09, "measure_batching")  # the old wrapper is gone


def test_serve_hands_the_policy_and_slots_to_the_engine(monkeypatch):
    serve = notebook_function("09", "serve")
    monkeypatch.setattr(RecordingEngine, "made", [])
    monkeypatch.setitem(serve.__globals__, "Engine", RecordingEngine)
    prompts, output_lens = [[1, 2, 3], [4, 5]], [2, 5]
    for policy, slots in (("static", 1), ("continuous", 2)):
        assert serve(None, prompts, output_lens, policy, max_num_seqs=slots) == ["step"]  # the engine's step log
        config = RecordingEngine.made[-1].config
        assert (config.policy, config.max_num_seqs) == (policy, slots)
        assert config.max_model_len >= 3 + 5  # room for the longest prompt and the longest answer
        call, = RecordingEngine.made[-1].generated
        assert call["prompts"] == prompts and [p.max_tokens for p in call["params"]] == output_lens


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
    shows_the_real_code(shown, Scheduler.admit)
    assert len(shown.splitlines()) <= 32  # short enough for a slide


@pytest.fixture(scope="module")
def quick_steps(tour_runs) -> ch09.StepsResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's slots (``sizes.steps_slots``)."""
    return tour_runs.part("ch09_batching", "steps")


def test_static_takes_at_least_1_3x_the_steps_at_quick_size(quick_steps):
    result = quick_steps
    assert result.slots == ch09.sizes("cpu", "quick").steps_slots  # the number the notebook's cell starts at
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


@pytest.mark.slow
def test_changing_the_slots_in_the_cell_changes_the_result_as_the_chapter_says(embedded, tmp_path, quick_steps):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch09.sizes("cpu", "quick")
    edited = edited_notebook("09", tmp_path, slots=sizes.steps_requests)
    output, defs = edited.static_vs_continuous.run(ch09=ch09, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                   steps_button=SimpleNamespace(value=True))
    steps = {policy: len(records) for policy, records in defs["runs"].items()}
    before = {policy: len(records) for policy, records in quick_steps.runs.items()}  # the cell's own slots
    # the page reports the edited number, not the one it started with
    shown = output.text  # the cell's words as the page renders them (markdown bold: <strong>)
    assert f"<strong>{sizes.steps_requests} slots</strong>" in shown and f"<strong>{sizes.steps_slots} slots" not in shown
    assert before["static"] >= 1.3 * before["continuous"]
    # as many slots as requests: everyone is admitted in the first step, the gap disappears, and
    # both take as many steps as the longest answer has tokens
    assert steps["static"] == steps["continuous"] == max(quick_steps.output_lens) < before["static"]
    assert all(r.idle_slots == sizes.steps_requests - r.num_seqs for r in defs["runs"]["static"])


@pytest.mark.slow
def test_the_slots_have_one_home_that_the_cell_and_the_chapter_both_read(embedded, tmp_path):
    """``sizes.steps_slots`` is the only place the step-by-step part's slots are written: the
    notebook's cell and the chapter's run both follow it when it changes."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = dataclasses.replace(ch09.sizes("cpu", "quick"), steps_slots=2, steps_requests=6, steps_max_output=8)
    chapter = ch09.run_steps(embedded, sizes)
    page = edited_notebook("09", tmp_path)  # the notebook as it is
    output, defs = page.static_vs_continuous.run(ch09=ch09, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                 steps_button=SimpleNamespace(value=True))
    assert chapter.slots == 2 and "<strong>2 slots</strong>" in output.text
    assert {p: len(r) for p, r in defs["runs"].items()} == {p: len(r) for p, r in chapter.runs.items()}
    assert max(r.num_seqs for r in chapter.runs["continuous"]) == 2


def test_every_contender_serves_the_same_tokens_as_the_engine(tour_runs):
    """The notebook's contenders at quick size (the tour's run): every transformers baseline and
    the static engine produce the continuous engine's tokens, request by request."""
    result = tour_runs.part("ch09_batching", "batching")
    names = [r.name for r in result.rows]
    assert names[-2:] == ["static batching (engine)", ch09.ENGINE_CONTINUOUS] and len(names) >= 5
    assert all(r.identical for r in result.rows), [(r.name, r.identical) for r in result.rows]
    static, cont = result.row("static batching (engine)"), result.row(ch09.ENGINE_CONTINUOUS)
    assert static.steps >= cont.steps  # static never takes fewer steps than continuous on the same requests


def test_the_quick_sweep_draws_a_curve_not_a_segment(tour_runs):
    """The frontier section measures more than two levels of max_num_seqs even at quick size (a CPU's run)."""
    sweep = tour_runs.part("ch09_batching", "sweep")
    quick = ch09.sizes("cpu", "quick")
    assert [p.max_num_seqs for p in sweep] == list(quick.sweep_max_num_seqs) and len(sweep) >= 3
    text = ch09.sweep_text(sweep)
    first, *_, last = quick.sweep_max_num_seqs
    assert "not yet a curve" not in text and f"From {first} to {last} requests at once," in text
