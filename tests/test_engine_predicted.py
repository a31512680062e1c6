"""The engine's predicted-vs-measured rows: structure, and the prediction is the roofline's own."""

from __future__ import annotations

import math

import pytest

from infer_lab.analysis.compare import shape_of
from infer_lab.analysis.roofline import Roof, predict_decode
from infer_lab.engine.predicted import decode_step_predicted_vs_measured

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


def test_prefix_match_granularity_is_measured_per_cache(embedded):
    from infer_lab.engine import demos

    rows = demos.prefix_match_granularity(embedded, block_size=4, prompt_len=16, shared=[0, 3, 5, 11])
    reused = {(r["cache"], r["shared_tokens"]): r["reused_tokens"] for r in rows}
    assert [reused["hash", k] for k in (0, 3, 5, 11)] == [0, 0, 4, 8]  # whole blocks only
    assert [reused["radix", k] for k in (0, 3, 5, 11)] == [0, 3, 5, 11]  # every shared token
