"""Chapter 09's and 10's computed sentences (the concurrency frontier, the transformers rows), each checked on
the case a run shows and on the inverted case."""

from __future__ import annotations

import re

import pytest

from infer_lab.course import ch09_batching as ch09
from infer_lab.course import ch10_prefix_caching as ch10


def _point(max_num_seqs: int, total: float, per_user: float) -> ch09.SweepPoint:
    return ch09.SweepPoint(max_num_seqs, 2 * max_num_seqs, total, per_user, 10.0, 30.0, 10.0, 20.0)


FRONTIER = [_point(1, 10, 10), _point(2, 18, 9), _point(4, 30, 7.5), _point(8, 40, 5)]


def test_a_clean_sweep_is_one_frontier_of_trades():
    text = ch09.sweep_text(FRONTIER)
    assert "from 10.0 to **40.0 tokens/s** (4.0×)" in text and "from 10.0 to 5.0 tokens/s" in text
    assert "At each of the 3 steps up in max_num_seqs, total throughput rose and each user's speed fell" in text
    assert ch09.dominated_points(FRONTIER) == [] and "Off the frontier" not in text


def test_a_point_beaten_on_both_axes_is_named_off_the_frontier():
    bent = [FRONTIER[0], FRONTIER[1], _point(4, 17, 7.5), FRONTIER[3]]  # 4 is slower than 2 on both axes
    assert [(p.max_num_seqs, q.max_num_seqs) for p, q in ch09.dominated_points(bent)] == [(4, 2)]
    text = ch09.sweep_text(bent)
    assert "Not every step up in max_num_seqs traded" in text and "Off the frontier: 4 requests at once (2 at once was at least" in text
    assert "At each of the" not in text


def test_two_points_are_called_a_segment():
    text = ch09.sweep_text(FRONTIER[:2])
    assert "With 2 points this is a segment, not yet a curve" in text
    assert "segment" not in ch09.sweep_text(FRONTIER)


def _row(key: str, tokens_per_s: float) -> ch09.ContenderRow:
    return ch09.ContenderRow(ch09.CONTENDERS[key][0], tokens_per_s, 1.0)


def test_the_fastest_transformers_row_is_named_against_one_request_at_a_time():
    rows = [_row("hf-sequential", 10.0), _row("hf-padded", 30.0), _row("hf-continuous", 60.0)]
    text = ch09.hf_rows_text(rows)
    assert "**HF continuous batching** was the fastest here (60.0 tokens/s, 6.00× HF one at a time)" in text
    assert f"transformers {ch09.TRANSFORMERS_DOCS_VERSION} documentation" in text and "not the library" in text
    assert "did not pay" not in text
    inverted = ch09.hf_rows_text([_row("hf-sequential", 40.0), _row("hf-padded", 30.0)])
    padded = ch09.CONTENDERS["hf-padded"][0]
    assert (f"**HF one at a time** was the fastest here (40.0 tokens/s, 1.33× the next, {padded}): "
            "batching did not pay") in inverted
    assert "not the library" in inverted


def _lead(ratio: float) -> list[ch09.ContenderRow]:
    return [_row("hf-sequential", 10.0), _row("hf-padded", 20.0), _row("hf-continuous", 20.0 * ratio)]


def test_a_lead_within_one_runs_noise_is_not_called_the_fastest():
    inside = 1 + ch09.SINGLE_RUN_NOISE / 2
    text = ch09.hf_rows_text(_lead(inside))
    assert "none was clearly the fastest here" in text and "was the fastest here" not in text
    assert f"within one run's noise ({ch09.SINGLE_RUN_NOISE:.0%})" in text and "not the library" in text
    outside = ch09.hf_rows_text(_lead(1 + 2 * ch09.SINGLE_RUN_NOISE))  # the other side of the band
    assert "**HF continuous batching** was the fastest here" in outside and "none was clearly" not in outside


