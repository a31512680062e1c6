"""The engine's predicted-vs-measured rows: structure, and the prediction is the roofline's own."""

from __future__ import annotations

import math

import pytest

from infer_lab.analysis.compare import shape_of
from infer_lab.analysis.roofline import Roof, predict_decode
from infer_lab.bench.predicted import decode_step_predicted_vs_measured

# A made-up roof: the test checks arithmetic, not this machine's ceilings (and skips measuring them).
ROOF = Roof("test roof", peak_flops=1e11, bandwidth_Bps=2e10, source="test")


@pytest.fixture(scope="module")
def rows(embedded):
    return decode_step_predicted_vs_measured(
        embedded, batches=[1, 2], prompt_len=8, decode_steps=3, roof=ROOF
    )


def test_one_row_per_batch_with_positive_times(rows):
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        assert r["measured_ms"] > 0 and r["predicted_ms"] > 0
        assert math.isclose(r["measured_over_predicted"], r["measured_ms"] / r["predicted_ms"])
        assert r["steps_timed"] == 3
        assert r["roof"] == "test roof"
        assert r["dtype"] == "fp32"


def test_prediction_equals_predict_decode(embedded, rows):
    for r in rows:
        expected = predict_decode(
            shape_of(embedded),
            ROOF,
            r["batch"],
            r["context"],
            weight_dtype="fp32",
            kv_dtype="fp32",
            act_dtype="fp32",
            logits="last",
        )
        assert math.isclose(r["predicted_ms"], expected.time_s * 1e3, rel_tol=1e-12)
        assert r["flops"] == expected.flops and r["bytes"] == expected.bytes
    # Decode steps attend prompt + 1 .. prompt + steps tokens; the row names the middle one.
    assert all(8 < r["context"] <= 8 + 3 for r in rows)


def test_bad_input_is_rejected(embedded):
    with pytest.raises(ValueError, match="decode_steps"):
        decode_step_predicted_vs_measured(embedded, batches=[1], decode_steps=1, roof=ROOF)
    with pytest.raises(ValueError, match="batch"):
        decode_step_predicted_vs_measured(embedded, batches=[0], roof=ROOF)


def test_throughput_bound_by_hand_for_mistral_7b():
    from infer_lab.analysis.roofline import Roof
    from infer_lab.bench.predicted import throughput_bound

    roof = Roof("test", peak_flops=1e15, bandwidth_Bps=1e12)
    # One 1-token prompt, 2 output tokens: two weight-bound passes of 14.5 GB (bf16 weights,
    # 7,248,023,552 params; the embedding gather reads one row, KV and activations are tiny).
    tiny = throughput_bound("mistral-7b", roof, requests=1, prompt_len=1, output_len=2)
    one_pass_s = (7_248_023_552 - 32768 * 4096) * 2 / 1e12
    assert tiny["total_s"] == pytest.approx(2 * one_pass_s, rel=0.01)
    assert tiny["output_tokens_per_s"] == pytest.approx(2 / (2 * one_pass_s), rel=0.01)
    # 256 x 512 prompts: prefill is compute-bound, about 2 FLOP per weight per token.
    big = throughput_bound("mistral-7b", roof, requests=256, prompt_len=512, output_len=128)
    matmul_params = 7_248_023_552 - 32768 * 4096  # the embedding is a gather, not a matmul
    assert big["prefill_flops"] == pytest.approx(2 * matmul_params * 256 * 512, rel=0.05)
    # Each op takes the slower of its FLOPs and its bytes: the memory-bound ops (norms, the
    # attention scores) add a few percent on top of the pure-FLOP time, never less.
    assert big["prefill_flops"] / 1e15 <= big["prefill_s"] < 1.1 * big["prefill_flops"] / 1e15
    assert big["output_tokens_per_s"] == pytest.approx(256 * 128 / big["total_s"])
    with pytest.raises(ValueError, match="output_len"):
        throughput_bound("mistral-7b", roof, 1, 1, 0)


def test_throughput_bound_takes_the_max_num_seqs():
    from infer_lab.analysis.roofline import Roof
    from infer_lab.bench.engine import roofline_bounds
    from infer_lab.bench.predicted import throughput_bound

    roof = Roof("test", peak_flops=1e15, bandwidth_Bps=1e12)
    one_pass_s = (7_248_023_552 - 32768 * 4096) * 2 / 1e12  # bf16 weights streamed once
    # Three 1-token prompts, 2 outputs each, one at a time: three waves of two weight-bound
    # passes, so 6 passes for 6 tokens, the batch-1 rate.
    serial = throughput_bound("mistral-7b", roof, 3, 1, 2, max_num_seqs=1)
    assert serial["waves"] == 3 and serial["max_num_seqs"] == 1
    assert serial["total_s"] == pytest.approx(6 * one_pass_s, rel=0.01)
    assert serial["output_tokens_per_s"] == pytest.approx(1 / one_pass_s, rel=0.01)
    # Two at a time: a wave of 2 and a wave of 1, two passes each (a pass of 2 rows still
    # streams the weights once): 4 passes for 6 tokens.
    pairs = throughput_bound("mistral-7b", roof, 3, 1, 2, max_num_seqs=2)
    assert pairs["waves"] == 2 and pairs["max_num_seqs"] == 2
    assert pairs["total_s"] == pytest.approx(4 * one_pass_s, rel=0.01)
    # Concurrency >= requests is the old one-batch bound, and the default.
    everyone = throughput_bound("mistral-7b", roof, 3, 1, 2)
    assert everyone == throughput_bound("mistral-7b", roof, 3, 1, 2, max_num_seqs=8)
    assert everyone["waves"] == 1 and everyone["total_s"] == pytest.approx(2 * one_pass_s, rel=0.01)
    with pytest.raises(ValueError, match="max_num_seqs"):
        throughput_bound("mistral-7b", roof, 3, 1, 2, max_num_seqs=0)
    # The bench reports the bound of the run next to the batch-1 and batch-N bounds.
    bounds = roofline_bounds("mistral-7b", roof, 3, 1, 1, 2, "bf16")
    assert bounds["roofline_bound"] == serial
    assert bounds["roofline_bound_batch_1"] == serial
    assert bounds["roofline_bound_batch_n"] == everyone
