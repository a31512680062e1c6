"""Notebook 08's page is the experiment: its three ``@app.function`` call the engine, the
simulator and the engine's allocators directly, the chapter module only shows them, each part's
count moves the way its heading says, and changing the block size in the notebook's cell changes
the result the way the chapter says it does."""

from __future__ import annotations

import importlib

import pytest
from page_helpers import edited_notebook, experiment_calls, shows_the_real_code

from infer_lab.course import ch08_kv_cache_paged as ch08
from infer_lab.course.notebook_code import notebook_function
from infer_lab.engine.kv_cache import paged_slots

EXPERIMENTS = {"generate_step_by_step": "run_cache", "where_memory_goes": "run_waste", "fill_until_full": "run_fit"}


def _part(name: str):
    """The chapter package's module for one part (``cache``, ``waste``, ``fit``): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch08.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch, embedded):
    sizes = ch08.sizes("cpu", "quick")
    (name, args), = experiment_calls(monkeypatch, _part("cache"), ch08.run_cache, embedded, sizes, stop_at="generate_step_by_step")
    assert name == "generate_step_by_step" and args["lm"] is embedded and args["kv_mode"] == ch08.KV_MODES[0]
    assert args["prompt"] == ch08.cache_prompt(embedded, sizes) and args["new_tokens"] == sizes.new_tokens
    settings = sizes.waste
    prompts, outputs = settings.lengths()
    (name, args), = experiment_calls(monkeypatch, _part("waste"), ch08.run_waste, settings, stop_at="where_memory_goes")
    assert name == "where_memory_goes" and (args["prompts"], args["outputs"]) == (prompts, outputs)
    assert args["budget_slots"] == ch08.budget_slots(settings) and args["block_size"] == settings.block_size
    (name, args), = experiment_calls(monkeypatch, _part("fit"), ch08.run_fit, settings, stop_at="fill_until_full")
    assert name == "fill_until_full" and (args["prompts"], args["outputs"]) == (prompts, outputs)


def test_the_page_shows_the_engines_real_slot_lookup():
    from infer_lab.engine.block_manager import BlockManager, paged_blocks_needed

    shown = ch08.paging_code()
    shows_the_real_code(shown, paged_slots, paged_blocks_needed, BlockManager.grow)  # BlockManager.grow: the pool hands out blocks
    assert len(shown.splitlines()) <= 30  # short enough for a slide


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


def test_a_larger_block_in_the_cell_wastes_more_and_fits_fewer(tmp_path, settings):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    prompts, outputs = settings.lengths()

    def fit_with(**knob) -> ch08.FitResult:
        cell = edited_notebook("08", tmp_path, **knob).fill_the_budget
        _, defs = cell.run(ch08=ch08, mo=mo, nb=nb, outputs=outputs, prompts=prompts, settings=settings)
        return defs["fit"]

    before = fit_with()  # the cell as shipped: the chapter's block size
    assert before == ch08.run_fit(settings)
    after = fit_with(block_size=1024)
    assert after.block_size == 1024
    # as the chapter says: the tail of each request's last block grows with the block, so fewer fit
    assert after.row("paged").wasted_fraction >= 5 * before.row("paged").wasted_fraction
    assert after.fits("paged") < before.fits("paged")
    assert after.row("contiguous") == before.row("contiguous")  # the contiguous cache has no blocks
