"""Saved GPU results: well-formed, labelled, and what the notebooks compute from them."""

from __future__ import annotations

import pytest

from infer_lab import nb
from infer_lab.analysis.compare import saved_baseline_vs_roofline


def test_saved_results_carry_hardware_date_and_command():
    results = nb.saved_results("*.json")
    assert results, "assets/results should hold the H200 anchor runs"
    for r in results:
        env = r["environment"]
        assert env["device_name"] and env["date"] and env["torch"] and r["command"], r["_file"]
        assert "Saved result, not measured on this machine" in nb.saved_label(r)


def test_h200_baseline_against_its_own_roofline():
    saved = nb.saved_results("*hf-baseline*.json")[0]
    rows = saved_baseline_vs_roofline(saved)
    b1 = next(r for r in rows if r["quantity"].startswith("decode") and r["batch"] == 1 and r["context"] == 512)
    # Hand check: 14.50 GB of bf16 weights / 4.25 TB/s measured copy bandwidth = 3.41 ms (+ a little KV).
    assert b1["predicted"] == pytest.approx(14.496e9 / 4.2462e12 * 1e3, rel=0.02)
    assert b1["measured"] == pytest.approx(95.07, abs=0.01)
    assert all(r["measured_over_predicted"] > 1 for r in rows)  # nothing beats the roof
