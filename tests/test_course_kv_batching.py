"""Chapters 08 and 09 beyond the common surface: allocator bytes, budget checks, contenders, anchors."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from infer_lab.analysis.kv_waste import kv_waste_breakdown, mixed_lengths
from infer_lab.bench.kv_allocators import kv_memory_waste
from infer_lab.course import ch08_kv_cache_paged as ch08
from infer_lab.course import ch09_batching as ch09
from infer_lab.engine import ContiguousKVCache, PagedKVCache, SamplingParams, Sequence
from infer_lab.shape import model_shape
from infer_lab.units import GiB


def _full_width_report(shape, prompts, outputs, max_model_len, block_size):
    """The same reservation in stores of the shape's real width (one layer), bytes scaled by layers."""
    seqs = [Sequence(f"r{i}", [0] * p, SamplingParams(max_tokens=o), 0.0) for i, (p, o) in
            enumerate(zip(prompts, outputs, strict=True))]
    blocks = sum(math.ceil((p + o) / block_size) for p, o in zip(prompts, outputs, strict=True))
    one_layer = shape.with_layers(1)
    out = {}
    for name, cache in (("contiguous", ContiguousKVCache(one_layer, len(seqs), max_model_len, torch.bfloat16)),
                        ("paged", PagedKVCache(one_layer, blocks, block_size, torch.bfloat16))):
        for seq, o in zip(seqs, outputs, strict=True):
            seq.num_computed, seq.block_table, seq.region = 0, [], None
            cache.allocate(seq, seq.num_tokens + o)
            seq.num_computed = seq.num_tokens + o
        report = cache.memory_report(seqs)
        out[name] = (report.used_bytes * shape.layers, report.reserved_bytes * shape.layers)
        for seq in seqs:
            cache.free(seq)
    return out


def test_narrow_allocator_stores_count_the_same_bytes_as_full_width_ones():
    shape = model_shape("smollm2-135m")  # 3 KV heads x 64: small enough to allocate for real
    prompts, outputs = mixed_lengths(8, seed=3, max_prompt=64, max_output=64)
    rows = {r.layout: r for r in kv_memory_waste(shape, prompts, outputs, 256, block_size=16)}
    full = _full_width_report(shape, prompts, outputs, 256, 16)
    for layout in ("contiguous", "paged"):
        assert (rows[layout].used_bytes, rows[layout].reserved_bytes) == full[layout]
    assert rows["contiguous"].reserved_bytes == 8 * 256 * 2 * 30 * 3 * 64 * 2  # 8 regions, bf16


def test_a_budget_below_one_reservation_is_explained_not_raised():
    assert ch08.waste_problem(ch08.WasteSettings()) is None
    tight = ch08.WasteSettings(shape_name="llama-3-70b", max_model_len=8192, budget_bytes=1 * GiB)
    problem = ch08.waste_problem(tight)
    assert problem and "contiguous-max" in problem and "budget" in problem
    prompts, outputs = tight.lengths()
    with pytest.raises(ValueError):
        kv_waste_breakdown(tight.shape, prompts, outputs, tight.max_model_len, tight.budget_bytes)


def _engine_run(tokens_per_s: float, idle: float, outputs: list[list[int]]):
    """An engine run as ``timed_engine_run`` returns it: (run, outputs), with the fields a row reads."""
    from infer_lab.timing import Stats

    pct = Stats(n=3, mean=12.0, std=1.0, min=5.0, p50=10.0, p90=20.0, p99=30.0, max=31.0)
    run = SimpleNamespace(output_tokens_per_s=tokens_per_s, requests_per_s=1.0, mean_idle_slots=idle, steps=12,
                          ttft_ms=pct, itl_ms=pct)
    return run, [SimpleNamespace(token_ids=o) for o in outputs]


def test_every_contenders_run_becomes_a_row_checked_against_the_engine():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from infer_lab.bench.baselines import ContenderRun

    same, other = [[1, 2], [3]], [[1, 2], [4]]
    runs = {"hf-sequential": ContenderRun("hf-sequential", 3.0, 15, same),  # 5 tokens/s
            "hf-padded": ContenderRun("hf-padded", 1.0, 15, other),
            "static": _engine_run(10.0, 0.5, same), "continuous": _engine_run(30.0, 0.0, same)}
    result = ch09.batching_result(runs, ch09.batching_workload(ch09.sizes("cpu", "quick")))
    assert [r.name for r in result.rows] == ["HF one at a time", "HF padded batch", "static batching (engine)",
                                             ch09.ENGINE_CONTINUOUS]
    assert [r.identical for r in result.rows] == [True, False, True, True]  # tokens, request by request
    assert result.rows[0].output_tokens_per_s == 5.0 and result.rows[0].requests_per_s == pytest.approx(2 / 3)
    table = ch09.batching_table(result)
    assert len(table) == 4 and table.iloc[1]["idle slots per step (mean)"] == ch09.NA
    assert table.iloc[0]["TTFT p50 (ms)"] == "—" and "nan" not in table.to_string()
    text = ch09.batching_text(result)
    assert "6.00× HF one at a time" in text and "2.00× HF one at a time" in text  # every contender against the slowest
    fig = ch09.batching_figure(result, "test")
    assert len(fig.axes[0].patches) == 4 and len(fig.axes[2].patches) == 3 * 4  # p50/p90/p99 each
    plt.close(fig)
    assert "**HF padded batch**" in ch09.contenders_text(["hf-padded", "static"])


def test_the_workload_is_seeded_and_within_its_bounds():
    sizes = ch09.sizes("cpu", "quick")
    w = ch09.batching_workload(sizes)
    assert w == ch09.batching_workload(sizes)
    assert len(w.output_lens) == sizes.requests
    assert all(2 <= n <= sizes.max_output for n in w.output_lens)
    assert ch09.batching_workload(dataclasses.replace(sizes, seed=1)) != w


def test_the_contenders_workload_shows_static_batching_idle_at_quick_size(embedded):
    """Steps, not times: on part 2's quick workload the engine's static policy waits for each batch's
    longest request, so it takes at least 1.3x the steps of continuous batching, with idle slots."""
    from infer_lab.course.notebook_code import notebook_function

    sizes = ch09.sizes("cpu", "quick")
    prompts, lens = ch09.batching_requests(embedded, sizes)
    serve = notebook_function("09", "serve")
    runs = {p: serve(embedded, prompts, lens, p, max_num_seqs=sizes.max_num_seqs) for p in ("static", "continuous")}
    assert len(runs["static"]) >= 1.3 * len(runs["continuous"])
    assert ch09.idle_slot_steps(runs["static"]) > ch09.idle_slot_steps(runs["continuous"])


def test_saved_anchors_pair_each_batch_with_the_hf_step():
    view = ch09.saved()
    assert view is not None and "Saved result" in view.label
    rows = ch09.anchor_rows(ch09.load_saved(ch09.SOL_FILE)[0], ch09.load_saved(ch09.HF_BASELINE_FILE)[0])
    assert [r.batch for r in rows] == [1, 8, 64, 256]
    assert all(r.hf_step_ms and r.hf_over_graph > 1 for r in rows)  # HF eager is slower at every batch
    assert all(0 < r.bandwidth_share < 1 for r in rows)
    frame = next(iter(view.tables.values()))
    assert "nan" not in frame.to_string() and "None" not in frame.to_string()
    import matplotlib.pyplot as plt

    for fig in view.figures.values():
        plt.close(fig)
