"""Chapters 07 and 08 beyond the common surface: allocator bytes, budget checks, contenders, anchors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from infer_lab.analysis.kv_waste import kv_waste_breakdown, mixed_lengths
from infer_lab.bench.kv_allocators import kv_memory_waste
from infer_lab.course import ch07_kv_cache_paged as ch07
from infer_lab.course import ch08_batching as ch08
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
    assert ch07.waste_problem(ch07.WasteSettings()) is None
    tight = ch07.WasteSettings(shape_name="llama-3-70b", max_model_len=8192, budget_bytes=1 * GiB)
    problem = ch07.waste_problem(tight)
    assert problem and "contiguous-max" in problem and "budget" in problem
    prompts, outputs = tight.lengths()
    with pytest.raises(ValueError):
        kv_waste_breakdown(tight.shape, prompts, outputs, tight.max_model_len, tight.budget_bytes)


def _fake(name: str, tokens_per_s: float, idle: float | None) -> ch08.Contender:
    def run(lm, workload):
        assert lm is None and workload.requests == len(workload.output_lens)
        return ch08.ContenderRow(name, tokens_per_s, 1.0, 10.0, 20.0, 30.0, 1.0, 2.0, 3.0,
                                 mean_idle_slots=idle, steps=None if idle is None else 12)

    return ch08.Contender(name, "a stand-in", run)


def test_a_contender_is_one_more_entry_in_the_list():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    throughput_only = ch08.Contender("whole run", "throughput only",
                                     lambda lm, w: ch08.ContenderRow("whole run", 5.0, 0.5))
    contenders = [_fake("a", 10.0, 0.5), _fake("b", 30.0, 0.0), _fake("not in slots", 20.0, None), throughput_only]
    result = ch08.measure_batching(None, ch08.sizes("cpu", "quick"), contenders)
    assert [r.name for r in result.rows] == ["a", "b", "not in slots", "whole run"]
    table = ch08.batching_table(result)
    assert len(table) == 4 and table.iloc[2]["idle slots per step (mean)"] == ch08.NA
    assert table.iloc[3]["TTFT p50 (ms)"] == "—" and "nan" not in table.to_string()
    text = ch08.batching_text(result)
    assert "6.00× whole run" in text and "2.00× whole run" in text  # every contender against the slowest
    fig = ch08.batching_figure(result, "test")
    assert len(fig.axes[0].patches) == 4 and len(fig.axes[2].patches) == 3 * 4  # p50/p90/p99 each
    plt.close(fig)
    assert "**not in slots**" in ch08.contenders_text(contenders)


def test_the_workload_is_seeded_and_within_its_bounds():
    sizes = ch08.sizes("cpu", "quick")
    w = ch08.batching_workload(sizes)
    assert w == ch08.batching_workload(sizes)
    assert len(w.output_lens) == sizes.requests
    assert all(max(2, sizes.max_output // 8) <= n <= sizes.max_output for n in w.output_lens)
    assert ch08.batching_workload(dataclasses.replace(sizes, seed=1)) != w


def test_saved_anchors_pair_each_batch_with_the_hf_step():
    view = ch08.saved()
    assert view is not None and "Saved result" in view.label
    rows = ch08.anchor_rows(ch08.load_saved(ch08.SOL_FILE)[0], ch08.load_saved(ch08.HF_BASELINE_FILE)[0])
    assert [r.batch for r in rows] == [1, 8, 64, 256]
    assert all(r.hf_step_ms and r.hf_over_graph > 1 for r in rows)  # HF eager is slower at every batch
    assert all(0 < r.bandwidth_share < 1 for r in rows)
    frame = next(iter(view.tables.values()))
    assert "nan" not in frame.to_string() and "None" not in frame.to_string()
    import matplotlib.pyplot as plt

    for fig in view.figures.values():
        plt.close(fig)
