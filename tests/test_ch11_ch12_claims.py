"""Chapters 11 and 12: every sentence that compares numbers is computed from them, so it changes when the
numbers go the other way. Each test feeds the chapter's own function the case a run shows and its inverse."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infer_lab.course import ch11_chunked_prefill as ch11
from infer_lab.course import ch12_speculative_decoding as ch12
from infer_lab.timing import MachineLoad

QUIET = MachineLoad(others_cores=0.02, cores=2, load1=0.1, sample_s=0.3)


# --- chapter 11: the spike is the step that carried the long prefill, whatever its time


def _chunking(prefill_step_s: float, slow_decode_step_s: float) -> ch11.ChunkingResult:
    """An unchunked run whose step 3 carries the 48-token prefill, with one decode-only step (5) timed at
    ``slow_decode_step_s``; the chunked run beside it is ordinary."""
    sizes = replace(ch11.sizes("cpu", "quick"), long_prompt=48, decoders=2, decode_tokens=6, max_num_batched_tokens=16,
                    arrive_at_step=3)
    whole = [ch11.StepPoint(False, i, 0.010, 0, 2) for i in range(3)]
    whole += [ch11.StepPoint(False, 3, prefill_step_s, 48, 2), ch11.StepPoint(False, 4, 0.011, 0, 2),
              ch11.StepPoint(False, 5, slow_decode_step_s, 0, 2)]
    chunked = [ch11.StepPoint(True, i, 0.010, 0, 2) for i in range(3)]
    chunked += [ch11.StepPoint(True, 3 + i, 0.020, 14 if i < 3 else 6, 2) for i in range(4)]
    runs = [ch11.RunSummary(False, None, 6, 50, 1, 0.010, max(prefill_step_s, slow_decode_step_s), prefill_step_s),
            ch11.RunSummary(True, 16, 7, 16, 4, 0.010, 0.020, 0.08)]
    return ch11.ChunkingResult(sizes, whole + chunked, runs, QUIET)


def test_the_spike_is_the_prefill_step_even_when_a_decode_step_was_slower():
    noisy = _chunking(prefill_step_s=0.050, slow_decode_step_s=0.400)  # the tour's case: noise beat the prefill
    assert noisy.prefill_step(False).step == 3 and noisy.prefill_step(False).prefill_tokens == 48
    text = ch11.spike_text(noisy)
    assert "one step (step 3) of 50 tokens that took **50 ms**" in text
    assert "slowest step of that run was not this one but step 5, 2 tokens in 400 ms" in text
    assert "noise, not work" in text
    assert "is **within that noise**" in text  # 50 ms over a 10 ms median, against a 390 ms spread
    quiet = _chunking(prefill_step_s=0.400, slow_decode_step_s=0.012)  # the prefill step is also the slowest
    text = ch11.spike_text(quiet)
    assert "one step (step 3) of 50 tokens that took **400 ms**" in text
    assert "slowest step" not in text and "stands out of that noise" in text and "within that noise" not in text
    assert ch11.spike_text(quiet) in ch11.chunking_text(quiet)


def _agent_row(chunked_step_s: float) -> ch11.AgentPromptRow:
    return ch11.AgentPromptRow("H100-SXM", 1, 200_000, 10.8, 0.0065, 10.8 / 0.0065, chunked_step_s, 2048)


def test_chunking_a_huge_prompt_is_judged_against_the_per_token_target():
    slo = ch11.serving_tpot_slo_s()
    over = ch11.agent_prompt_text([_agent_row(2 * slo)])
    assert f"At a {ch11.AGENT_MAX_NUM_BATCHED_TOKENS:,}-token budget" in over and "misses the target" in over
    assert f"{2 * slo * 1e3:,.0f} ms on average" in over and f"over a {slo * 1e3:,.0f} ms per-token target" in over
    assert "disaggregation" in over and "without that trade" in over
    assert "chunking is enough" not in over
    under = ch11.agent_prompt_text([_agent_row(slo / 2)])
    assert "chunking is enough" in under and "misses the target" not in under and "smaller budget" not in under
    # the target is an argument: the same row flips when the target moves past it
    assert "chunking is enough" in ch11.agent_prompt_text([_agent_row(2 * slo)], tpot_slo_s=4 * slo)


def test_a_smaller_budget_that_meets_the_target_is_named_with_its_prefill_time():
    slo = ch11.serving_tpot_slo_s()
    row = ch11.AgentPromptRow("H100-SXM", 1, 200_000, 10.8, 0.0065, 10.8 / 0.0065, 0.0065, 2048).at_budget(2048)
    assert row.chunked_step_s > slo  # this row misses the target at 2,048 tokens
    fit = ch11.largest_budget_meeting(row, slo)
    assert fit is not None and fit.chunked_step_s <= slo
    larger = [b for b in ch11.AGENT_BUDGETS if b > fit.max_num_batched_tokens]
    assert all(row.at_budget(b).chunked_step_s > slo for b in larger)  # the largest budget that meets it
    assert fit.chunked_prefill_s > row.prefill_s  # the trade: more steps, a longer prefill
    text = ch11.chunking_verdict_text([row], slo)
    assert f"the largest that meets it is {fit.max_num_batched_tokens:,} tokens per step" in text
    assert f"the decoders' steps then take {fit.chunked_step_s * 1e3:,.1f} ms on average" in text
    assert f"prefill takes {fit.chunked_prefill_s:,.1f} s instead of {row.prefill_s:,.1f} s" in text
    # a prompt whose share of the prefill alone misses the target: no budget meets it, and the text says so
    hopeless = replace(row, decode_step_s=2 * slo).at_budget(2048)
    assert ch11.largest_budget_meeting(hopeless, slo) is None
    text = ch11.chunking_verdict_text([hopeless], slo)
    assert f"no budget down to {min(ch11.AGENT_BUDGETS):,} tokens meets it" in text and "smaller budget" not in text


def test_the_budget_holds_the_decoders_tokens_before_the_prompts_chunk():
    row = ch11.AgentPromptRow("H100-SXM", 1, 200_000, 10.8, 0.0065, 10.8 / 0.0065, 0.0065, 2048, 32).at_budget(2048)
    assert row.chunk_tokens == 2048 - 32 and row.chunks == -(-200_000 // 2016)  # 100 steps, not 98
    assert row.chunked_step_s == pytest.approx(0.0065 + 10.8 * 2016 / 200_000)
    assert "(32 for the decoders, 2,016 for the prompt's chunk)" in ch11.agent_prompt_text([row])
    with pytest.raises(ValueError, match="no room for the prompt"):
        row.at_budget(32)
    assert all(b > 32 for b in ch11.AGENT_BUDGETS)


def test_the_course_numbers_for_coding_agents_miss_the_target_at_the_default_budget_only():
    slo = ch11.serving_tpot_slo_s()
    rows = ch11.agent_prompt_rows("H100-SXM")
    assert all(r.chunked_step_s > slo for r in rows)  # the audit's reading (F11.2), at 2,048 tokens
    text = ch11.agent_prompt_text(rows)
    assert "misses the target" in text and "does not rescue" not in text
    for r in rows:  # the course's own model finds a smaller budget for each prompt, and the page names it
        fit = ch11.largest_budget_meeting(r, slo)
        assert fit is not None and fit == ch11.agent_prompt_rows("H100-SXM", prompts=(r.prompt_tokens,),
                                                                 max_num_batched_tokens=fit.max_num_batched_tokens)[0]
        assert f"the largest that meets it is {fit.max_num_batched_tokens:,} tokens per step" in text


def test_the_worst_gap_is_held_against_the_token_bound_both_ways():
    within = ch11.shrink_text(5.0, 8.0)
    assert "shrank 5.0×, within the 8.0×" in within and "noise" not in within
    beyond = ch11.shrink_text(10.3, 8.0)  # a noisy run: more than the tokens allow
    assert "shrank 10.3×, more than the 8.0×" in beyond and "timing noise" in beyond and "within" not in beyond


def test_the_long_requests_ttft_rose_fell_or_stayed_within_the_noise():
    rose = ch11.ttft_text(0.100, 0.150, noise_s=0.010)
    assert "from 100 ms to 150 ms, later by more than the 10.0 ms" in rose and "price of a smoother stream" in rose
    fell = ch11.ttft_text(0.150, 0.100, noise_s=0.010)
    assert "earlier by more than" in fell and "price of a smoother stream" not in fell
    flat = ch11.ttft_text(0.100, 0.105, noise_s=0.010)
    assert "**within the noise**" in flat and "later by" not in flat and "earlier by" not in flat
    # the chapter's text carries them, from the run's own numbers
    run = _chunking(prefill_step_s=0.400, slow_decode_step_s=0.012)
    text = ch11.chunking_text(run)
    assert ch11.ttft_text(0.400, 0.08, run.decode_step_spread_s()) in text
    assert ch11.shrink_text(0.400 / 0.020, 50 / 16) in text and "timing noise" in text


# --- chapter 12: the batch trend, the frontier shift, the chain curves, token identity


def _point(batch: int, speedup: float, roofline_speedup: float, step_ratio: float = 1.5,
           roofline_step_ratio: float = 1.2) -> ch12.BatchPoint:
    return ch12.BatchPoint(batch, "ngram", 4, 100.0, 100.0 * speedup, speedup, speedup, 4.0, step_ratio,
                           roofline_step_ratio, roofline_speedup, True)


def test_the_batch_trend_says_whether_the_run_follows_the_roofline():
    opposite = [_point(1, 1.13, 3.96, 2.56, 1.01), _point(4, 2.49, 2.26, 1.16, 1.77)]  # the tour's run
    text = ch12.batch_trend_text(opposite)
    assert "disagrees with the roofline's" in text and "right" not in text
    assert "the measured gain rose (1.13× → 2.49×) and the roofline's fell (3.96× → 2.26×)" in text
    agreeing = [_point(1, 2.0, 3.96), _point(4, 1.5, 2.26)]
    text = ch12.batch_trend_text(agreeing)
    assert "gets the trend with batch right on this run" in text and "the measured gain fell" in text
    assert "disagrees" not in text
    assert "no trend" in ch12.batch_trend_text(agreeing[:1])


def test_a_change_of_the_measured_gain_within_noise_is_not_a_trend():
    flat = [_point(1, 1.50, 3.96), _point(4, 1.501, 2.26)]  # 1.50 -> 1.501 is no rise
    text = ch12.batch_trend_text(flat)
    assert "the measured gain stayed flat within noise" in text and "rose" not in text
    assert "disagrees" not in text and "cannot tell" in text and f"{ch12.SINGLE_RUN_NOISE:.0%}" in text
    # a change just beyond the noise is read as one: 1.50 -> 1.50 x (1 + noise) x 1.05 rose
    rose = [_point(1, 1.50, 3.96), _point(4, 1.50 * (1 + ch12.SINGLE_RUN_NOISE) * 1.05, 2.26)]
    assert "the measured gain rose" in ch12.batch_trend_text(rose) and "disagrees" in ch12.batch_trend_text(rose)
    # flat next to a flat roofline is agreement
    both_flat = [_point(1, 1.50, 2.26), _point(4, 1.52, 2.26)]
    assert "gets the trend with batch right" in ch12.batch_trend_text(both_flat)


def test_the_small_batch_comparison_follows_the_numbers():
    assert "predicts more than is measured" in ch12.small_batch_text(_point(1, 1.13, 3.96))
    assert "the measurement reached it" in ch12.small_batch_text(_point(1, 4.2, 3.96))


def _curve(tokens_per_pass: float) -> ch12.RooflineCurve:
    from infer_lab.analysis.roofline import gpu_roof

    return ch12.roofline_curve("mistral-7b on H200", "mistral-7b", gpu_roof("h200"), 4, 600, tokens_per_pass,
                               "bf16", ch12.ANALYTIC_BATCHES)


def test_the_frontier_shift_names_its_task_and_shows_the_chat_case():
    curve = _curve(4.18)
    text = ch12.frontier_shift_text(curve)
    assert "depends on the task" in text and "grounded prompts" in text
    assert f"{curve.speedup[0]:.2f}× the tokens per step at batch 1" in text
    assert "draft's cost" in text and "left out" in text
    nothing_kept = 1 / curve.step_ratio[0]
    assert f"1 token per pass, the same roofline gives {nothing_kept:.2f}× at batch 1" in text
    with_chat = ch12.frontier_shift_text(curve, chat_tokens_per_pass=1.02)
    assert f"kept 1.02 tokens per pass on open-ended chat (section 3): there the same roofline gives " \
           f"{1.02 / curve.step_ratio[0]:.2f}× at batch 1" in with_chat
    good_chat = ch12.frontier_shift_text(curve, chat_tokens_per_pass=3.0)
    assert "a loss" not in good_chat and "no shift worth the name" not in good_chat
    assert "a loss" in ch12.frontier_shift_text(curve, chat_tokens_per_pass=0.5)


def test_the_frontier_shift_says_where_it_falls_under_the_threshold_or_that_it_never_does():
    stays = _curve(4.18)  # levels off above the threshold: no batch computed where it vanishes
    assert stays.vanish_batch is None and min(stays.speedup) >= ch12.VANISHED
    text = ch12.frontier_shift_text(stays)
    assert f"stays above {ch12.VANISHED}× up to batch {stays.batches[-1]:,}, the largest computed" in text
    assert "falls under" not in text and f"{stays.speedup[-1]:.2f}× at batch {stays.batches[-1]:,}" in text
    vanishes = _curve(1.3)
    assert vanishes.vanish_batch is not None
    text = ch12.frontier_shift_text(vanishes)
    assert f"falls under {ch12.VANISHED}× at batch {vanishes.vanish_batch:,}" in text and "stays above" not in text


def _batch_result() -> ch12.BatchResult:
    curve = _curve(4.18)
    return ch12.BatchResult([_point(1, 1.13, 3.96), _point(4, 2.49, 2.26)], [curve, curve], "cpu", 1e10, 1e11, 600,
                            32, "a CPU", 2)


def _workloads(proposer: str, k: int, chat_tokens_per_pass: float) -> ch12.WorkloadResult:
    from types import SimpleNamespace

    rows = [SimpleNamespace(workload=w, proposer=proposer, k=k, tokens_per_pass=t)
            for w, t in (("grounded", 4.18), ("chat", chat_tokens_per_pass))]
    return ch12.WorkloadResult(rows, [], 32, "a CPU", 2)


def test_section_4_shows_section_3s_chat_case_once_it_has_run():
    batch = _batch_result()
    before = ch12.batch_details(batch, ch12.chat_tokens_per_pass(None, batch))  # section 3 not run yet
    reasoning = before["The roofline's reasoning, and speculation as a shift of the frontier"]
    note = ch12.chat_case_note("ngram", 4)  # the proposer and k of _batch_result
    assert note in reasoning and ch12.PARTS["workloads"] in note and "ngram at k = 4" in note
    assert "with nothing kept, 1 token per pass" in reasoning[0]
    chat = ch12.chat_tokens_per_pass(_workloads("ngram", 4, 1.02), batch)
    assert chat == 1.02
    after = ch12.batch_details(batch, chat)["The roofline's reasoning, and speculation as a shift of the frontier"]
    assert note not in after and "kept 1.02 tokens per pass on open-ended chat" in after[0]
    # section 3 measured another proposer or k: nothing to project, and the note stays
    assert ch12.chat_tokens_per_pass(_workloads("self:16", 4, 1.02), batch) is None
    assert ch12.chat_tokens_per_pass(_workloads("ngram", 2, 1.02), batch) is None
    other = ch12.batch_details(batch, ch12.chat_tokens_per_pass(_workloads("ngram", 2, 1.02), batch))
    assert note in other["The roofline's reasoning, and speculation as a shift of the frontier"]


def test_the_chain_curves_text_follows_where_the_cited_points_lie():
    variants = ch12.variants_result([])
    above = ch12.above_chain_curves(variants)
    assert {r.label for r, _, _ in above} >= {"EAGLE-3"}  # 6.5× cannot sit under a k = 4 chain (at most 5)
    text = ch12.chain_curves_text(variants)
    assert "lie above the highest" in text and "tree" in text and "EAGLE-3" in text
    assert f"at most k + 1 = {ch12.CHAIN_K + 1} tokens per pass" in text
    # chains long and sure enough to clear every point: nothing lies above, and the text says so
    assert ch12.above_chain_curves(variants, alphas=(0.99,), k=64) == []
    text = ch12.chain_curves_text(variants, alphas=(0.99,), k=64)
    assert "Every cited speedup drawn lies under" in text and "tree" not in text
    assert ch12.chain_curves_text(variants) in ch12.variants_text(variants)


def test_token_identity_is_claimed_for_exact_arithmetic_and_explained_when_it_fails():
    assert ch12.identical_text(True) == "**yes**"
    differs = ch12.identical_text(False)
    assert differs.startswith("**NO**") and "exact arithmetic" in differs and "different order" in differs
    p = ch12.PassesResult("ngram", 4, 10, 10, 10, 4, 12, 6, (3, 3, 3), identical=False)
    assert differs in ch12.passes_text(p)
    assert "**yes**" in ch12.passes_text(replace(p, identical=True))


def test_the_budgets_tried_are_named_as_they_are():
    assert ch11.budgets_words((16, 32, 64, 128)) == "powers of two from 16 to 128"
    assert ch11.budgets_words((16, 48, 2048)) == "16, 48, 2,048"  # not powers of two: listed


def test_chapter_12s_section_references_follow_its_parts(monkeypatch):
    """Every "section N" the text names is the number of the part it means, from one dict (SECTIONS):
    moving a part moves its number in the headings and in every reference."""
    assert list(ch12.SECTIONS) == list(ch12.PARTS) and list(ch12.SECTIONS.values()) == list(range(1, 6))
    assert ch12.chat_case_note("ngram", 4).startswith(f"*Section {ch12.SECTIONS['workloads']} has not measured")
    monkeypatch.setitem(ch12.SECTIONS, "workloads", 7)  # the part moved: the text follows
    assert ch12.chat_case_note("ngram", 4).startswith("*Section 7 has not measured ngram at k = 4")
