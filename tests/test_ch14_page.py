"""Notebook 14's page is the experiment: ``tensor_parallel`` in the notebook splits the model over
processes, the chapter module only shows it, every decode step makes the all-reduces
``analysis.collectives`` predicts, and changing the world size in the cell keeps that count."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest

from infer_lab.analysis.collectives import tp_allreduces
from infer_lab.course import ch14_tensor_parallel as ch14
from infer_lab.course.notebook_code import notebook_function, notebook_path
from infer_lab.parallel.layers import tp_decoder_layer

CELL_NUMBER = "    world_size = 2  # ranks"


def test_the_experiments_run_from_the_notebook_file():
    for name, calls in (("tensor_parallel", ("TPGroup(model, world_size", "run_local(model", "allreduce_sweep(")),
                        ("tp_scaling", ("scaling_table(model", "parallelism_frontier(model"))):
        fn = notebook_function("14", name)
        assert inspect.getsourcefile(fn) == str(notebook_path("14"))
        code = inspect.getsource(fn)
        assert all(c in code for c in calls), name
        assert len(code.splitlines()) <= 15, name
    # the chapter module calls the notebook's functions; it starts no process group of its own
    assert 'notebook_function(NUMBER, "tensor_parallel")' in inspect.getsource(ch14.run_tp)
    assert 'notebook_function(NUMBER, "tp_scaling")' in inspect.getsource(ch14.scaling_result)
    assert "TPGroup" not in inspect.getsource(ch14)
    assert notebook_path("14").read_text().count(CELL_NUMBER) == 1


def test_the_page_shows_the_real_layer_and_predicts_the_all_reduces_first(embedded):
    shown = ch14.layer_code()
    assert inspect.getsource(tp_decoder_layer).splitlines()[0] in shown
    assert "h = h + comm.all_reduce(F.linear(attn, w.o_proj))" in shown and '"""' not in shown
    assert len(shown.splitlines()) <= 30  # short enough for a slide
    text = ch14.prediction_text(embedded, 2, 4)  # SmolLM2-135M: 30 layers, hidden 576, fp32
    assert "2 x 30 layers = 60 all-reduces" in text and "9,216 B" in text and "552,960 B per step" in text
    source = notebook_path("14").read_text()
    assert source.index("ch14.prediction_text(") < source.index("def tensor_parallel(")  # before the run


@pytest.fixture(scope="module")
def quick_tp(tour_runs) -> ch14.TPResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's 2 ranks."""
    return tour_runs.part("ch14_tensor_parallel", "tp")


def _assert_steps_match_the_prediction(tp: ch14.TPResult, shape) -> None:
    assert tp.decode_steps  # rank 0's decode steps: (tokens, all-reduces, bytes)
    for tokens, calls, nbytes in tp.decode_steps:
        predicted = tp_allreduces(shape, tp.world_size, tokens, "nvlink4-nvswitch", act_dtype="fp32")
        assert calls == predicted.count == 60
        assert nbytes == predicted.total_bytes == 60 * tokens * 576 * 4
    assert tp.steps_matching_prediction == len(tp.decode_steps)
    assert max(t for t, _, _ in tp.decode_steps) == len(tp.prompt_tokens)  # the full batch decodes at first


def test_every_decode_step_all_reduces_what_analysis_predicts(quick_tp, embedded):
    tp = quick_tp
    assert tp.world_size == 2 and tp.identical_ws1 and tp.identical_hf
    _assert_steps_match_the_prediction(tp, ch14.model_shape_of(embedded))
    assert tp.single_allreduces == 0  # world size 1 has nothing to reduce
    text = ch14.tp_text(tp)
    assert f"{len(tp.decode_steps)} of rank 0's {len(tp.decode_steps)} decode steps" in text


def test_scaling_is_sublinear_and_replicas_win_on_pcie():
    s = ch14.run_scaling(None, ch14.sizes("cpu", "quick"))
    tp4 = s.row("H100-SXM", 4)
    assert 1.5 < tp4.speedup_vs_tp1 < 4 and tp4.allreduce_ms > 0  # 4 GPUs: faster, not 4x
    pcie = {r.parallelism: r.tokens_per_s for r in s.layouts if r.gpu == "H100-PCIe"}
    assert pcie["DP4"] > 1.05 * pcie["TP4"]  # the all-reduces over PCIe cost more than the replicas lose


def _edited_notebook(tmp_path, world_size: int):
    """Notebook 14 with its experiment cell's number changed, imported as a module (marimo's own API)."""
    source = notebook_path("14").read_text()
    path = tmp_path / "nb13_edited.py"
    path.write_text(source.replace(CELL_NUMBER, CELL_NUMBER.replace("= 2", f"= {world_size}")))
    spec = importlib.util.spec_from_file_location("nb13_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb13_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb13_edited", None)
    return module


@pytest.mark.slow
def test_three_ranks_in_the_cell_split_finer_but_all_reduce_the_same(embedded, tmp_path, quick_tp):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    sizes = ch14.sizes("cpu", "quick")
    cell = _edited_notebook(tmp_path, 3).tp_run
    _, defs = cell.run(ch14=ch14, lm=embedded, mo=mo, nb=nb, sizes=sizes, tp_button=SimpleNamespace(value=True))
    tp = defs["tp"]
    assert tp.world_size == 3 and tp.identical_ws1
    # as the chapter says: two all-reduces per layer of the same size, whatever the world size ...
    _assert_steps_match_the_prediction(tp, ch14.model_shape_of(embedded))
    # ... while each rank holds less: one KV head each instead of 2 + 1
    assert max(tp.split_params) < max(quick_tp.split_params)
    assert "KV head 0," in tp.plan and "KV head 2," in tp.plan
