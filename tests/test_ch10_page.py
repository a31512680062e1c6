"""Notebook 10's page is the experiment: ``tokens_reused`` and ``serve_waves`` in the notebook run the
engine, the chapter module only shows them, the quick size shows the effect the headings promise,
and changing a number in the notebook's experiment cell changes the result as the chapter says."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from page_helpers import (
    RecordingEngine,
    edited_notebook,
    experiment_calls,
    shows_the_real_code,
)

from infer_lab.course import ch10_prefix_caching as ch10
from infer_lab.course.notebook_code import notebook_function
from infer_lab.engine.prefix_cache import RadixPrefixCache


def _part(name: str):
    """The chapter package's module for one part (``granularity``, ``workloads``): where it looks up the
    notebook's experiment."""
    return importlib.import_module(f"{ch10.__name__}.{name}")


def test_the_chapter_runs_the_notebooks_experiments_with_its_sizes(monkeypatch, embedded):
    sizes = ch10.sizes("cpu", "quick")
    (name, args), = experiment_calls(monkeypatch, _part("granularity"), ch10.run_granularity, embedded, sizes, stop_at="tokens_reused")
    assert name == "tokens_reused" and args["lm"] is embedded and args["cache"] == ch10.CACHES[0]
    assert args["block_size"] == sizes.match_block and args["prompt_len"] == sizes.match_blocks * sizes.match_block
    (_, args), = experiment_calls(monkeypatch, _part("granularity"), ch10.run_granularity, embedded, sizes, 1, [5],
                                  stop_at="tokens_reused")
    assert (args["block_size"], args["shared"]) == (1, 5)  # the knobs asked for, not the defaults
    (name, args), = experiment_calls(monkeypatch, _part("workloads"), ch10.run_workloads, embedded, sizes, stop_at="serve_waves")
    assert name == "serve_waves" and args["cache"] == "none" and args["block_size"] == sizes.block_size
    assert args["waves"] == next(iter(ch10.workload_waves(embedded, sizes).values()))  # the chapter's workload
    (_, args), = experiment_calls(monkeypatch, _part("workloads"), ch10.run_workloads, embedded, sizes, 48, 4, stop_at="serve_waves")
    assert args["waves"] == next(iter(ch10.workload_waves(embedded, sizes, 48).values())) and args["block_size"] == 4
    assert not hasattr(ch10, "measure_workloads") and not hasattr(ch10, "measure_granularity")  # old wrappers gone


class _RecordingEngine(RecordingEngine):
    """The engine's stand-in, with outputs that say ``cached`` prompt tokens were found (no model runs)."""

    cached = 7

    def output(self, prompt):
        return SimpleNamespace(num_cached_prompt_tokens=self.cached, token_ids=[])


@pytest.mark.parametrize("cache", ch10.CACHES)
def test_tokens_reused_hands_the_cache_and_block_to_the_engine_and_reports_its_count(monkeypatch, embedded, cache):
    tokens_reused = notebook_function("10", "tokens_reused")
    monkeypatch.setattr(_RecordingEngine, "made", [])
    monkeypatch.setitem(tokens_reused.__globals__, "Engine", _RecordingEngine)
    assert tokens_reused(embedded, cache, 4, 16, 8) == _RecordingEngine.cached  # the engine's own count
    config = _RecordingEngine.made[-1].config
    assert (config.prefix_cache, config.block_size) == (cache, 4) and config.max_model_len >= 16 + 1


def test_the_page_shows_the_radix_trees_real_match():
    shown = ch10.radix_match_code()
    shows_the_real_code(shown, RadixPrefixCache.match)
    assert len(shown.splitlines()) <= 32  # short enough for a slide


@pytest.fixture(scope="module")
def quick_workloads(tour_runs) -> ch10.WorkloadsResult:
    """The notebook's experiment as the tour runs it: quick sizes, the cell's numbers."""
    return tour_runs.part("ch10_prefix_caching", "workloads")


def test_caches_save_prefill_and_radix_saves_more_at_quick_size(quick_workloads):
    w = quick_workloads
    for name in w.workloads():
        none, hash_, radix = (w.run(name, c) for c in ("none", "hash", "radix"))
        assert none.prefill_tokens_computed == none.prompt_tokens and none.hit_rate == 0
        assert hash_.prompt_tokens == radix.prompt_tokens == none.prompt_tokens
        # a cache saves at least a quarter of the prefill, and radix at least a block more than hash
        assert radix.prefill_tokens_computed <= hash_.prefill_tokens_computed <= 0.75 * none.prompt_tokens
        assert radix.prefill_tokens_saved >= hash_.prefill_tokens_saved + 8
    s = ch10.sizes("cpu", "quick")
    shared = {c: w.run("shared_system_prompt", c).prefill_tokens_saved for c in ch10.CACHES}
    assert shared == ch10.shared_prompt_prediction(s.users, s.system_len, s.block_size)  # as predicted
    assert "predicted vs measured: hash 96 vs 96" in ch10.workloads_text(w)
    # the chat's next turn and the agent's review quote the replies the engine generated, and the
    # radix tree hands back all of each reply but its last token (whose K/V was never computed)
    chat, agentic = w.run("multi_turn_chat", "radix"), w.run("agentic_branching", "radix")
    assert chat.generated_tokens_reused == sum(s.conversations * (k * s.output_len - 1) for k in range(1, s.turns))
    assert agentic.generated_tokens_reused == s.branches * (s.output_len - 1)
    assert "tokens the model had generated" in ch10.workloads_text(w)


@pytest.mark.slow
def test_one_token_blocks_in_the_cell_make_hash_match_every_token_as_the_page_says(embedded, tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch10.sizes("cpu", "quick")
    assert "set `block_size = 1`" in ch10.granularity_note(sizes.match_block)  # what the page tells the learner
    cell = edited_notebook("10", tmp_path, block_size=1).granularity_experiment
    _, defs = cell.run(ch10=ch10, lm=embedded, mo=mo, nb=nb, sizes=sizes, match_button=SimpleNamespace(value=True))
    match = defs["match"]
    assert match.block_size == 1 and match.granularity("hash") == match.granularity("radix") == "token"
    assert "matched alike" in ch10.granularity_text(match)


@pytest.mark.slow
def test_a_system_prompt_of_whole_blocks_removes_radixs_lead_as_the_chapter_says(embedded, tmp_path, quick_workloads):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch10.sizes("cpu", "quick")
    assert sizes.system_len % sizes.block_size  # the cell's system prompt ends inside a block...
    before = {c: quick_workloads.run("shared_system_prompt", c).prefill_tokens_saved for c in ch10.CACHES}
    assert before["radix"] > before["hash"]  # ...so radix saves more there
    cell = edited_notebook("10", tmp_path, system_len=48).workloads_experiment
    _, defs = cell.run(ch10=ch10, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                       workloads_button=SimpleNamespace(value=True))
    w = defs["workloads"]
    after = {c: w.run("shared_system_prompt", c).prefill_tokens_saved for c in ch10.CACHES}
    # 48 tokens are three whole 16-token blocks: both caches find all of it for every later user
    assert w.system_len == 48 and after["hash"] == after["radix"] == (sizes.users - 1) * 48
    assert "They saved the same on shared system prompt" in ch10.workloads_text(w)
