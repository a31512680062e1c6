"""The performance ledger (bench/ledger.py): bytes per decode step, GB/s, fraction of copy bandwidth.

Nothing here depends on this machine's speed: the byte counts are checked against the model's
own tensors and config, the arithmetic on hand-made numbers, and the bench's JSON by its relations.
"""

from __future__ import annotations

import json

import pytest
import torch

from infer_lab.bench import ledger
from infer_lab.bench.ledger import (
    CopyBandwidth,
    copy_bandwidth,
    decode_step_bytes,
    engine_weight_bytes,
    format_ledger,
    ledger_row,
    mean_decode_context,
    streamed_weight_bytes,
)
from infer_lab.shape import model_shape


def _copy(gbps: float) -> CopyBandwidth:
    return CopyBandwidth(GBps=gbps, working_set_bytes=2**28, threads=2, device="cpu", how="made by hand")


def _kv_bytes_per_token(config, itemsize: int) -> int:
    """K and V, every layer, every KV head, written out from the transformers config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * itemsize


def test_a_step_streams_the_parameters_once_and_every_sequences_kv(embedded):
    params = {p.data_ptr(): p for p in embedded.model.parameters()}  # the tied head counted once
    param_bytes = sum(p.numel() * p.element_size() for p in params.values())
    assert embedded.model.config.tie_word_embeddings
    fp32 = _kv_bytes_per_token(embedded.model.config, torch.float32.itemsize)
    assert decode_step_bytes(embedded, 3, 100) == param_bytes + 3 * 100 * fp32
    bf16 = _kv_bytes_per_token(embedded.model.config, torch.bfloat16.itemsize)
    assert decode_step_bytes(embedded, 3, 100, kv_dtype="bf16") == param_bytes + 3 * 100 * bf16
    assert decode_step_bytes(embedded, 1, 10, weight_bytes=1000) == 1000 + 10 * fp32
    # From the config alone: the same parameters in bf16, the same K/V in bf16.
    n_params = sum(p.numel() for p in params.values())
    assert decode_step_bytes("smollm2-135m", 3, 100) == 2 * n_params + 3 * 100 * bf16


def test_an_untied_embedding_table_is_not_streamed_but_its_lm_head_is():
    shape = model_shape("mistral-7b")
    assert not shape.tied_embeddings
    from infer_lab.analysis.params import param_counts

    table = shape.vocab * shape.hidden
    assert streamed_weight_bytes(shape) == 2 * (param_counts(shape).total - table)


def test_the_engines_own_weights_replace_the_models(embedded):
    from infer_lab.engine import EngineModel

    model = EngineModel.from_hf(embedded.model)
    assert engine_weight_bytes(embedded, model) == streamed_weight_bytes(embedded)
    assert engine_weight_bytes(embedded, model.cast(torch.bfloat16)) == streamed_weight_bytes(embedded) // 2


def test_gb_per_s_is_steps_per_s_times_bytes_per_step():
    row = ledger_row(output_tokens_per_s=100.0, mean_batch=4, bytes_per_step=2_000_000_000, copy=_copy(200.0))
    # 100 tok/s at 4 tokens per step: 25 steps/s, each 2 GB: 50 GB/s, a quarter of 200 GB/s.
    assert row == {"bytes_per_step": 2_000_000_000, "bytes_per_token": 500_000_000, "GBps": 50.0,
                   "copy_GBps": 200.0, "fraction_of_copy": 0.25}
    with pytest.raises(ValueError, match="mean_batch"):
        ledger_row(100.0, 0, 1, _copy(1.0))


def test_the_line_for_people_rounds_every_number():
    row = ledger_row(52.34, 1, 540_000_000, _copy(46.3))
    assert format_ledger(52.34, row) == "52.3 tok/s · 0.54 GB/step · 28.3 GB/s = 61% of copy"


def test_batching_shares_the_weights_so_bytes_per_token_fall():
    per_token = [decode_step_bytes("smollm2-135m", b, 64) / b for b in (1, 2, 8, 64)]
    assert per_token == sorted(per_token, reverse=True)
    assert per_token[1] / per_token[0] < 0.51  # short context: the weights are nearly all of a step
    assert per_token[3] / per_token[0] < 0.05


def test_at_long_context_the_kv_dominates_and_batching_stops_helping():
    weights = streamed_weight_bytes("smollm2-135m")
    long = model_shape("smollm2-135m").max_position_embeddings
    step = decode_step_bytes("smollm2-135m", 64, long)
    assert (step - weights) / step > 0.9  # the inverted case: the K/V, not the weights
    per_token = [decode_step_bytes("smollm2-135m", b, long) / b for b in (32, 64)]
    assert per_token[1] / per_token[0] > 0.95  # twice the batch, nearly the same bytes per token


def test_the_mean_decode_context_counts_every_decode_step():
    # 10 prompt tokens, 3 output: the first from prefill, then steps reading 11 and 12 tokens.
    assert mean_decode_context([10], [3]) == 11.5
    assert mean_decode_context([10, 100], [3, 2]) == pytest.approx((11 + 12 + 101) / 3)
    with pytest.raises(ValueError, match="decode step"):
        mean_decode_context([10], [1])


def test_copy_bandwidth_is_measured_once_on_every_core_past_the_last_level_cache(monkeypatch):
    import infer_lab.hardware as hardware

    calls = []

    def fake(device, n_bytes, repeats):
        calls.append((n_bytes, torch.get_num_threads()))
        return 40e9

    monkeypatch.setattr(hardware, "measure_bandwidth", fake)
    ledger._measure_copy.cache_clear()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = copy_bandwidth("cpu")
        assert copy_bandwidth("cpu") is first and len(calls) == 1
        assert torch.get_num_threads() == 1  # put back
    finally:
        torch.set_num_threads(threads)
        ledger._measure_copy.cache_clear()
    (n_bytes, used), cores = calls[0], first.threads
    assert first.GBps == 40.0 and first.working_set_bytes == 2 * n_bytes and used == cores >= 1
    llc = ledger._last_level_cache_bytes()
    assert n_bytes >= ledger.MIN_COPY_BYTES and (llc is None or n_bytes >= ledger.LLC_MULTIPLE * llc)
    assert "copy_" in first.how


def test_bench_engine_reports_the_ledger_and_saves_the_run(capsys, tmp_path):
    from infer_lab.cli import main

    out = tmp_path / "engine.json"
    args = ["bench", "engine", "--requests", "3", "--max-num-seqs", "2", "--prompt-len", "8", "--output-len", "4",
            "--save", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "GB/step" in printed and "of copy" in printed
    result = json.loads(out.read_text())
    ledger_, decode = result["ledger"], result["run"]["decode"]
    steps_per_s = result["decode_tokens_per_s"] / decode["mean_batch"]
    assert ledger_["GBps"] == pytest.approx(steps_per_s * ledger_["bytes_per_step"] / 1e9)
    assert ledger_["fraction_of_copy"] == pytest.approx(ledger_["GBps"] / result["copy_bandwidth"]["GBps"])
    assert ledger_["bytes_per_step"] == decode["step_bytes"] > streamed_weight_bytes("smollm2-135m")
    # The raw samples, the machine and the command, not only the summaries.
    steps = result["run"]["step_samples"]
    assert len(steps["duration_s"]) == result["run"]["steps"] and len(result["run"]["ttft_samples_s"]) == 3
    assert sum(d for d, p in zip(steps["decode_tokens"], steps["prefill_tokens"], strict=True) if p == 0) > 0
    env = result["environment"]
    assert env["cpu"]["model"] and isinstance(env["cpu"]["flags"], list) and env["torch_threads"] >= 1
    assert env["torch"] and env["infer_lab"] and "git" in env
    assert result["command"].startswith("infer-lab") and result["arguments"]["requests"] == 3
