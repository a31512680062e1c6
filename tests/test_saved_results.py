"""Saved GPU results: well-formed, labelled, and what the notebooks compute from them."""

from __future__ import annotations

import pytest

from infer_lab.analysis.compare import saved_baseline_vs_roofline
from infer_lab.course.saved import load_saved


def test_saved_results_carry_hardware_date_and_command():
    results = load_saved("*.json")
    assert results, "infer_lab/results should hold the H200 anchor runs"
    for r in results:
        env = r.raw["environment"]
        assert env["device_name"] and env["date"] and env["torch"] and r.command, r.file
        assert r.label.startswith("Saved result, not measured on this machine") and r.device in r.label


def test_h200_baseline_against_its_own_roofline():
    saved = load_saved("*hf-baseline*.json")[0]
    rows = saved_baseline_vs_roofline(saved.raw)
    b1 = next(r for r in rows if r["quantity"].startswith("decode") and r["batch"] == 1 and r["context"] == 512)
    # Hand check: 14.50 GB of bf16 weights / 4.25 TB/s measured copy bandwidth = 3.41 ms (+ a little KV).
    assert b1["predicted"] == pytest.approx(14.496e9 / 4.2462e12 * 1e3, rel=0.02)
    assert b1["measured"] == pytest.approx(95.07, abs=0.01)
    assert all(r["measured_over_predicted"] > 1 for r in rows)  # nothing beats the roof


def test_the_saved_hf_baseline_is_shown_with_its_caution():
    from infer_lab.course import chapter

    view = chapter("02").saved()
    assert view is not None and "noisy" in view.warning and "91" in view.warning  # computed from the file
    assert view.label.startswith("Saved result") and "H200" in view.title
