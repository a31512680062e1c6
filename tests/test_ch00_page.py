"""Notebook 00's page is the experiment: ``ceilings_here`` and ``ask`` are ``@app.function`` s of the
notebook calling ``hardware.measure_ceilings`` and the harness; the chapter module runs the same
functions (its hello answer is checked in tests/test_course_ch00_to_04.py)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from page_helpers import cell_line, experiment_calls

from infer_lab.course import ch00_setup as ch00
from infer_lab.course.notebook_code import notebook_function, notebook_path


def test_the_experiments_are_short_functions_of_the_notebook_file():
    for name in ("ceilings_here", "ask"):
        function = notebook_function("00", name)
        assert function.__code__.co_filename == str(notebook_path("00"))
        assert len(inspect.getsourcelines(function)[0]) <= 15, name
    assert cell_line("00", "    question = ") and cell_line("00", "    quick = ")  # the learner's knobs, one line each


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch):
    sizes = ch00.sizes("cpu", "quick")
    calls = experiment_calls(monkeypatch, ch00, ch00.run_ceilings, "cpu", sizes, stop_at="ceilings_here")
    assert calls == [("ceilings_here", {"device": "cpu", "quick": sizes.quick_ceilings})]
    lm = SimpleNamespace(name="stub-lm")
    calls = experiment_calls(monkeypatch, ch00, ch00.run_hello, lm, sizes, stop_at="ask")
    assert calls == [("ask", {"lm": lm, "question": ch00.QUESTION, "max_tokens": sizes.hello_max_tokens})]


def test_the_experiments_return_what_the_harness_measured(monkeypatch):
    """``ceilings_here`` hands back ``measure_ceilings``'s measurement, measured afresh; ``ask`` generates
    through ``timed_generate`` (stubbed where the notebook's functions look them up)."""
    ceilings_here, ask = notebook_function("00", "ceilings_here"), notebook_function("00", "ask")
    measured, seen = object(), {}

    def measure_ceilings(device, **options):
        seen["ceilings"] = (device, options)
        return measured

    monkeypatch.setitem(ceilings_here.__globals__, "measure_ceilings", measure_ceilings)
    assert ceilings_here("cpu", quick=True) is measured
    assert seen["ceilings"][0] == "cpu" and seen["ceilings"][1].get("quick") is True
    assert seen["ceilings"][1].get("fresh") is True  # every press measures again

    rec = SimpleNamespace(token_ids=[[5, 6, 7]])

    def timed_generate(lm, prompt, max_tokens, *rest, **options):
        seen["generate"] = (lm, prompt, max_tokens)
        return rec

    monkeypatch.setitem(ask.__globals__, "timed_generate", timed_generate)
    random_weights = SimpleNamespace(tokenizer=None, random_ids=lambda batch, n: [list(range(n))] * batch)
    assert ask(random_weights, "What?", 4) == (None, rec)
    assert seen["generate"] == (random_weights, [list(range(16))], 4)  # no tokenizer: 16 random ids
