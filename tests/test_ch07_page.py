"""Notebook 07's page is the experiment: its ``@app.function`` experiments call :mod:`infer_lab.attention`
and :mod:`infer_lab.bench` directly, the chapter module only shows what they return, the page shows the
real online-softmax tile, and changing a number in the equivalence cell changes what is checked."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest
import torch

from infer_lab.attention import flash_attention, online_softmax_tile, sdpa_attention
from infer_lab.course import ch07_attention_variants as ch07
from infer_lab.course.notebook_code import notebook_function, notebook_path

EXPERIMENTS = {  # notebook function -> the chapter's run_<part> that executes it, and a library call it makes
    "against_sdpa": (ch07.run_equivalence, "diff_from_sdpa(layer, x, prefix, backend=path)"),
    "attention_quality": (ch07.run_quality, "measure_variant_quality(lm, eval_tokens=eval_tokens"),
    "attention_times": (ch07.run_timing, "decode_attention_vs_kv_heads(cached_tokens"),
}
TOKENS_LINE = "    tokens = 12  # sequence length"


def test_every_experiment_runs_from_the_notebook_file():
    source = notebook_path("07").read_text()
    assert "ch07.measure_" not in source  # no wrapper between the page and the library
    for name, (runner, call) in EXPERIMENTS.items():
        fn = notebook_function("07", name)
        assert inspect.getsourcefile(fn) == str(notebook_path("07"))
        code = inspect.getsource(fn)
        assert call in code and len(code.splitlines()) <= 15
        assert f'notebook_function(NUMBER, "{name}")' in inspect.getsource(runner)
    assert source.count(TOKENS_LINE) == 1 and ch07.EQUIVALENCE_TOKENS == 12
    assert "grouped_kv_heads = (2, 1)" in source and ch07.EQUIVALENCE_KV_HEADS == (2, 1)


def test_the_page_shows_the_online_softmax_tile_that_flash_attention_runs():
    shown = ch07.flash_tile_code()
    assert inspect.getsource(online_softmax_tile).splitlines()[0] in shown
    assert "correction = torch.exp(running_max - safe_max)" in shown
    assert '"""' not in shown and len(shown.splitlines()) <= 30
    assert "online_softmax_tile(" in inspect.getsource(flash_attention)  # the tile shown is the one that runs


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


def _edited_notebook(tmp_path, old: str, new: str):
    """Notebook 07 with one line of a cell changed, imported as a module (marimo's own API)."""
    source = notebook_path("07").read_text()
    assert source.count(old) == 1
    path = tmp_path / "nb06_edited.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("nb06_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb06_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb06_edited", None)
    return module


def test_a_longer_sequence_in_the_cell_still_equals_sdpa_across_tiles(tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    shipped = ch07.run_equivalence()
    cell = _edited_notebook(tmp_path, TOKENS_LINE, TOKENS_LINE.replace("= 12", "= 150")).equivalence_cell
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

    from infer_lab import nb

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
