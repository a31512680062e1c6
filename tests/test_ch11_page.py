"""Notebook 11's page is the experiment: ``serve`` in the notebook runs the engine, the chapter module
only shows it, the quick size shows the long prompt no longer stalling the decoders (counted in
tokens per step), and changing the budget in the notebook's cell changes the chunks as the chapter says."""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from types import SimpleNamespace

import pytest

from infer_lab.course import ch11_chunked_prefill as ch11
from infer_lab.course.notebook_code import notebook_function, notebook_path
from infer_lab.engine.scheduler import Scheduler, split_budget

BUDGET = "    budget = sizes.chunk_tokens  # chunked prefill's token budget per step"


def test_the_experiment_runs_from_the_notebook_file():
    serve = notebook_function("11", "serve")
    assert inspect.getsourcefile(serve) == str(notebook_path("11"))
    code = inspect.getsource(serve)
    assert "EngineConfig(max_num_seqs=len(workload.prompts), chunked_prefill=token_budget is not None" in code
    assert "Engine.from_loaded(lm, config)" in code and "engine.step_log" in code
    assert "arrival_steps=workload.arrival_steps" in code
    assert len(code.splitlines()) <= 15
    assert 'notebook_function(NUMBER, "serve")' in inspect.getsource(ch11.run_chunking)
    source = notebook_path("11").read_text()
    assert BUDGET in source and "ch11.measure" not in source and not hasattr(ch11, "measure_chunking")


def test_the_page_shows_the_schedulers_real_step():
    shown = ch11.schedule_code()
    assert inspect.getsource(Scheduler.schedule).strip().splitlines()[0] in shown
    # the split (stage 4 of the build track) is shown, and the step that calls it
    assert inspect.getsource(split_budget).splitlines()[0] in shown and "split = split_budget(" in shown
    assert "n = min(n, budget)" in shown and "self.admit(out, budget)" in shown
    assert '"""' not in shown and len(shown.splitlines()) <= 36


@pytest.fixture(scope="module")
def quick(tour_runs) -> ch11.ChunkingResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's numbers."""
    return tour_runs.part("ch11_chunked_prefill", "chunking")


def test_chunking_keeps_every_step_small_and_the_decoders_decoding_at_quick_size(quick):
    s = ch11.sizes("cpu", "quick")
    whole, chunked = quick.run(False), quick.run(True)
    # without chunking one step computes the whole prompt beside every decoder's token
    assert whole.long_prefill_steps == 1 and whole.chunk_tokens is None
    assert max(p.prefill_tokens for p in quick.steps_of(False)) == s.long_prompt
    assert whole.max_step_tokens == s.long_prompt + s.decoders
    # with chunking no step is over the budget, at least 5x smaller than that step...
    assert chunked.max_step_tokens <= s.chunk_tokens and whole.max_step_tokens >= 5 * chunked.max_step_tokens
    after = [p for p in quick.steps_of(True) if p.step >= s.arrive_at_step]
    assert sum(p.prefill_tokens for p in after) == s.long_prompt  # ...the whole prompt, in chunks
    assert chunked.long_prefill_steps >= math.ceil(s.long_prompt / (s.chunk_tokens - s.decoders))
    # ...and every chunk rode along with the decoders: none of them skipped a step while it lasted
    prefill_steps = [p for p in after if p.prefill_tokens]
    assert all(p.decode_tokens == s.decoders for p in prefill_steps[1:])
    for run in quick.runs:
        assert run.decoder_itl_max_s >= run.decoder_itl_p50_s > 0 and run.long_ttft_s > 0
    text = ch11.chunking_text(quick)
    assert "predicted vs measured: 259 vs 259 tokens whole, 32 vs 32 chunked" in text


def _edited_notebook(tmp_path, old: str, new: str):
    """Notebook 11 with one line of its experiment cell changed, imported as a module (marimo's own API)."""
    source = notebook_path("11").read_text()
    assert source.count(old) == 1
    path = tmp_path / "nb10_edited.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("nb10_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb10_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb10_edited", None)
    return module


@pytest.mark.slow
def test_a_bigger_budget_gives_fewer_bigger_chunks_as_the_chapter_says(embedded, tmp_path, quick):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    sizes = ch11.sizes("cpu", "quick")
    cell = _edited_notebook(tmp_path, BUDGET, BUDGET.replace("sizes.chunk_tokens", "128")).chunking_experiment
    _, defs = cell.run(ch11=ch11, lm=embedded, mo=mo, nb=nb, sizes=sizes, chunk_button=SimpleNamespace(value=True))
    bigger = defs["chunking"]
    assert bigger.sizes.chunk_tokens == 128
    before, after = quick.run(True), bigger.run(True)
    assert after.max_step_tokens == 128 > before.max_step_tokens  # bigger chunks...
    assert math.ceil(sizes.long_prompt / (128 - sizes.decoders)) == after.long_prefill_steps
    assert after.long_prefill_steps < before.long_prefill_steps  # ...in fewer steps
    assert bigger.run(False).max_step_tokens == quick.run(False).max_step_tokens  # the unchunked run is the same
