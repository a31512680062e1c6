"""Impossible fits and ratios are flagged, never printed as findings (analysis.plausibility, chapter 12)."""

from __future__ import annotations

import pytest

from infer_lab.analysis.plausibility import (
    R2_FLOOR,
    caution,
    line_fit_flags,
    r_squared,
    speedup_flags,
)


def test_r_squared_of_a_perfect_and_of_a_useless_line():
    points = [(2, 3.0), (3, 4.0), (5, 6.0)]
    assert r_squared(points, 1.0, 1.0) == pytest.approx(1.0)
    assert r_squared(points, 13 / 3, 0.0) == pytest.approx(0.0)  # the mean: explains nothing
    assert r_squared(points[:2], 1.0, 1.0) is None  # two points always fit a line


def test_a_negative_fixed_cost_or_a_weak_fit_is_flagged():
    # the fit issue 23 saw on the page: t(q) = -152.6 ms + q x 165.84 ms
    flags = line_fit_flags("t(q)", -0.1526, 0.16584)
    assert len(flags) == 1 and "negative fixed cost (-152.6 ms)" in flags[0]
    assert line_fit_flags("t(q)", 0.010, 0.002, r2=0.9) == []
    weak = line_fit_flags("t(q)", 0.010, 0.002, r2=R2_FLOOR - 0.01)
    assert len(weak) == 1 and "R² = 0.49" in weak[0]
    assert "negative cost per token" in line_fit_flags("t(q)", 0.01, -0.001)[0]


def test_a_speedup_above_tokens_per_pass_is_flagged():
    # the page's 2.61x at 1.05 tokens per pass
    assert "2.61× at 1.05 tokens per target pass" in speedup_flags("batch 1", 2.61, 1.05)[0]
    assert speedup_flags("batch 1", 1.6, 1.7) == []
    assert speedup_flags("batch 1", 1.74, 1.7) == []  # within the 5% tolerance
    assert caution([]) == "" and caution(["x"]).startswith("**Implausible, so not a finding:**")


def test_chapter_11_turns_impossible_numbers_into_cautions():
    from infer_lab.analysis.speculation import VerifyCost
    from infer_lab.course import chapter

    ch12 = chapter("12")
    verify = VerifyCost(-0.1526, 0.16584, 0.05, 12, (2, 3, 5))
    sweep = ch12.SweepResult([], [], verify, 20.0, 0.05, ["p"], 24, 1, "cpu", 1, 30, verify_r2=0.2)
    flags = ch12.implausible(ch12.Result(size="quick", sweep=sweep))
    assert any("negative fixed cost" in f for f in flags) and any("R² = 0.20" in f for f in flags)
