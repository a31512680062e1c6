"""Notebook 03's page is the experiment: the byte check is an ``@app.function`` of the notebook that
calls ``analysis.memory`` and the harness, the page shows the KV formula's real code, and changing
the batch in the check's cell changes the KV bytes the way the equation says."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest

from infer_lab.analysis import memory
from infer_lab.course import ch03_memory_equation as ch03
from infer_lab.course.notebook_code import notebook_function, notebook_path

BATCH_LINE = "    batch = _s.check_batch  # sequences generated together (2): try 4"


def test_the_check_runs_from_the_notebook_file():
    source = notebook_path("03").read_text()
    assert "ch03.measure" not in source and "ch03.kv_summary(" not in source
    assert "report = kv_report(model_pick.value" in source  # the calculator cell calls analysis directly
    function = notebook_function("03", "bytes_predicted_vs_counted")
    assert inspect.getsourcefile(function) == str(notebook_path("03"))
    code = inspect.getsource(function)
    assert "kv_bytes(shape, cached, batch, dtype)" in code and "timed_generate(lm" in code
    assert len(code.splitlines()) <= 15
    assert 'notebook_function(NUMBER, "bytes_predicted_vs_counted")' in inspect.getsource(ch03.run_check)
    assert BATCH_LINE in source


def test_the_page_shows_the_kv_formulas_real_code():
    shown = ch03.kv_formula_code()
    assert "return 2 * shape.kv_heads * shape.head_dim" in shown
    assert "return shape.layers * kv_bytes_per_token_per_layer(shape, kv_dtype)" in shown
    assert '"""' not in shown and len(shown.splitlines()) <= 20
    assert memory.kv_bytes_per_token("mistral-7b", "bf16") == 2 * 32 * 8 * 128 * 2


def _edited_notebook(tmp_path, old: str, new: str):
    source = notebook_path("03").read_text()
    assert source.count(old) == 1
    path = tmp_path / "nb02_edited.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("nb02_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb02_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb02_edited", None)
    return module


@pytest.mark.slow
def test_doubling_the_batch_in_the_cell_doubles_the_kv_and_not_the_weights(embedded, tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    page = SimpleNamespace(pressed=lambda _b: True, placeholder=nb.placeholder, table=nb.table,
                           load_model_or_explain=lambda *_a: embedded, model_choice=lambda: ("smollm2-135m", "pretrained"))
    results = {}
    for batch in (2, 4):
        cell = _edited_notebook(tmp_path, BATCH_LINE, f"    batch = {batch}  #").check_cell
        _, defs = cell.run(ch03=ch03, check_button=SimpleNamespace(value=True), mo=mo, nb=page,
                           size_picker=SimpleNamespace(value="quick"))
        results[batch] = defs["check"]
    for check in results.values():  # the equation is exact, byte for byte
        assert [r.measured_over_predicted for r in check.rows] == [1.0, 1.0]
    weights = {b: c.rows[0].measured for b, c in results.items()}
    kv = {b: c.rows[1].measured for b, c in results.items()}
    assert weights[4] == weights[2] and kv[4] == 2 * kv[2]
