"""Notebook 07's page is the experiment: its ``@app.function`` experiments call :mod:`infer_lab.attention`
and :mod:`infer_lab.bench` directly, the chapter module only shows what they return, the page shows the
real online-softmax tile, and changing a number in the equivalence cell changes what is checked."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace

import pytest
import torch
from page_helpers import (
    cell_call,
    chapter_call,
    edited_notebook,
    experiment_calls,
    shows_the_real_code,
)

from infer_lab.attention import flash_attention, online_softmax_tile, sdpa_attention
from infer_lab.course import ch07_attention_variants as ch07
from infer_lab.course.notebook_code import notebook_function, notebook_path

EXPERIMENTS = {"against_sdpa": "run_equivalence", "attention_quality": "run_quality",
               "attention_times": "run_timing"}  # notebook function -> the chapter's run_<part> that executes it


def _part(name: str):
    """The chapter package's module for one part (``equivalence``, ``quality``, ``timing``): where it looks
    up the notebook's experiment."""
    return importlib.import_module(f"{ch07.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch):
    sizes, lm = ch07.sizes("cpu", "quick"), SimpleNamespace(name="stub-lm", device=torch.device("cpu"))
    (name, args), = experiment_calls(monkeypatch, _part("equivalence"), ch07.run_equivalence, stop_at="against_sdpa")
    assert name == "against_sdpa" and (args["tokens"], tuple(args["kv_heads"]), args["window"]) == (
        ch07.EQUIVALENCE_TOKENS, tuple(ch07.EQUIVALENCE_KV_HEADS), ch07.EQUIVALENCE_WINDOW)
    (name, args), = experiment_calls(monkeypatch, _part("quality"), ch07.run_quality, lm, sizes, stop_at="attention_quality")
    assert name == "attention_quality" and args["lm"] is lm and args["eval_tokens"] == sizes.eval_tokens
    (name, args), = experiment_calls(monkeypatch, _part("timing"), ch07.run_timing, lm, sizes, stop_at="attention_times")
    assert name == "attention_times" and args["device"] == lm.device
    assert (args["lengths"], args["cached_tokens"], args["kv_heads"]) == (sizes.sdpa_lengths, sizes.decode_context,
                                                                         sizes.decode_kv_heads)


def test_the_equivalence_cell_as_shipped_checks_what_the_chapter_checks():
    """The page's cell starts at the chapter's numbers: the same rows, to the last bit."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    _, defs = _shipped_notebook().equivalence_cell.run(ch07=ch07, mo=mo, nb=nb,
                                                       equivalence_button=SimpleNamespace(value=True))
    assert defs["equivalence"] == ch07.run_equivalence()


def test_attention_quality_hands_back_what_the_library_measured(monkeypatch):
    experiment = notebook_function("07", "attention_quality")
    measured, calls = [object()], []

    def measure_variant_quality(lm, **options):
        calls.append((lm, options))
        return measured

    monkeypatch.setitem(experiment.__globals__, "measure_variant_quality", measure_variant_quality)
    text_model = SimpleNamespace(tokenizer=object(), is_random=False)
    assert experiment(text_model, 64, 8, ("mqa",)) is measured
    assert calls[0][0] is text_model and calls[0][1]["window"] == 8
    assert experiment(SimpleNamespace(tokenizer=None, is_random=True), 64, 8, ("mqa",)) == [] and len(calls) == 1


def test_the_page_shows_the_online_softmax_tile_that_flash_attention_runs(monkeypatch):
    shown = ch07.flash_tile_code()
    shows_the_real_code(shown, online_softmax_tile)
    assert len(shown.splitlines()) <= 30
    folded = []

    def counted_tile(*args, **options):
        folded.append(1)
        return online_softmax_tile(*args, **options)

    monkeypatch.setitem(flash_attention.__globals__, "online_softmax_tile", counted_tile)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    out = flash_attention(q, k, v, block_q=4, block_k=4)
    assert folded and torch.allclose(out, sdpa_attention(q, k, v, causal=False), atol=1e-5)  # the tile shown runs


def test_the_tile_step_is_what_makes_tiles_exact():
    """Folding keys in one tile at a time equals SDPA; skipping the rescale (a near miss) does not."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    reference = sdpa_attention(q, k, v, causal=False)
    scores = (q @ k.transpose(-2, -1)) / 8 ** 0.5
    state = (torch.full((1, 2, 10, 1), float("-inf")), torch.zeros(1, 2, 10, 1), torch.zeros(1, 2, 10, 8))
    for start in range(0, 10, 4):
        state = online_softmax_tile(scores[..., start:start + 4], v[..., start:start + 4, :], *state)
    assert torch.allclose(state[2] / state[1], reference, atol=1e-5)


    def forgets_to_rescale_the_output(scores, v_tile, running_max, running_sum, output_acc):
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        probs = torch.exp(scores - new_max)
        running_sum = running_sum * torch.exp(running_max - new_max) + probs.sum(dim=-1, keepdim=True)
        return new_max, running_sum, output_acc + probs @ v_tile  # the near miss: no correction here

    state = (torch.full((1, 2, 10, 1), float("-inf")), torch.zeros(1, 2, 10, 1), torch.zeros(1, 2, 10, 8))
    for start in range(0, 10, 4):
        state = forgets_to_rescale_the_output(scores[..., start:start + 4], v[..., start:start + 4, :], *state)
    assert not torch.allclose(state[2] / state[1], reference, atol=1e-3)


def test_a_longer_sequence_in_the_cell_still_equals_sdpa_across_tiles(tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    shipped = ch07.run_equivalence()
    cell = edited_notebook("07", tmp_path, tokens=150).equivalence_cell
    _, defs = cell.run(ch07=ch07, mo=mo, nb=nb, equivalence_button=SimpleNamespace(value=True))
    rows = defs["equivalence"]
    assert [(r.variant, r.path) for r in rows] == [(r.variant, r.path) for r in shipped]
    assert len(rows) == 10 and all(r.equal for r in rows), [r for r in rows if not r.equal]
    # 150 tokens: the flash path folds three key tiles per query row instead of one, and the
    # differences grow with the work, still far inside the fp32 tolerance
    worst = max(max(r.prefill_max_abs_diff, r.decode_max_abs_diff) for r in rows)
    assert worst > max(max(r.prefill_max_abs_diff, r.decode_max_abs_diff) for r in shipped)


@pytest.mark.slow
def test_mqa_caches_a_third_of_gqa3_and_a_window_costs_perplexity(embedded):
    rows = notebook_function("07", "attention_quality")(embedded, 64, 8, ("mqa", "window"))
    quality = ch07.quality_result(embedded, rows, 64)
    own, mqa, window = quality.rows
    assert own.variant.startswith("GQA-3") and mqa.variant.startswith("MQA")
    assert mqa.kv_bytes_per_token * 3 == own.kv_bytes_per_token  # 3 KV heads pooled into 1: exactly a third
    assert window.perplexity > own.perplexity and mqa.perplexity > 2 * own.perplexity
    assert "sliding window 8" in window.variant


def test_decode_kv_bytes_follow_the_kv_heads():
    """Counted, not timed: the bytes each decode step reads scale with the KV heads (tiny shapes)."""
    backends, decode, bandwidth = notebook_function("07", "attention_times")(
        torch.device("cpu"), (64,), 4, 16, 256, (1, 4), 1)
    assert [d.kv_bytes for d in decode] == [2 * kv * 256 * 16 * 4 for kv in (1, 4)]
    assert bandwidth > 0 and all(d.predicted_s == pytest.approx(d.kv_bytes / bandwidth) for d in decode)
    assert any(b.available for b in backends)
    sizes = ch07.sizes("cpu", "quick")
    assert sizes.decode_kv_heads[-1] // sizes.decode_kv_heads[0] >= 8  # the page's predicted ratio is large


def test_the_flash_controls_start_at_the_gpus_shared_memory_and_drive_the_table():
    """Part 6's slider starts at the chosen GPU's shared memory per thread block; moving it, or the mask
    switch, changes the tile and the saving the page shows."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    module = _shipped_notebook()
    t4 = SimpleNamespace(value="T4")
    _, controls = module.flash_controls.run(ch07=ch07, gpu=t4, mo=mo)
    assert controls["shared_kib"].value * 1024 == ch07.flash_tiling("T4").sram_bytes and controls["causal"].value

    def shown(kib: int, causal: bool):
        _, defs = module.flash_cell.run(ch07=ch07, gpu=t4, mo=mo, nb=nb, shared_kib=SimpleNamespace(value=kib),
                                        causal=SimpleNamespace(value=causal))
        return defs["flash"]

    own, less, unmasked = shown(64, True), shown(32, True), shown(64, False)
    assert own.tiling.sram_of.endswith("on T4") and own.tiling.block_q == 64
    assert less.tiling.sram_of == "set by hand" and less.tiling.block_q == 32
    assert less.rows[-1].naive_over_tiled < own.rows[-1].naive_over_tiled
    assert unmasked.rows[-1].naive_over_tiled < own.rows[-1].naive_over_tiled  # no skipped key tiles


def _shipped_notebook():
    """Notebook 07 imported as a module, as shipped."""
    spec = importlib.util.spec_from_file_location("nb07_shipped", notebook_path("07"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb07_shipped"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb07_shipped", None)
    return module


@pytest.mark.parametrize(("runner", "experiment", "defining"), [
    ("run_equivalence", "against_sdpa", "equivalence"), ("run_quality", "attention_quality", "quality")])
def test_each_cell_as_shipped_makes_the_chapters_call(monkeypatch, embedded, tmp_path, runner, experiment, defining):
    """The page's cells and the chapter's runners read the sequence, the K/V heads and the windows from
    one home (the chapter): each cell as shipped hands its experiment what the tour hands it."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes, pressed = ch07.sizes("cpu", "quick"), SimpleNamespace(value=True)
    page = cell_call("07", tmp_path, experiment, dict(ch07=ch07, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                                                      equivalence_button=pressed, quality_button=pressed,
                                                      gpu=SimpleNamespace(value=ch07.DEFAULT_GPU),
                                                      context=SimpleNamespace(value=ch07.DEFAULT_CONTEXT)), defining)
    assert page == chapter_call(monkeypatch, getattr(ch07, runner), embedded, sizes, experiment=experiment)
