"""Notebook 03's page is the experiment: the byte check is an ``@app.function`` of the notebook that
calls ``analysis.memory`` and the harness, the page shows the KV formula's real code, and changing
the batch in the check's cell changes the KV bytes the way the equation says."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from page_helpers import edited_notebook, experiment_calls, shows_the_real_code

from infer_lab.analysis import memory
from infer_lab.analysis.compare import dtype_name, shape_of
from infer_lab.course import ch03_memory_equation as ch03
from infer_lab.course.notebook_code import notebook_function


def test_the_chapter_runs_the_notebooks_check_with_its_sizes(monkeypatch):
    sizes = ch03.sizes("cpu", "quick")
    lm = SimpleNamespace(name="stub-lm")
    check = importlib.import_module(f"{ch03.__name__}.check")  # the part that looks up the notebook's experiment
    calls = experiment_calls(monkeypatch, check, ch03.run_check, lm, sizes, stop_at="bytes_predicted_vs_counted")
    assert calls == [("bytes_predicted_vs_counted", {"lm": lm, "batch": sizes.check_batch,
                                                     "prompt_len": sizes.check_prompt_len,
                                                     "new_tokens": sizes.check_new_tokens})]


def test_the_check_predicts_with_analysis_memory_and_counts_from_the_harness(monkeypatch, embedded):
    """The predicted KV bytes are ``analysis.memory.kv_bytes`` of the tokens cached; the counted ones are
    what the harness's generation record says (``timed_generate`` stubbed where the notebook looks it up)."""
    check = notebook_function("03", "bytes_predicted_vs_counted")
    generated = []

    def timed_generate(lm, ids, new_tokens, **options):
        generated.append((lm, len(ids), len(ids[0]), new_tokens))
        return SimpleNamespace(new_tokens=new_tokens, kv_bytes=12345)

    monkeypatch.setitem(check.__globals__, "timed_generate", timed_generate)
    (_, weights_predicted, weights_counted), (_, kv_predicted, kv_counted) = check(embedded, 3, 8, 4)[0]
    assert generated == [(embedded, 3, 8, 4)]  # a batch of 3 prompts of 8 tokens, 4 new tokens
    cached = 8 + 4 - 1  # the last sampled token is never fed back
    assert kv_predicted == memory.kv_bytes(shape_of(embedded), cached, 3, dtype_name(embedded)) and kv_counted == 12345
    assert weights_predicted == memory.weight_bytes(shape_of(embedded), dtype_name(embedded)).total
    assert weights_counted == embedded.weight_bytes


def test_the_page_shows_the_kv_formulas_real_code():
    shown = ch03.kv_formula_code()
    shows_the_real_code(shown, memory.kv_bytes_per_token_per_layer, memory.kv_bytes_per_token)
    assert len(shown.splitlines()) <= 20
    assert memory.kv_bytes_per_token("mistral-7b", "bf16") == 2 * 32 * 8 * 128 * 2


@pytest.mark.slow
def test_doubling_the_batch_in_the_cell_doubles_the_kv_and_not_the_weights(embedded, tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    page = SimpleNamespace(pressed=lambda _b: True, placeholder=nb.placeholder, table=nb.table,
                           load_model_or_explain=lambda *_a: embedded, model_choice=lambda: ("smollm2-135m", "pretrained"))
    results = {}
    for batch in (2, 4):
        cell = edited_notebook("03", tmp_path, batch=batch).check_cell
        _, defs = cell.run(ch03=ch03, check_button=SimpleNamespace(value=True), mo=mo, nb=page,
                           size_picker=SimpleNamespace(value="quick"))
        results[batch] = defs["check"]
    for check in results.values():  # the equation is exact, byte for byte
        assert [r.measured_over_predicted for r in check.rows] == [1.0, 1.0]
    weights = {b: c.rows[0].measured for b, c in results.items()}
    kv = {b: c.rows[1].measured for b, c in results.items()}
    assert weights[4] == weights[2] and kv[4] == 2 * kv[2]
