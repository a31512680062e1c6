"""Notebook 11's page is the experiment: ``serve`` in the notebook runs the engine, the chapter module
only shows it, the quick size shows the long prompt no longer stalling the decoders (counted in
tokens per step), and changing the budget in the notebook's cell changes the chunks as the chapter says."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace

import pytest
from page_helpers import RecordingEngine, edited_notebook, shows_the_real_code

from infer_lab.course import ch11_chunked_prefill as ch11
from infer_lab.course.notebook_code import notebook_function
from infer_lab.engine.scheduler import Scheduler, split_budget


def test_the_chapter_runs_the_notebooks_experiment_without_and_with_the_budget(monkeypatch, embedded):
    sizes = ch11.sizes("cpu", "quick")
    calls = []

    def serve(lm, workload, max_num_batched_tokens):
        calls.append((lm, workload, max_num_batched_tokens))
        return [], []

    part = importlib.import_module(f"{ch11.__name__}.chunking")  # the package's file that runs the experiment
    monkeypatch.setattr(part, "notebook_function", lambda number, name: {("11", "serve"): serve}[(number, name)])
    monkeypatch.setattr(part, "chunking_result", lambda *args: args)  # what the runner hands on, unshaped
    ch11.run_chunking(embedded, sizes)
    assert [budget for _, _, budget in calls] == [None, sizes.max_num_batched_tokens]  # whole, then the cell's budget
    lm, workload, _ = calls[0]
    assert lm is embedded and all(w is workload for _, w, _ in calls)  # the same requests both times
    assert len(workload.prompts) == sizes.decoders + 1 and max(map(len, workload.prompts)) == sizes.long_prompt
    assert not hasattr(ch11, "measure_chunking")  # the old wrapper is gone


class _RecordingEngine(RecordingEngine):
    """The engine's stand-in; each prompt's output is a marker."""

    def output(self, prompt):
        return "output"


@pytest.mark.parametrize("budget", [None, 64])
def test_serve_hands_the_budget_and_the_arrivals_to_the_engine(monkeypatch, budget):
    serve = notebook_function("11", "serve")
    monkeypatch.setattr(_RecordingEngine, "made", [])
    monkeypatch.setitem(serve.__globals__, "Engine", _RecordingEngine)
    workload = SimpleNamespace(prompts=[[1] * 5, [2] * 300], output_lens=[4, 2], arrival_steps=[0, 3])
    steps, outputs = serve(None, workload, budget)
    assert steps == ["step"] and outputs == ["output", "output"]  # the engine's step log and outputs
    measured = _RecordingEngine.made[-1]
    assert measured.config.chunked_prefill is (budget is not None)
    if budget is not None:
        assert measured.config.max_num_batched_tokens == budget
    call, = measured.generated
    assert call["prompts"] == workload.prompts and [p.max_tokens for p in call["params"]] == workload.output_lens
    assert call["arrival_steps"] == workload.arrival_steps  # the long prompt arrives late, as the cell asks


def test_the_page_shows_the_schedulers_real_step():
    shown = ch11.schedule_code()
    shows_the_real_code(shown, split_budget, Scheduler.schedule)  # the split (stage 4 of the build track) and its caller
    assert len(shown.splitlines()) <= 36  # short enough for a slide


@pytest.fixture(scope="module")
def quick(tour_runs) -> ch11.ChunkingResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's numbers."""
    return tour_runs.part("ch11_chunked_prefill", "chunking")


def test_chunking_keeps_every_step_small_and_the_decoders_decoding_at_quick_size(quick):
    s = ch11.sizes("cpu", "quick")
    whole, chunked = quick.run(False), quick.run(True)
    # without chunking one step computes the whole prompt beside every decoder's token
    assert whole.long_prefill_steps == 1 and whole.max_num_batched_tokens is None
    assert max(p.prefill_tokens for p in quick.steps_of(False)) == s.long_prompt
    assert whole.max_step_tokens == s.long_prompt + s.decoders
    # with chunking no step is over the budget, at least 5x smaller than that step...
    assert chunked.max_step_tokens <= s.max_num_batched_tokens and whole.max_step_tokens >= 5 * chunked.max_step_tokens
    after = [p for p in quick.steps_of(True) if p.step >= s.arrive_at_step]
    assert sum(p.prefill_tokens for p in after) == s.long_prompt  # ...the whole prompt, in chunks
    assert chunked.long_prefill_steps >= math.ceil(s.long_prompt / (s.max_num_batched_tokens - s.decoders))
    # ...and every chunk rode along with the decoders: none of them skipped a step while it lasted
    prefill_steps = [p for p in after if p.prefill_tokens]
    assert all(p.decode_tokens == s.decoders for p in prefill_steps[1:])
    for run in quick.runs:
        assert run.decoder_itl_max_s >= run.decoder_itl_p50_s > 0 and run.long_ttft_s > 0
    text = ch11.chunking_text(quick)
    predicted = ch11.predicted_step_tokens(s.long_prompt, s.decoders, s.max_num_batched_tokens)
    assert (f"predicted vs measured: {predicted[False]:,} vs {predicted[False]:,} tokens whole, "
            f"{predicted[True]} vs {predicted[True]} chunked") in text
    # the spike named is the step that carried the long prefill, found by its tokens
    spike = quick.prefill_step(False)
    assert spike.prefill_tokens == s.long_prompt and spike.step == s.arrive_at_step
    assert f"one step (step {spike.step}) of {spike.tokens:,} tokens" in text


@pytest.mark.slow
def test_a_bigger_budget_gives_fewer_bigger_chunks_as_the_chapter_says(embedded, tmp_path, quick):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch11.sizes("cpu", "quick")
    bigger_budget = 2 * sizes.max_num_batched_tokens
    cell = edited_notebook("11", tmp_path, max_num_batched_tokens=bigger_budget).chunking_experiment
    _, defs = cell.run(ch11=ch11, lm=embedded, mo=mo, nb=nb, sizes=sizes, chunk_button=SimpleNamespace(value=True))
    bigger = defs["chunking"]
    assert bigger.sizes.max_num_batched_tokens == bigger_budget
    before, after = quick.run(True), bigger.run(True)
    assert after.max_step_tokens == bigger_budget > before.max_step_tokens  # bigger chunks...
    assert math.ceil(sizes.long_prompt / (bigger_budget - sizes.decoders)) == after.long_prefill_steps
    assert after.long_prefill_steps < before.long_prefill_steps  # ...in fewer steps
    assert bigger.run(False).max_step_tokens == quick.run(False).max_step_tokens  # the unchunked run is the same
