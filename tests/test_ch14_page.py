"""Notebook 14's page is the experiment: ``tensor_parallel`` in the notebook splits the model over
processes, the chapter module only shows it, every decode step makes the all-reduces
``analysis.collectives`` predicts, and changing the world size in the cell keeps that count."""

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
    without_args,
)

from infer_lab.analysis.collectives import tp_allreduces
from infer_lab.course import ch14_tensor_parallel as ch14
from infer_lab.course.notebook_code import notebook_function
from infer_lab.parallel.layers import tp_decoder_layer


def _part(name: str):
    """The chapter package's module for one part (``tp``, ``scaling``): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch14.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_and_starts_no_process_group_of_its_own(monkeypatch, embedded):
    sizes = ch14.sizes("cpu", "quick")
    (name, args), = experiment_calls(monkeypatch, _part("tp"), ch14.run_tp, embedded, sizes, 3, stop_at="tensor_parallel")
    assert name == "tensor_parallel" and args["world_size"] == 3 and args["new_tokens"] == sizes.tp_new_tokens
    assert (args["sweep_sizes"], args["repeats"]) == (sizes.sweep_sizes, sizes.sweep_repeats)
    (name, args), = experiment_calls(monkeypatch, _part("scaling"), ch14.scaling_result, "mistral-7b", 8, 2048, stop_at="tp_scaling")
    assert name == "tp_scaling" and (args["model"], args["batch"], args["context"]) == ("mistral-7b", 8, 2048)
    assert not hasattr(ch14, "TPGroup")


def test_tp_scaling_hands_back_the_librarys_table_and_frontier(monkeypatch):
    experiment = notebook_function("14", "tp_scaling")
    table, frontier, calls = [{"tp": 1}], [object()], {}

    def scaling_table(model, gpus, *args, **options):
        calls["table"] = (model, tuple(gpus))
        return table

    def parallelism_frontier(model, gpu, *args, **options):
        calls["frontier"] = (model, gpu)
        return frontier

    monkeypatch.setitem(experiment.__globals__, "scaling_table", scaling_table)
    monkeypatch.setitem(experiment.__globals__, "parallelism_frontier", parallelism_frontier)
    assert experiment("mistral-7b", 8, 2048, ("H100-SXM", "H100-PCIe")) == (table, frontier)
    assert calls == {"table": ("mistral-7b", ("H100-SXM", "H100-PCIe")), "frontier": ("mistral-7b", "H100-SXM")}


def test_the_page_shows_the_real_layer_and_predicts_the_all_reduces(embedded):
    shown = ch14.layer_code()
    shows_the_real_code(shown, tp_decoder_layer)
    assert len(shown.splitlines()) <= 30  # short enough for a slide
    text = ch14.prediction_text(embedded, 2, 4)  # SmolLM2-135M: 30 layers, hidden 576, fp32
    assert "2 x 30 layers = 60 all-reduces" in text and "9,216 B" in text and "552,960 B per step" in text


def test_the_prediction_is_on_the_page_before_its_button_runs_the_experiment(tmp_path):
    """The cell that shows the run button renders the prediction for the experiment's own world size
    and prompts; the experiment's cell waits on that button: unpressed, ``tensor_parallel`` never runs."""
    pytest.importorskip("marimo")
    import html
    import re

    import marimo as mo

    from infer_lab.course import nb

    def words(text: str) -> str:
        return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).replace("**", "").replace("`", "").split())

    def not_yet(*args):
        raise AssertionError("the experiment ran before its button was pressed")

    sizes = ch14.sizes("cpu", "quick")
    page = edited_notebook("14", tmp_path)  # the notebook as it is
    button_cell = next(data.cell for data in page.app._cell_manager.cell_data()
                       if data.cell is not None and "tp_button" in data.cell.defs)
    shown, defs = button_cell.run(ch14=ch14, mo=mo, nb=nb, sizes=sizes)
    predicted = ch14.prediction_text("smollm2-135m", ch14.TP_WORLD_SIZE, sizes.tp_prompts)
    assert words(predicted) in words(shown.text) and "60 all-reduces" in words(shown.text)
    _, ran = page.tp_run.run(ch14=ch14, lm=None, mo=mo, nb=nb, sizes=sizes, tp_button=defs["tp_button"],
                             tensor_parallel=not_yet)
    assert "tp" not in ran  # stopped at the button, with the prediction already shown


@pytest.fixture(scope="module")
def quick_tp(tour_runs) -> ch14.TPResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's ranks (``TP_WORLD_SIZE``)."""
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
    assert tp.world_size == ch14.TP_WORLD_SIZE and tp.identical_ws1 and tp.identical_hf  # the cell's ranks
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