def test_one_at_a_time_ahead_within_the_noise_does_not_say_batching_did_not_pay():
    near = ch09.hf_rows_text([_row("hf-sequential", 40.0), _row("hf-padded", 40.0 / (1 + ch09.SINGLE_RUN_NOISE / 2))])
    assert "did not pay" not in near and "does not show whether batching paid" in near
    far = ch09.hf_rows_text([_row("hf-sequential", 40.0), _row("hf-padded", 40.0 / (1 + 2 * ch09.SINGLE_RUN_NOISE))])
    assert "batching did not pay" in far and "does not show" not in far


def test_the_transformers_rows_sentence_is_part_of_the_chapters_verdict():
    rows = [_row("hf-sequential", 10.0), _row("hf-continuous", 60.0),
            ch09.ContenderRow(ch09.ENGINE_CONTINUOUS, 50.0, 1.0)]
    result = ch09.BatchingResult(ch09.batching_workload(ch09.sizes("cpu", "quick")), rows)
    assert ch09.hf_rows_text(rows[:2]) in ch09.batching_text(result)


# --- chapter 10: the cited SGLang claim, as talk 1 said it, and a points gap that adds up ---------------


def _agentic(hash_hit: float, radix_hit: float) -> ch10.WorkloadsResult:
    runs = [ch10.WorkloadRun("agentic_branching", cache, 16, 8, 1000, computed, hit, 0.1, 0.1, 1.0)
            for cache, computed, hit in (("none", 1000, 0.0), ("hash", round(1000 * (1 - hash_hit)), hash_hit),
                                         ("radix", round(1000 * (1 - radix_hit)), radix_hit))]
    return ch10.WorkloadsResult(runs, 16, 64, 8)


@pytest.mark.parametrize("hash_hit, radix_hit", [(0.6, 2 / 3), (0.614, 0.6666), (0.9, 0.9)])
def test_the_hit_rates_in_the_sglang_sentence_add_up_to_its_points(hash_hit, radix_hit):
    text = ch10.sglang_claim_text(_agentic(hash_hit, radix_hit))
    found = re.search(r"radix found ([\d.]+)% of the prompt tokens and hash ([\d.]+)%", text)
    gap = re.search(r"worth ([\d.]+) points of hit rate", text)
    assert found and gap
    radix, hash_ = (float(x) for x in found.groups())
    assert abs((radix - hash_) - float(gap.group(1))) <= 0.1 + 1e-9  # one decimal each: the gap adds up


def test_the_sglang_claim_is_talk_1s_better_not_faster():
    lo, hi = ch10.SGLANG_AGENTIC_CLAIM
    text = ch10.sglang_claim_text(_agentic(0.6, 2 / 3))
    words = ch10.sglang_claim_words()
    for said in (text, words):
        assert "talk 1" in said and "better" in said and "faster" not in said
    assert f"{lo:.0f}–{hi:.0f}×" in text and f"{lo:.0f}–{hi:.0f}×" in words


def test_a_sweep_point_keeps_the_queued_requests_ttft_apart():
    """2 slots, 4 requests at t = 0: two get a slot at once, two wait a whole wave. One median over the four
    would be 2 s, a time no request saw; the point keeps 1 s and 3 s apart (and None without a queue)."""
    from types import SimpleNamespace

    from infer_lab.timing import summarize

    def bench(ttfts_s):
        itl = summarize([10.0, 12.0])
        run = SimpleNamespace(ttft_samples_s=ttfts_s, itl_ms=itl)
        return SimpleNamespace(output_tokens_per_s=50.0, run=run)

    two_waves, = ch09.sweep_points({2: bench([1.0, 1.0, 3.0, 3.0])}, waves=2)
    assert (two_waves.first_ttft_ms_p50, two_waves.queued_ttft_ms_p50) == (1000.0, 3000.0)
    one_wave, = ch09.sweep_points({2: bench([1.0, 1.0])}, waves=1)
    assert one_wave.queued_ttft_ms_p50 is None and one_wave.requests == 2
