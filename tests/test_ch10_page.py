"""Notebook 10's page is the experiment: ``tokens_reused`` and ``serve_waves`` in the notebook run the
engine, the chapter module only shows them, the quick size shows the effect the headings promise,
and changing a number in the notebook's experiment cell changes the result as the chapter says."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from types import SimpleNamespace

import pytest

from infer_lab.course import ch10_prefix_caching as ch10
from infer_lab.course.notebook_code import notebook_function, notebook_path
from infer_lab.engine.prefix_cache import RadixPrefixCache

SYSTEM_LEN = "    system_len = sizes.system_len  # tokens of the shared system prompt"


def test_the_experiments_run_from_the_notebook_file():
    source = notebook_path("10").read_text()
    for name, needles, runner in (
        ("tokens_reused", ("EngineConfig(prefix_cache=cache, block_size=block_size", "num_cached_prompt_tokens"),
         ch10.run_granularity),
        ("serve_waves", ("EngineConfig(prefix_cache=cache, block_size=block_size", "engine.step_log",
                         "engine.prefix_cache.stats"), ch10.run_workloads),
    ):
        fn = notebook_function("10", name)
        assert inspect.getsourcefile(fn) == str(notebook_path("10"))
        code = inspect.getsource(fn)
        assert all(n in code for n in needles) and "Engine.from_loaded(lm, config)" in code
        assert len(code.splitlines()) <= 15
        assert f'notebook_function(NUMBER, "{name}")' in inspect.getsource(runner)
    assert SYSTEM_LEN in source and "ch10.measure" not in source
    assert not hasattr(ch10, "measure_workloads") and not hasattr(ch10, "measure_granularity")


def test_the_page_shows_the_radix_trees_real_match():
    shown = ch10.radix_match_code()
    assert inspect.getsource(RadixPrefixCache.match).strip().splitlines()[0] in shown
    assert "child = node.children.get(token_ids[i])" in shown
    assert '"""' not in shown and len(shown.splitlines()) <= 32


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


def _edited_notebook(tmp_path, old: str, new: str):
    """Notebook 10 with one line of an experiment cell changed, imported as a module (marimo's own API)."""
    source = notebook_path("10").read_text()
    assert source.count(old) == 1
    path = tmp_path / "nb09_edited.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location("nb09_edited", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nb09_edited"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("nb09_edited", None)
    return module


@pytest.mark.slow
def test_a_system_prompt_of_whole_blocks_removes_radixs_lead_as_the_chapter_says(embedded, tmp_path, quick_workloads):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab import nb

    sizes = ch10.sizes("cpu", "quick")
    assert sizes.system_len % sizes.block_size  # the cell's system prompt ends inside a block...
    before = {c: quick_workloads.run("shared_system_prompt", c).prefill_tokens_saved for c in ch10.CACHES}
    assert before["radix"] > before["hash"]  # ...so radix saves more there
    cell = _edited_notebook(tmp_path, SYSTEM_LEN, SYSTEM_LEN.replace("sizes.system_len", "48")).workloads_experiment
    _, defs = cell.run(ch10=ch10, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                       workloads_button=SimpleNamespace(value=True))
    w = defs["workloads"]
    after = {c: w.run("shared_system_prompt", c).prefill_tokens_saved for c in ch10.CACHES}
    # 48 tokens are three whole 16-token blocks: both caches find all of it for every later user
    assert w.system_len == 48 and after["hash"] == after["radix"] == (sizes.users - 1) * 48
    assert "They saved the same on shared system prompt" in ch10.workloads_text(w)
