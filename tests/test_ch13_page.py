"""Notebook 13's page is the experiment: ``serve_variants`` and ``concurrency_sweep`` in the notebook
serve the model and drive the load generator (through the library's ``bench.served``), the chapter
module only shows what they return, and the prefix cache's effect shows at quick size."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from page_helpers import cell_call

from infer_lab.bench import served
from infer_lab.course import ch13_engines as ch13
from infer_lab.course.notebook_code import notebook_function

EXPERIMENTS = {"serve_variants": "run_variants", "concurrency_sweep": "run_sweep"}


def _loadgen_results(variant: str) -> dict:
    row = {"point": "concurrency=1", "load": 1.0, "concurrency": 1, "completed": 1, "failed": 0,
           "output_tokens_per_s": 2.0, "tokens_per_s_per_user": 2.0, "ttft_ms_p50": 100.0}
    return {"pooled": [row], "server": {"version": f"stub {variant}"}, "rows": []}


def test_the_chapter_runners_call_the_notebooks_experiments(monkeypatch):
    """``run_variants`` and ``run_sweep`` run the notebook's own functions (stubbed here: no server)."""
    called = []

    def notebook_stub(number, name):
        def experiment(lm, variant_or_variants, *args):
            called.append((number, name))
            if name == "serve_variants":
                return {v: _loadgen_results(v) for v in variant_or_variants}
            return _loadgen_results("sweep")
        return experiment

    for part in ("variants", "sweep"):  # the package's modules that look the experiments up
        monkeypatch.setattr(importlib.import_module(f"{ch13.__name__}.{part}"), "notebook_function", notebook_stub)
    lm = SimpleNamespace(tokenizer=object(), name="stub-lm")  # has a tokenizer: served as it is
    sizes = ch13.sizes("cpu", "quick")
    variants = ch13.run_variants(lm, sizes)
    sweep = ch13.run_sweep(lm, sizes)
    assert called == [("13", name) for name in EXPERIMENTS]
    assert [r.variant for r in variants.runs] == list(sizes.variants)
    assert sweep.model == "stub-lm" and sweep.variant == sizes.sweep_variant


def test_the_server_and_load_generator_orchestration_lives_in_the_library():
    for name in ("ServerThread", "build_app", "run_benchmark_sync", "RunConfig"):
        assert not hasattr(ch13, name) and hasattr(served, name), name
    for gone in ("measure_variants", "measure_sweep", "compare_local_engines", "sweep_local_engine"):
        assert not hasattr(ch13, gone), gone


@pytest.mark.slow
def test_the_radix_prefix_cache_finds_the_shared_prefix_at_quick_size(embedded):
    """Two variants through the notebook's own function at quick size: only the one with a prefix cache
    reports hits, and it finds a large share of the prompt tokens (every prompt shares its system prompt)."""
    sizes = ch13.sizes("cpu", "quick")
    variants = {name: ch13.OUR_VARIANTS[name] for name in ("+ prepacked weights", "+ prefix cache (radix)")}
    runs = notebook_function("13", "serve_variants")(embedded, variants, 2, sizes.requests, 2,
                                                     sizes.workload_options())
    result = ch13.variants_result(runs, variants, 2, sizes)
    plain, radix = result.runs
    for run in result.runs:
        assert run.served.completed == sizes.requests and run.served.failed == 0
        assert run.kv_blocks_used_max and run.kv_blocks_used_max > 0  # paged KV: the server counted blocks
    assert plain.prefix_hit_rate is None  # no prefix cache, no hit rate (not a 0 that reads as measured)
    # 32 shared words of about 40 per prompt: at least 30% of all prompt tokens come from the cache
    assert radix.prefix_hit_rate >= 0.3
    assert "found" in ch13.variants_text(result) and f"{radix.prefix_hit_rate:.0%}" in ch13.variants_text(result)


def test_the_concurrency_in_the_cell_is_what_every_variant_is_served_at(tmp_path):
    """A learner's concurrency in the variants cell reaches ``serve_variants``, with the chapter's variants."""
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = ch13.sizes("cpu", "quick")
    lm = SimpleNamespace(tokenizer=object(), name="stub-lm")  # has a tokenizer: served as it is
    args = cell_call("13", tmp_path, "serve_variants", dict(ch13=ch13, lm=lm, mo=mo, nb=nb, sizes=sizes,
                     variants_button=SimpleNamespace(value=True)), "concurrency", concurrency=sizes.concurrency + 1)
    assert args["concurrency"] == sizes.concurrency + 1 and list(args["variants"]) == list(sizes.variants)
    assert (args["requests"], args["output_tokens"]) == (sizes.requests, sizes.output_tokens)