@pytest.mark.slow
def test_three_ranks_in_the_cell_split_finer_but_all_reduce_the_same(embedded, tmp_path, quick_tp):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch14.sizes("cpu", "quick")
    cell = edited_notebook("14", tmp_path, world_size=3).tp_run
    _, defs = cell.run(ch14=ch14, lm=embedded, mo=mo, nb=nb, sizes=sizes, tp_button=SimpleNamespace(value=True))
    tp = defs["tp"]
    assert tp.world_size == 3 and tp.identical_ws1
    # as the chapter says: two all-reduces per layer of the same size, whatever the world size ...
    _assert_steps_match_the_prediction(tp, ch14.model_shape_of(embedded))
    # ... while each rank holds less: one KV head each instead of 2 + 1
    assert max(tp.split_params) < max(quick_tp.split_params)
    assert "KV head 0," in tp.plan and "KV head 2," in tp.plan


def test_part_one_leads_with_the_finding_and_keeps_the_derivation_one_click_away(quick_tp):
    tp = quick_tp
    paragraphs = ch14.tp_paragraphs(tp)
    assert ch14.tp_text(tp) == "\n\n".join(paragraphs.values())
    lead, derivation = ch14.tp_lead(tp), ch14.tp_derivation(tp)
    assert all(p in lead or p in derivation for p in paragraphs.values())  # nothing dropped
    assert paragraphs["tokens"] in lead and paragraphs["why"] in derivation and paragraphs["why"] not in lead
    r0, ref = tp.run(tp.world_size, 0), tp.reference
    assert "**The finding:**" in lead and f"{r0.allreduces_per_step} all-reduces" in lead
    assert ("slower" if max(r.step_ms for r in tp.runs if r.world_size > 1) > ref.step_ms else "faster") in lead
    details = ch14.tp_details(tp)
    tables = [item for items in details.values() for item in items if hasattr(item, "columns")]
    assert any(t.equals(ch14.tp_steps_table(tp)) for t in tables)
    assert any(t.equals(ch14.sweep_table(tp)) for t in tables)
    assert list(ch14.tp_steps_table(tp, lesson=True).columns) == list(ch14.TP_STEP_LESSON_COLUMNS)
    bandwidth = ch14.sweep_table(tp)["algbw (MB/s)"]
    assert not any("10⁻" in v or "e-" in v for v in bandwidth)  # MB/s: no exponents at gloo's speeds


def test_part_two_shows_each_finding_with_its_columns_and_a_legible_frontier():
    s = ch14.scaling_result()
    for key in ch14.SCALING_FINDINGS:
        text, lesson, title, full = ch14.scaling_finding(s, key)
        assert text and title in ch14.scaling_tables(s)
        if lesson is not None:
            assert len(lesson.columns) <= 6 < len(full.columns) and lesson.equals(full[list(lesson.columns)])
    with pytest.raises(ValueError, match="key must be one of"):
        ch14.scaling_finding(s, "cluster")
    assert ch14.scaling_text(s) == "\n\n".join(ch14.scaling_paragraphs(s).values())
    # the Pareto figure: every point label inside the axes, clear of the title and of the legend
    fig = ch14.frontier_figure(s)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    title, frame, legend = (x.get_window_extent(renderer) for x in (ax.title, ax.patch, ax.get_legend()))
    labels = [t for t in ax.texts if "batch" in t.get_text()]
    assert len(labels) == 2  # the default and the fast-mode point
    for label in labels:
        box = label.get_window_extent(renderer)
        assert not box.overlaps(title) and not box.overlaps(legend), label.get_text()
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


def _point(tp: int, batch: int, per_gpu: float, per_user: float, on_frontier: bool = False):
    from infer_lab.analysis.parallel import FrontierPoint

    return FrontierPoint("H100-SXM", tp, 8 // tp, batch, 8192, 1e3 / per_user, 0.0, per_user, per_gpu, 8 * per_gpu,
                         1 / per_gpu, 700 / per_gpu, 1.0, on_frontier)


