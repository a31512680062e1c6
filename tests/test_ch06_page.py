"""Notebook 06's page is the experiment: its ``@app.function`` experiments call :mod:`infer_lab.quant`
directly, the chapter module only shows what they return, and changing a number in the notebook's
formats cell (the group size) changes the result the way the chapter says it does."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from page_helpers import (
    cell_call,
    chapter_call,
    edited_notebook,
    experiment_calls,
    shows_the_real_code,
)

from infer_lab.course import ch06_quantization as ch06
from infer_lab.course.notebook_code import notebook_function
from infer_lab.quant.formats import quantize_q4_1

EXPERIMENTS = {"layer_errors": "run_formats", "quantize_and_compare": "run_compare",
               "outlier_features": "run_outliers", "kv_cache_quality": "run_kv"}  # notebook function -> its runner


def _part(name: str):
    """The chapter package's module for one part (``formats``, ``compare``, ...): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch06.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch):
    sizes, lm = ch06.sizes("cpu", "quick"), SimpleNamespace(name="stub-lm")
    ran = {name: experiment_calls(monkeypatch, _part(runner.removeprefix("run_")), getattr(ch06, runner), lm, sizes,
                                  stop_at=name)
           for name, runner in EXPERIMENTS.items()}
    assert {name: [c[0] for c in calls] for name, calls in ran.items()} == {name: [name] for name in EXPERIMENTS}
    args = {name: calls[0][1] for name, calls in ran.items()}
    assert all(a["lm"] is lm for a in args.values())
    assert args["layer_errors"]["methods"] == sizes.format_methods
    assert args["layer_errors"]["block_stride"] == sizes.format_block_stride
    assert tuple(args["quantize_and_compare"]["methods"]) == tuple(sizes.methods)
    assert args["quantize_and_compare"]["eval_tokens"] == sizes.eval_tokens
    assert args["kv_cache_quality"]["eval_tokens"] == sizes.kv_eval_tokens


def _stub(monkeypatch, experiment, library_name: str) -> tuple[object, list]:
    """Replace ``library_name`` where the notebook's ``experiment`` looks it up: (what it returns, its calls)."""
    returned, calls = object(), []

    def stub(*args, **options):
        calls.append((args, options))
        return returned

    monkeypatch.setitem(experiment.__globals__, library_name, stub)
    return returned, calls


def test_the_experiments_hand_back_what_the_quant_library_computed(monkeypatch):
    """Each experiment calls :mod:`infer_lab.quant` directly (stubbed where the notebook looks it up)."""
    text_model = SimpleNamespace(tokenizer=object(), is_random=False, model=object(), chat_ids=lambda text: [[1, 2]])
    compare = notebook_function("06", "quantize_and_compare")
    returned, calls = _stub(monkeypatch, compare, "compare_methods")
    assert compare(text_model, ("int8",), eval_tokens=32, prompt_tokens=8, new_tokens=2, repeats=1) is returned
    assert calls[0][0][:2] == (text_model, ["int8"])

    outliers = notebook_function("06", "outlier_features")
    returned, calls = _stub(monkeypatch, outliers, "linear_input_outliers")
    assert outliers(text_model, "Hello", "q_proj") is returned and calls == [((text_model.model, [[1, 2]], "q_proj"), {})]

    kv = notebook_function("06", "kv_cache_quality")
    returned, calls = _stub(monkeypatch, kv, "measure_variant_quality")
    assert kv(text_model, 32, ("int8",)) is returned and calls[0][0] == (text_model,)

    layers = notebook_function("06", "layer_errors")
    returned, calls = _stub(monkeypatch, layers, "layer_error_stats")
    blocks = [object() for _ in range(5)]
    got = layers(SimpleNamespace(model=SimpleNamespace(model=SimpleNamespace(layers=blocks))), ("int8",), 2)
    assert [list(by_block.items()) for by_block in got.values()] == [[(0, returned), (2, returned), (4, returned)]]
    assert [c[0] for c in calls] == [(blocks[i], "int8") for i in (0, 2, 4)]


def test_the_page_shows_the_real_group_quantizer():
    shown = ch06.group_quantize_code()
    shows_the_real_code(shown, quantize_q4_1)
    assert len(shown.splitlines()) <= 30  # fits a slide


@pytest.fixture(scope="module")
def quick_formats(tour_runs) -> ch06.FormatsResult:
    return tour_runs.part("ch06_quantization", "formats")


def test_fewer_bits_cost_error_and_the_shipped_format_is_exact(quick_formats):
    by = quick_formats.by_method()
    q41, g32, g64, int8 = by["q4_1-g32"], by["int4-g32"], by[f"int4-g{ch06.FORMAT_GROUP}"], by["int8"]
    assert q41.exact_layers == q41.layers >= 7  # the embedded weights came from Q4_1 at g32: bit for bit
    assert g64.bits_per_weight < g32.bits_per_weight < int8.bits_per_weight / 1.6  # scales cost bits
    assert g32.rel_error_mean < g64.rel_error_mean  # ... and buy accuracy
    assert int8.rel_error_mean < g32.rel_error_mean / 5  # 8 bits: far smaller error than 4
    assert 8 < int8.bits_per_weight < 8.1  # one fp32 scale per row of 576+ weights
    assert "int4-g32" in ch06.formats_text(quick_formats)  # the best 4-bit grid is named on the page


def test_a_bigger_group_in_the_cell_saves_bits_and_costs_error(embedded, tmp_path, quick_formats):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    bigger = 2 * ch06.FORMAT_GROUP
    cell = edited_notebook("06", tmp_path, group=bigger).formats_cell
    _, defs = cell.run(ch06=ch06, lm=embedded, mo=mo, nb=nb, sizes=ch06.sizes("cpu", "quick"),
                       formats_button=SimpleNamespace(value=True))
    big = defs["formats"].by_method()[f"int4-g{bigger}"]
    shipped = quick_formats.by_method()[f"int4-g{ch06.FORMAT_GROUP}"]  # the cell as shipped
    assert big.bits_per_weight < shipped.bits_per_weight and big.rel_error_mean > shipped.rel_error_mean


def test_outlier_features_dwarf_the_median(embedded):
    rows = ch06.run_outliers(embedded, ch06.sizes("cpu", "quick"))
    assert len(rows) == 30 and all(r.layer.endswith(ch06.OUTLIER_LAYER) for r in rows)  # one per block
    ratios = sorted(r.max_over_median for r in rows)
    assert ratios[-1] >= 20 and ratios[len(ratios) // 2] >= 8  # every block has a feature far above its median
    assert f"`{ch06.OUTLIER_LAYER}` layers" in ch06.outliers_text(rows)


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


@pytest.mark.parametrize(("runner", "experiment", "defining"), [
    ("run_formats", "layer_errors", "formats"), ("run_outliers", "outlier_features", "outliers"),
    ("run_kv", "kv_cache_quality", "kv")])
def test_each_cell_as_shipped_makes_the_chapters_call(monkeypatch, embedded, tmp_path, runner, experiment, defining):
    """The page's cells and the chapter's runners read the group size, the prompt and layer, and the KV
    formats from one home (the chapter): each cell as shipped hands its experiment what the tour hands it."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes, pressed = ch06.sizes("cpu", "quick"), SimpleNamespace(value=True)
    page = cell_call("06", tmp_path, experiment, dict(ch06=ch06, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                      formats_button=pressed, outliers_button=pressed,
                                                      kv_button=pressed), defining)
    assert page == chapter_call(monkeypatch, getattr(ch06, runner), embedded, sizes, experiment=experiment)
