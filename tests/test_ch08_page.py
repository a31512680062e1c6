"""Notebook 08's page is the experiment: its three ``@app.function`` call the engine, the
simulator and the engine's allocators directly, the chapter module only shows them, each part's
count moves the way its heading says, and changing the block size in the notebook's cell changes
the result the way the chapter says it does."""

from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest

from infer_lab.course import ch08_kv_cache_paged as ch08
from infer_lab.course.notebook_code import notebook_function, notebook_path
from infer_lab.engine.kv_cache import paged_slots

CELL_NUMBER = "    block_size = 16  # tokens per block"
EXPERIMENTS = {
    "generate_step_by_step": ("run_cache", ["EngineConfig(kv_mode=kv_mode", "Engine.from_loaded(lm, config)",
                                            "engine.step_log"]),
    "where_memory_goes": ("run_waste", ["make_requests(", "simulate(make_layout(name, budget_slots"]),
    "fill_until_full": ("run_fit", ["cache.can_allocate(", "cache.allocate(", "cache.memory_report(held)"]),
}


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_each_experiment_runs_from_the_notebook_file(name):
    function = notebook_function("08", name)
    assert inspect.getsourcefile(function) == str(notebook_path("08"))
    code = inspect.getsource(function)
    runner, calls = EXPERIMENTS[name]
    assert all(call in code for call in calls), code
    assert len(code.splitlines()) <= 15
    assert f'notebook_function(NUMBER, "{name}")' in inspect.getsource(getattr(ch08, runner))
    source = notebook_path("08").read_text()
    assert "ch08.measure" not in source and CELL_NUMBER in source


def test_the_page_shows_the_engines_real_slot_lookup():
    shown = ch08.paging_code()
    assert inspect.getsource(paged_slots).splitlines()[0] in shown
    assert "block_table[p // block_size] * block_size + p % block_size" in shown
    assert "self.free_list.popleft()" in shown  # the block pool handing out a block
    assert '"""' not in shown and len(shown.splitlines()) <= 30  # no docstrings; short enough for a slide


def test_no_cache_computes_the_context_again_every_step(embedded):
    """Part 1's count: tokens computed, a small run (the quick size's 16 + 16 is the same shape)."""
    generate = notebook_function("08", "generate_step_by_step")
    prompt = list(range(100, 108))
    runs = {mode: generate(embedded, prompt, 6, mode) for mode in ch08.KV_MODES}
    cache = ch08.cache_result(runs, len(prompt), embedded)
    nocache, paged = (t.tokens_computed for t in cache.totals())
    assert (nocache, paged) == ch08.predicted_tokens_computed(8, 6) == (6 * 8 + 15, 13)
    assert [p.tokens_computed for p in cache.steps("paged", "decode")] == [1] * 5
    assert nocache >= 4 * paged  # and the gap grows with the square of the new tokens
    assert "predicted 63 = 6·8 + 6·5/2 and 13 = 8 + 6 − 1" in ch08.cache_text(cache)


@pytest.fixture(scope="module")
def settings() -> ch08.WasteSettings:
    return ch08.sizes("cpu", "quick").waste


def test_paging_wastes_far_less_and_finishes_sooner_at_quick_size(settings):
    waste = ch08.run_waste(settings)
    cmax, exact, paged = (waste.layout(n) for n in ("contiguous-max", "contiguous-exact", "paged"))
    assert cmax.wasted_fraction >= 0.5 and exact.wasted_fraction >= 0.3
    assert paged.wasted_fraction <= 0.05
    assert exact.external_frag_bytes > 0 == paged.external_frag_bytes
    assert paged.steps <= 0.6 * cmax.steps and paged.mean_running >= 2 * cmax.mean_running


def test_paged_blocks_fit_several_times_the_requests_at_quick_size(settings):
    fit = ch08.run_fit(settings)
    contiguous, paged = fit.row("contiguous"), fit.row("paged")
    assert contiguous.requests_that_fit >= 1 and paged.requests_that_fit >= 4 * contiguous.requests_that_fit
    assert contiguous.capacity_bytes == paged.capacity_bytes == settings.budget_bytes  # one budget, both caches
    assert contiguous.wasted_fraction >= 0.5 and paged.wasted_fraction <= 0.05
    prompts, outputs = settings.lengths()
    held = paged.requests_that_fit
    per_token = 2 * 32 * 8 * 128 * 2  # mistral-7b: K and V, 32 layers, 8 KV heads, head_dim 128, bf16
    assert paged.used_bytes == sum(prompts[:held]) * per_token + sum(outputs[:held]) * per_token
    text = ch08.fit_text(fit)
    assert f"**{contiguous.requests_that_fit}**" in text and f"**{paged.requests_that_fit}**" in text


def _edited_notebook(tmp_path, block_size: int):
    """Notebook 08 with its part-3 cell's block size changed, imported as a module (marimo's own API)."""
    source = notebook_path("08").read_text()
    assert source.count(CELL_NUMBER) == 1
    path = tmp_path / "nb07_edited.py"
    path.write_text(source.replace(CELL_NUMBER, CELL_NUMBER.replace("= 16", f"= {block_size}")))
    spec = importlib.util.spec_from_file_location("nb07_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb07_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb07_edited", None)
    return module


def test_a_larger_block_in_the_cell_wastes_more_and_fits_fewer(tmp_path, settings):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    before = ch08.run_fit(settings)  # the cell's 16
    cell = _edited_notebook(tmp_path, 1024).fill_the_budget
    prompts, outputs = settings.lengths()
    _, defs = cell.run(ch08=ch08, mo=mo, nb=nb, outputs=outputs, prompts=prompts, settings=settings)
    after = defs["fit"]
    assert after.block_size == 1024
    # as the chapter says: the tail of each request's last block grows with the block, so fewer fit
    assert after.row("paged").wasted_fraction >= 5 * before.row("paged").wasted_fraction
    assert after.fits("paged") < before.fits("paged")
    assert after.row("contiguous") == before.row("contiguous")  # the contiguous cache has no blocks