def test_the_fixed_batch_sentence_follows_the_frontier_numbers():
    """The chapter's own frontier: TP8 is dearer per token than TP4 x DP2 at batch 1 (43.1 vs 34.2 J/token),
    and holds the frontier only by fitting bigger batches; swap the costs and the sentence turns round."""
    s = ch14.scaling_result()
    text = ch14.fixed_batch_text(s.frontier, s.model)
    assert "TP8, is the **dearer** per token at every batch both run" in text
    assert "at batch 1 it costs 43.1 J/token against 34.2" in text and "fits bigger batches" in text
    assert text in ch14.scaling_paragraphs(s)["quote"]
    assert "smaller share" not in text and "more all-reduces" not in text  # the count is the same: 2 x layers
    dearer = [_point(8, 1, 16.0, 130.0, True), _point(8, 64, 540.0, 68.0, True), _point(4, 1, 20.0, 82.0),
              _point(4, 16, 260.0, 65.0)]
    assert "is the **dearer**" in ch14.fixed_batch_text(dearer)
    assert "batch 16: 65.0 tok/s per user, 260 tok/s per GPU) is beaten on both by TP8 at batch 64" in (
        ch14.fixed_batch_text(dearer))
    cheaper = [_point(8, 1, 25.0, 130.0, True), _point(4, 1, 20.0, 82.0)]  # the inverted case
    text = ch14.fixed_batch_text(cheaper)
    assert "is the **cheaper** per token at every batch both run" in text and "dearer" not in text
    mixed = [_point(8, 1, 25.0, 130.0, True), _point(8, 2, 30.0, 128.0, True), _point(4, 1, 20.0, 82.0),
             _point(4, 2, 40.0, 80.0)]
    assert "dearer per token at batch 2 and the cheaper at batch 1" in ch14.fixed_batch_text(mixed)
    assert ch14.fixed_batch_text([_point(8, 1, 25.0, 130.0, True)]) == ""  # one layout: nothing to compare


def test_the_reason_comes_from_the_two_layouts_predicted_steps():
    """TP8 and TP4 make the same 2 x layers all-reduces; what differs is their cost (from the layout
    step prediction, the frontier's own numbers) and how many GPUs wait on them."""
    from infer_lab.analysis.memory import as_shape
    from infer_lab.analysis.parallel import Layout, LayoutStep

    s = ch14.scaling_result()
    text = ch14.fixed_batch_text(s.frontier, s.model)
    tp8, tp4 = (next(p for p in s.frontier if p.tp == tp and p.batch == 1) for tp in (8, 4))
    assert f"Both make the same {2 * as_shape(s.model).layers} all-reduces per step" in text
    assert (f"at batch 1 they take {tp8.allreduce_ms_per_step:.2f} ms of each TP8 step against "
            f"{tp4.allreduce_ms_per_step:.2f} ms of each TP4 x DP2 step") in text  # 2.41 vs 1.64
    assert "with all 8 GPUs waiting on them against 4" in text and "more GPU time in all-reduces" in text
    assert "and the same in compute" in text

    def step(tp: int, count: int, allreduce_s: float, compute_s: float) -> LayoutStep:
        return LayoutStep(Layout(tp=tp), "decode", 1, 1, compute_s + allreduce_s, compute_s, allreduce_s, 0.0, 0.0,
                          count, 0)

    inverted = ch14.allreduce_reason_text(step(8, 40, 0.5e-3, 5e-3), step(4, 80, 1.5e-3, 12e-3))
    assert inverted.startswith("TP8 makes 40 all-reduces per step against 80 for TP4;")
    assert "0.50 ms of each TP8 step against 1.50 ms" in inverted
    assert "less GPU time in all-reduces (4.0 GPU-ms against 6.0) and less in compute (40.0 against 48.0)" in inverted


def test_each_cell_as_shipped_makes_the_chapters_call(monkeypatch, embedded, tmp_path):
    """The page's cells and the chapter read the world size, the GPUs and part 2's defaults from one
    home (the chapter's scenario): the TP cell as shipped, and the scaling cell at its controls'
    defaults, hand their experiments what the tour hands them."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch14.sizes("cpu", "quick")
    page = cell_call("14", tmp_path, "tensor_parallel", dict(ch14=ch14, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                              tp_button=SimpleNamespace(value=True)), "tp")
    chapter = chapter_call(monkeypatch, ch14.run_tp, embedded, sizes, experiment="tensor_parallel")
    assert without_args(page, "lm") == without_args(chapter, "lm")  # the model: a CPU copy on each side
    controls = next(data.cell for data in edited_notebook("14", tmp_path).app._cell_manager.cell_data()
                    if data.cell is not None and "scaling_model" in data.cell.defs)
    _, defaults = controls.run(ch14=ch14, mo=mo)
    page = cell_call("14", tmp_path, "tp_scaling", dict(ch14=ch14, mo=mo, nb=nb, **{
        name: defaults[name] for name in ("scaling_model", "scaling_batch", "scaling_context")}), "scaling")
    assert page == chapter_call(monkeypatch, ch14.run_scaling, None, sizes, experiment="tp_scaling")
