"""Notebook 04's page is the experiment: the datasheet prediction and the predicted-vs-measured run
are ``@app.function`` s of the notebook calling ``analysis.roofline``, ``hardware`` and ``bench``;
the chapter module only shows them, and the page shows the roofline's real code."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from page_helpers import Stop, cell_call, experiment_calls, shows_the_real_code

from infer_lab.analysis.roofline import Roof, gpu_roof, predict
from infer_lab.course import ch04_prefill_decode_roofline as ch04
from infer_lab.course.notebook_code import notebook_function


def _part(name: str):
    """The chapter package's module for one part (``datasheet``, ``compare``): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch04.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_knobs(monkeypatch):
    calls = experiment_calls(monkeypatch, _part("datasheet"), ch04.datasheet_view, "mistral-7b", "H100-SXM", 8, 2048,
                              stop_at="datasheet_prediction")
    assert calls == [("datasheet_prediction", {"model": "mistral-7b", "gpu": "H100-SXM", "batch": 8, "context": 2048})]
    sizes, lm = ch04.sizes("cpu", "quick"), SimpleNamespace(name="stub-lm", device="cpu")
    (name, args), = experiment_calls(monkeypatch, _part("compare"), ch04.run_compare, lm, sizes, stop_at="roofline_vs_harness")
    assert name == "roofline_vs_harness" and args["lm"] is lm
    assert (args["prompt_lengths"], args["contexts"], args["batches"]) == (sizes.prompt_lengths, sizes.contexts,
                                                                          sizes.batches)
    assert (args["new_tokens"], args["repeats"], args["quick"]) == (sizes.new_tokens, sizes.repeats,
                                                                    sizes.quick_ceilings)


def test_the_datasheet_prediction_is_the_librarys_roofline_on_the_datasheet():
    roof, prediction, _prefill, _decode = notebook_function("04", "datasheet_prediction")("mistral-7b", "H100-SXM", 4, 1024)
    assert roof == gpu_roof("H100-SXM")
    assert prediction == predict("mistral-7b", roof, batch=4, context=1024)


def test_the_comparison_measures_its_roof_afresh_with_the_harness(monkeypatch):
    """``roofline_vs_harness`` starts from ``hardware.measure_ceilings`` on the model's device, measured
    now (stubbed where the notebook looks it up: it stops the run)."""
    experiment = notebook_function("04", "roofline_vs_harness")
    seen = []

    def measure_ceilings(device, **options):
        seen.append((device, options))
        raise Stop

    monkeypatch.setitem(experiment.__globals__, "measure_ceilings", measure_ceilings)
    with pytest.raises(Stop):
        experiment(SimpleNamespace(device="cpu"), (8,), (8,), (1,), 2, 1, quick=True)
    (device, options), = seen
    assert device == "cpu" and options.get("quick") is True and options.get("fresh") is True  # never a stale roof


def test_the_page_shows_the_roofs_real_code():
    shown = ch04.roof_code()
    shows_the_real_code(shown, Roof.time_s, Roof.attainable_flops)
    assert len(shown.splitlines()) <= 12
    roof = Roof("toy", peak_flops=100.0, bandwidth_Bps=10.0)
    assert roof.time_s(100.0, 1.0) == 1.0 and roof.time_s(1.0, 100.0) == 10.0


def test_a_bigger_batch_raises_decode_intensity_on_the_datasheet():
    one, many = ch04.datasheet_view("mistral-7b", "H100-SXM", 1, 4096), ch04.datasheet_view("mistral-7b", "H100-SXM", 64, 4096)
    assert (one.batch, many.batch) == (1, 64)
    # the weights are read once for the whole batch: 64 sequences, far more than 10x the FLOP per byte
    assert many.prediction.decode.intensity > 10 * one.prediction.decode.intensity
    assert one.prediction.decode.bound == "memory" and one.prediction.prefill.bound == "compute"


def test_a_real_decode_step_sits_next_to_its_prediction(tour_runs):
    result = tour_runs.part("ch04_prefill_decode_roofline", "compare")  # the notebook's experiment at quick size
    bytes_rows = [r for r in result.rows if r.unit == "B"]
    assert bytes_rows and all(abs(r.measured_over_predicted - 1) < 0.01 for r in bytes_rows)  # bytes agree
    decode = [r for r in result.rows if r.phase == "decode"]
    assert [r.batch for r in decode] == [1, 2] and all(r.measured > 0 and r.predicted > 0 for r in decode)
    text = ch04.decode_ratio_text(result)
    assert text.count("measured ÷ predicted") == 2 and result.roof.source == "measured"


def test_the_batches_in_the_cell_are_what_the_comparison_decodes(tmp_path):
    """A learner's decode batches, changed in the comparison cell, reach ``roofline_vs_harness`` with the
    rest of the chapter's sizes."""
    pytest.importorskip("marimo")
    import marimo as mo

    lm = SimpleNamespace(name="stub-lm", device="cpu")
    page = SimpleNamespace(pressed=lambda _button: True, placeholder=lambda _button: None,
                           load_model_or_explain=lambda *_args: lm, model_choice=lambda: ("smollm2-135m", "pretrained"))
    args = cell_call("04", tmp_path, "roofline_vs_harness", dict(ch04=ch04, compare_button=SimpleNamespace(value=True),
                     mo=mo, nb=page, save_switch=SimpleNamespace(value=False),
                     size_picker=SimpleNamespace(value="quick")), "batches", batches=(1, 8))
    sizes = ch04.sizes("cpu", "quick")
    assert args["lm"] is lm and args["batches"] == (1, 8)
    assert (args["prompt_lengths"], args["contexts"], args["new_tokens"]) == (sizes.prompt_lengths, sizes.contexts,
                                                                           sizes.new_tokens)
