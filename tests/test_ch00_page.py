"""Notebook 00's page is the experiment: ``ceilings_here`` and ``ask`` are ``@app.function`` s of the
notebook calling ``hardware.measure_ceilings`` and the harness; the chapter module runs the same
functions (its hello answer is checked in tests/test_course_ch00_to_04.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from page_helpers import cell_call, experiment_calls

from infer_lab.course import ch00_setup as ch00
from infer_lab.course.notebook_code import notebook_function


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


def test_the_cells_knobs_reach_the_experiments(tmp_path):
    """A learner's question and ``quick`` setting, changed in their cells, are what ``ask`` and
    ``ceilings_here`` get (the cells run through marimo, each experiment stood in for)."""
    pytest.importorskip("marimo")
    import marimo as mo

    sizes, lm = ch00.sizes("cpu", "quick"), SimpleNamespace(name="stub-lm")
    page = SimpleNamespace(pressed=lambda _button: True, placeholder=lambda _button: None,
                           load_model_or_explain=lambda *_args: lm, model_choice=lambda: ("smollm2-135m", "pretrained"))
    pressed = SimpleNamespace(value=True)
    asked = cell_call("00", tmp_path, "ask", dict(ch00=ch00, hello_button=pressed, mo=mo, nb=page, sizes=sizes),
                      "question", question="Why is the sky blue?")
    assert asked == {"lm": lm, "question": "Why is the sky blue?", "max_tokens": sizes.hello_max_tokens}
    measured = cell_call("00", tmp_path, "ceilings_here", dict(ceilings_button=pressed, ch00=ch00, mo=mo, nb=page,
                         sizes=sizes, device=SimpleNamespace(kind="cpu")), "quick", quick=not sizes.quick_ceilings)
    assert measured == {"device": "cpu", "quick": not sizes.quick_ceilings}
