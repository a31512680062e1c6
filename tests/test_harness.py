"""Harness statistics on synthetic timings, and memory counted from tensors."""

from __future__ import annotations

import itertools

import pytest
import torch

from infer_lab import harness


def test_percentiles_on_known_samples():
    s = harness.summarize(range(1, 101))  # 1..100
    assert s.n == 100 and s.min == 1 and s.max == 100
    assert s.p50 == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert s.mean == pytest.approx(50.5)


def test_single_sample_and_empty():
    assert harness.summarize([2.0]).p99 == 2.0 and harness.summarize([2.0]).std == 0.0
    with pytest.raises(ValueError):
        harness.summarize([])


def test_stats_as_dict_scales_times_but_not_counts():
    d = harness.summarize([0.001, 0.003]).as_dict("itl_ms_", 1e3)
    assert d["itl_ms_n"] == 2 and d["itl_ms_p50"] == pytest.approx(2.0)


def test_time_call_discards_warmup(monkeypatch):
    calls = []
    clock = itertools.count(0.0, 0.5)  # every perf_counter() call advances 0.5 s
    monkeypatch.setattr(harness.time, "perf_counter", lambda: next(clock))
    out = harness.time_call(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 5 and out == [0.5, 0.5, 0.5]


def test_kv_bytes_come_from_cache_tensors(embedded):
    cfg = embedded.config
    prompt, new = 11, 5
    rec = harness.timed_generate(embedded, embedded.random_ids(2, prompt), new)
    tokens_cached = prompt + new - 1  # the last token is produced, never fed back
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # fp32
    assert per_token == 46_080
    assert rec.kv_bytes == 2 * tokens_cached * per_token
    assert rec.weight_bytes == embedded.weight_bytes
    assert len(rec.itl_s) == new - 1 and rec.ttft_s > 0
    assert rec.tpot_s == pytest.approx((rec.e2e_s - rec.ttft_s) / (new - 1))


def test_timed_generate_is_greedy_hf(embedded):
    ids = embedded.random_ids(1, 9, seed=3)
    rec = harness.timed_generate(embedded, ids, 6)
    ref = embedded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                                  do_sample=False)
    assert rec.token_ids[0] == ref[0, 9:].tolist()


def test_rows_become_a_frame(embedded):
    rows = harness.measure_generation(embedded, embedded.random_ids(1, 4), 3, warmup=1, repeats=2,
                                      label={"case": "x"})
    df = harness.to_frame(rows, harness.env_metadata(embedded))
    assert list(df["repeat"]) == [0, 1] and set(df["case"]) == {"x"}
    assert {"ttft_ms", "itl_ms_p50", "itl_ms_p99", "kv_bytes", "device_name", "model"} <= set(df.columns)
