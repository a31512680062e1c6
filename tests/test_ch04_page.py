"""Notebook 04's page is the experiment: the datasheet prediction and the predicted-vs-measured run
are ``@app.function`` s of the notebook calling ``analysis.roofline``, ``hardware`` and ``bench``;
the chapter module only shows them, and the page shows the roofline's real code."""

from __future__ import annotations

import inspect

from infer_lab.analysis.roofline import Roof
from infer_lab.course import ch04_prefill_decode_roofline as ch04
from infer_lab.course.notebook_code import notebook_function, notebook_path


def test_the_experiments_run_from_the_notebook_file():
    source = notebook_path("04").read_text()
    assert "ch04.measure" not in source  # no visible cell calls a chapter wrapper
    for name, calls in {"datasheet_prediction": "gpu_roof(gpu)", "roofline_vs_harness": "measure_ceilings("}.items():
        function = notebook_function("04", name)
        assert inspect.getsourcefile(function) == str(notebook_path("04"))
        code = inspect.getsource(function)
        assert calls in code and len(code.splitlines()) <= 15
    assert 'notebook_function(NUMBER, "datasheet_prediction")' in inspect.getsource(ch04.datasheet_view)
    assert 'notebook_function(NUMBER, "roofline_vs_harness")' in inspect.getsource(ch04.run_compare)
    assert "    batches = _s.batches  # decode batches" in source


def test_the_page_shows_the_roofs_real_code():
    shown = ch04.roof_code()
    assert "return max(flops / self.peak_flops, n_bytes / self.bandwidth_Bps)" in shown
    assert "return min(self.peak_flops, intensity * self.bandwidth_Bps)" in shown
    assert '"""' not in shown and len(shown.splitlines()) <= 12
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
