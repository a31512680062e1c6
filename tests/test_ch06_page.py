"""Notebook 06's page is the experiment: its ``@app.function`` experiments call :mod:`infer_lab.quant`
directly, the chapter module only shows what they return, and changing a number in the notebook's
formats cell (the group size) changes the result the way the chapter says it does."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest

from infer_lab.course import ch06_quantization as ch06
from infer_lab.course.notebook_code import notebook_function, notebook_path
from infer_lab.quant.formats import quantize_q4_1

EXPERIMENTS = {  # notebook function -> the chapter's run_<part> that executes it, and a library call it makes
    "layer_errors": (ch06.run_formats, "layer_error_stats(blocks[i], m)"),
    "quantize_and_compare": (ch06.run_compare, "compare_methods(lm, list(methods)"),
    "outlier_features": (ch06.run_outliers, "linear_input_outliers(lm.model, ids, layer_filter)"),
    "kv_cache_quality": (ch06.run_kv, "measure_variant_quality(lm, eval_tokens=eval_tokens"),
}
GROUP_LINE = "    group = 64  # weights per scale in the int4 and NF4 rows"


def test_every_experiment_runs_from_the_notebook_file():
    source = notebook_path("06").read_text()
    assert "ch06.measure_" not in source  # no wrapper between the page and the library
    for name, (runner, call) in EXPERIMENTS.items():
        fn = notebook_function("06", name)
        assert inspect.getsourcefile(fn) == str(notebook_path("06"))
        code = inspect.getsource(fn)
        assert call in code and len(code.splitlines()) <= 15
        assert f'notebook_function(NUMBER, "{name}")' in inspect.getsource(runner)
    assert GROUP_LINE in source and source.count(GROUP_LINE) == 1
    assert ch06.FORMAT_GROUP == 64 and f"int4-g{ch06.FORMAT_GROUP}" in ch06.sizes("cpu", "quick").format_methods


def test_the_page_shows_the_real_group_quantizer():
    shown = ch06.group_quantize_code()
    assert inspect.getsource(quantize_q4_1).splitlines()[0] in shown
    assert "groups = _grouped(weight, group_size)" in shown
    assert '"""' not in shown and len(shown.splitlines()) <= 30  # docstring left out, fits a slide


@pytest.fixture(scope="module")
def quick_formats(tour_runs) -> ch06.FormatsResult:
    return tour_runs.part("ch06_quantization", "formats")


def test_fewer_bits_cost_error_and_the_shipped_format_is_exact(quick_formats):
    by = quick_formats.by_method()
    q41, g32, g64, int8 = by["q4_1-g32"], by["int4-g32"], by["int4-g64"], by["int8"]
    assert q41.exact_layers == q41.layers >= 7  # the embedded weights came from Q4_1 at g32: bit for bit
    assert g64.bits_per_weight < g32.bits_per_weight < int8.bits_per_weight / 1.6  # scales cost bits
    assert g32.rel_error_mean < g64.rel_error_mean  # ... and buy accuracy
    assert int8.rel_error_mean < g32.rel_error_mean / 5  # 8 bits: far smaller error than 4
    assert 8 < int8.bits_per_weight < 8.1  # one fp32 scale per row of 576+ weights
    assert "int4-g32" in ch06.formats_text(quick_formats)  # the best 4-bit grid is named on the page


def _edited_notebook(tmp_path, old: str, new: str):
    """Notebook 06 with one line of a cell changed, imported as a module (marimo's own API)."""
    source = notebook_path("06").read_text()
    assert source.count(old) == 1
    path = tmp_path / "nb05_edited.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("nb05_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb05_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb05_edited", None)
    return module


def test_a_bigger_group_in_the_cell_saves_bits_and_costs_error(embedded, tmp_path, quick_formats):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    cell = _edited_notebook(tmp_path, GROUP_LINE, GROUP_LINE.replace("= 64", "= 128")).formats_cell
    _, defs = cell.run(ch06=ch06, lm=embedded, mo=mo, nb=nb, sizes=ch06.sizes("cpu", "quick"),
                       formats_button=SimpleNamespace(value=True))
    g128 = defs["formats"].by_method()["int4-g128"]
    g64 = quick_formats.by_method()["int4-g64"]  # the cell as shipped
    assert g128.bits_per_weight < g64.bits_per_weight and g128.rel_error_mean > g64.rel_error_mean


def test_outlier_features_dwarf_the_median(embedded):
    rows = ch06.run_outliers(embedded, ch06.sizes("cpu", "quick"))
    assert len(rows) == 30 and all(r.layer.endswith("q_proj") for r in rows)
    ratios = sorted(r.max_over_median for r in rows)
    assert ratios[-1] >= 20 and ratios[len(ratios) // 2] >= 8  # every block has a feature far above its median
    assert "`q_proj` layers" in ch06.outliers_text(rows)


def test_an_int8_kv_cache_stores_under_a_third_of_the_fp32_bytes(embedded):
    kv = ch06.kv_result(embedded, notebook_function("06", "kv_cache_quality")(embedded, 32, ("int8",)), 32)
    base, int8 = kv.rows
    assert kv.baseline_dtype == "fp32" and "int8" in int8.variant
    assert int8.kv_bytes_per_token * 3.5 < base.kv_bytes_per_token  # 1 byte + a scale per head vs 4 bytes
    assert abs(int8.perplexity_change) < 0.2  # and the text barely notices


@pytest.mark.slow
def test_int8_weights_keep_under_half_the_bytes(embedded):
    raw = notebook_function("06", "quantize_and_compare")(embedded, ("int8",), eval_tokens=32, prompt_tokens=8,
                                                          new_tokens=2, repeats=1)
    comparison = ch06.comparison_result(embedded, raw, 8, 2, 1)
    int8 = comparison.methods[0]
    assert int8.weight_bytes < 0.45 * comparison.baseline.weight_bytes  # the embeddings stay fp32
    assert int8.top1_agreement >= 0.75
    assert "measured: " in ch06.compare_text(comparison, embedded=True, guess_pct=30)
