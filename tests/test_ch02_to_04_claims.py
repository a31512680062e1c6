"""Chapters 02-04: every sentence that compares numbers follows the numbers (audit C02-C04).

Each claim is checked on the case a run shows and on the inverted case, where the comparison goes
the other way and the words must change with it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infer_lab.analysis import memory, roofline
from infer_lab.analysis.params import param_counts
from infer_lab.analysis.roofline import Roof
from infer_lab.catalog import get_gpu
from infer_lab.course import ch02_feel_the_pain as ch02
from infer_lab.course import ch03_memory_equation as ch03
from infer_lab.course import ch04_prefill_decode_roofline as ch04
from infer_lab.course import chapter
from infer_lab.timing import MachineLoad

QUIET = MachineLoad(others_cores=0.0, cores=2, load1=0.1, sample_s=0.3)
BUSY = MachineLoad(others_cores=2.0, cores=2, load1=6.0, sample_s=0.3)


# --- C02-1: the users panel's line carries the context its dots were measured at


def _memory(first_context: int, per_token: int = 46_080, weights: int = 538_060_032) -> ch02.MemoryResult:
    contexts, users = (first_context, 4 * first_context), (1, 4)
    points = [ch02.MemoryPoint("context", c, 1, per_token * c, weights) for c in contexts]
    points += [ch02.MemoryPoint("users", first_context, u, per_token * first_context * u, weights) for u in users]
    return ch02.MemoryResult(points, 8 * 10**9, "RAM", 8192, per_token)


@pytest.mark.parametrize("first_context", [64, 512])
def test_the_users_panel_dots_sit_on_its_line(first_context):
    result = _memory(first_context)
    ax = ch02.memory_figure(result, "test").axes[1]
    line, dots = ax.lines[0], next(x for x in ax.lines if x.get_marker() == "o")
    on_line = np.interp(dots.get_xdata(), line.get_xdata(), line.get_ydata())
    assert np.allclose(on_line, dots.get_ydata(), rtol=1e-3)  # the dots are on the line, not below it
    assert f"{first_context:,} tokens each" in ax.get_xlabel()
    legend = ax.get_legend()
    assert legend is not None and any(f"at {first_context:,} tokens" in t.get_text() for t in legend.get_texts())


def test_the_page_names_the_context_of_the_users_panel():
    assert "each at 64 tokens" in ch02.memory_panels_text((64, 256), (1, 4))
    assert "each at 512 tokens" in ch02.memory_panels_text((512, 2048), (1, 8, 32))


# --- C02-2: the decode sweep leaves out what the device's memory cannot hold


def test_the_gpu_sweep_leaves_out_the_points_whose_kv_does_not_fit():
    sizes = ch02.sizes("cuda", "full")
    h100, h200 = get_gpu("H100-SXM"), get_gpu("H200")
    plan = ch02.itl_plan_for("mistral-7b", "bf16", sizes.itl_contexts, sizes.itl_batches, sizes.itl_steps,
                             h100.memory_bytes, "GPU memory")
    biggest = (max(sizes.itl_contexts), max(sizes.itl_batches))
    assert biggest in plan.left_out and biggest not in plan.measured
    assert memory.kv_bytes("mistral-7b", biggest[0], biggest[1], "bf16") > h100.memory_bytes  # the audit's 275 GB
    for context, batch in plan.measured:  # everything kept fits beside the weights
        assert memory.fit("mistral-7b", h100.memory_bytes, context + sizes.itl_steps + 1, users=batch,
                          prefill_chunk=batch * context).fits
    bigger = ch02.itl_plan_for("mistral-7b", "bf16", sizes.itl_contexts, sizes.itl_batches, sizes.itl_steps,
                               h200.memory_bytes, "GPU memory")
    assert set(plan.measured) < set(bigger.measured)  # more memory, more of the sweep
    assert f"batch {biggest[1]:,} at {biggest[0]:,} tokens" in ch02.left_out_text(plan)
    nothing = ch02.itl_plan_for("mistral-7b", "bf16", (128,), (1,), 4, 10**9, "RAM")  # 14.5 GB of weights in 1 GB
    assert nothing.measured == [] and "Nothing in this sweep fits" in ch02.itl_prediction(None, nothing)


def test_the_itl_prediction_quotes_only_points_that_will_be_measured(embedded):
    kept = ch02.ITLPlan([(64, 1), (64, 4)], [(256, 4)], 10**9, "RAM")
    text = ch02.itl_prediction(embedded, kept)
    assert "batch 4 and 64 tokens" in text and "Left out of the sweep: batch 4 at 256 tokens" in text
    everything = ch02.ITLPlan([(64, 1), (64, 4), (256, 4)], [], 10**9, "RAM")
    text = ch02.itl_prediction(embedded, everything)
    assert "batch 4 and 256 tokens" in text and "Left out" not in text


# --- C02-4 and C02-3: the ITL verdict compares batches at one context; a contradiction is reported


def _itl(steps_s: dict[tuple[int, int], float]) -> list[ch02.ITLPoint]:
    return [ch02.ITLPoint(c, b, s, 1.1 * s, 6, 1000 * b * c) for (c, b), s in sorted(steps_s.items())]


# the audit's table: batch 4 wins at each context, though batch 4 at 256 tokens loses to batch 1 at 64
AUDIT_TABLE = {(64, 1): 0.4648, (64, 4): 1.465, (256, 1): 1.764, (256, 4): 5.728}


def test_the_itl_verdict_compares_batches_at_the_same_context():
    text = ch02.itl_text(_itl(AUDIT_TABLE), QUIET)
    assert text.startswith("**This run shows it:**") and "2 of 2 contexts" in text
    assert "At 64 tokens, batch 4 gave 2.73 tokens/s in total against 2.15 at batch 1" in text
    assert "at 256 tokens, batch 4 gave 0.698 tokens/s in total against 0.567 at batch 1" in text


def test_the_itl_verdict_turns_when_the_bigger_batch_loses_at_every_context():
    inverted = {(64, 1): 0.4, (64, 4): 2.0, (256, 1): 1.0, (256, 4): 5.0}  # batch 4: 0.8x the tokens/s at both
    quiet = ch02.itl_text(_itl(inverted), QUIET)
    assert quiet.startswith("**This run measured the opposite:**") and "0 of 2 contexts" in quiet
    assert "failed measurement" not in quiet and "This run shows it" not in quiet
    busy = ch02.itl_text(_itl(inverted), BUSY)  # a busy machine explains it: inconclusive, with the load named
    assert busy.startswith("**Inconclusive on this run:**") and "machine was busy" in busy


def test_the_itl_verdict_is_inconclusive_when_the_contexts_disagree_or_no_batches_compare():
    mixed = {(64, 1): 0.4, (64, 4): 1.0, (256, 1): 1.0, (256, 4): 5.0}  # wins at 64, loses at 256
    text = ch02.itl_text(_itl(mixed), QUIET)
    assert text.startswith("**Inconclusive on this run:** the contexts disagree (the bigger batch won at 1 and "
                           "lost at 1 of 2 contexts)")
    assert "spread" not in text  # no spread was compared: the contexts point different ways
    agreeing = ch02.itl_text(_itl(AUDIT_TABLE), QUIET)  # the bigger batch won at every context
    assert "disagree" not in agreeing and "2 of 2 contexts" in agreeing
    single = ch02.itl_text(_itl({(64, 1): 0.4, (256, 4): 1.0}), QUIET)  # one batch per context: nothing to compare
    assert single.startswith("**Not compared on this run:**") and "one batch size" in single
    assert "noise" not in single  # nothing was timed against anything: pressing again changes nothing


def _serving(sequential_wall_s: float, batched_wall_s: float) -> ch02.ServingResult:
    one = sequential_wall_s / 3
    times = {"sequential": [(i * one, i * one + 0.01, (i + 1) * one) for i in range(3)],
             "batched": [(0.0, 0.02, batched_wall_s)] * 3}
    return ch02.serving_result(times, 32, 8)


def test_the_serving_verdict_reports_what_was_measured_both_ways():
    faster = ch02.serving_text(_serving(3.0, 1.5), QUIET)
    assert faster.startswith("**This run shows it:**") and "**2.00×**" in faster
    slower = ch02.serving_text(_serving(3.0, 4.0), QUIET)
    assert slower.startswith("**This run measured the opposite:** one padded batch served fewer tokens")
    assert "**0.75×**" in slower and "failed measurement" not in slower
    assert ch02.serving_text(_serving(3.0, 4.0), BUSY).startswith("**Inconclusive on this run:**")


# --- C03-1, C03-3: the planner's settings are named as settings, from the code that applies them


def test_the_usable_memory_fraction_is_the_one_the_planner_applies():
    gpu = get_gpu("H100-SXM")
    report = memory.fit("mistral-7b", gpu.memory_bytes, 4096)
    assert report.usable_bytes == int(ch03.PLANNER_MEMORY_FRACTION * gpu.memory_bytes)
    assert f"{ch03.PLANNER_MEMORY_FRACTION:.0%} of the GPU's memory" in ch03.fit_intro()
    assert "80% of the GPU's memory" in ch03.memory_fraction_text(0.8) and "setting" in ch03.memory_fraction_text()


def test_vllms_default_is_cited_with_where_it_was_read():
    text = ch03.memory_fraction_text()
    assert f"`vllm/config/cache.py`, defaults to {ch03.VLLM_MEMORY_UTILIZATION:g}" in text
    assert f"docs said {ch03.VLLM_OLD_MEMORY_UTILIZATION:g}" in text
    assert f"slider (chapter {chapter('capacity_planner').NUMBER})" in text


def test_the_kept_dtype_covers_embeddings_lm_head_and_norms():
    counts = param_counts(memory.as_shape("mistral-7b"))
    kept = counts.embeddings + counts.lm_head + counts.norms
    assert counts.lm_head > 0  # Mistral-7B's LM head is not tied: it is counted on its own
    for keep in ("bf16", "fp32"):
        weights = memory.weight_bytes("mistral-7b", "int4", keep_dtype=keep)
        assert weights.other_bytes == kept * memory.WEIGHT_FORMATS[keep].bits // 8
        assert f"the LM head and the norms stay in {keep}" in ch03.kept_dtype_text(keep)
    assert f"stay in {ch03.KEPT_DTYPE} " in ch03.kept_dtype_text()


# --- C03-2: the 3,470x is this course's computation on DeepSeek-V3


def test_the_slip_ratio_is_computed_on_the_named_shape():
    trap = ch03.mla_trap()
    text = ch03.mla_text(trap)
    assert trap.wrong_ratio == trap.mha_all_layers / trap.one_layer
    assert f"On {trap.model}'s shape that slip gives {trap.wrong_ratio:,.0f}×" in text
    assert "not that material's figure" in text


def test_the_per_layer_ratio_is_the_talks_figure_only_as_chapter_07_reads_it():
    from infer_lab.attention.kv_sizing import mla_ratio_explained
    from infer_lab.course import ch07_attention_variants as ch07

    trap = ch03.mla_trap()
    match = ch07.ratio_matching(ch07.TALK_MLA_CORRECTED, mla_ratio_explained(trap.model, trap.per_layer_7b_model))
    assert trap.per_layer_7b_is_talk_figure == (match is not None and match.ratio == trap.per_layer_7b_ratio)
    text = ch03.mla_text(trap)
    assert f"probably the talk's corrected {ch07.TALK_MLA_CORRECTED:g}×" in text
    assert "the talk's corrected figure" not in text  # stated as fact before
    unmatched = dataclasses.replace(trap, per_layer_7b_is_talk_figure=False)  # a ratio chapter 07 would not match
    assert f"not the talk's corrected {ch07.TALK_MLA_CORRECTED:g}×" in ch03.mla_text(unmatched)
    assert "probably" not in ch03.talk_figure_words(unmatched)


# --- C03-4: talk 2's rule of thumb against the formula


def test_the_70b_rule_of_thumb_is_checked_against_the_formula():
    rule = ch03.rule_of_thumb()  # Llama-3-70B, bf16 KV
    assert rule.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert rule.formula_bytes == pytest.approx(0.98304e9)
    text = ch03.rule_of_thumb_text(rule)
    assert "**1 GB of KV per 3,000 tokens**" in text and "Daniel, Cerebras" in text
    assert "0.983 GB" in text and "3,052 tokens" in text and "**1.7% above**" in text and "good rule of thumb" in text
    fp32 = ch03.rule_of_thumb_text(ch03.rule_of_thumb(kv_dtype="fp32"))  # twice the bytes: the rule falls short
    assert "below**" in fp32 and "an underestimate by 1.97×" in fp32
    fp8 = ch03.rule_of_thumb_text(ch03.rule_of_thumb(kv_dtype="fp8"))  # half the bytes: the rule is too large
    assert "above**" in fp8 and "an overestimate by 2.03×" in fp8


# --- C04-1: prefill is compute-bound only from a prompt length on


def test_prefill_turns_compute_bound_at_the_crossover_and_not_before():
    crossover = ch04.prefill_crossover_tokens("mistral-7b", "H100-SXM")
    roof = roofline.gpu_roof("H100-SXM")
    assert roofline.predict_prefill("mistral-7b", roof, 1, crossover - 1).bound == "memory"
    assert roofline.predict_prefill("mistral-7b", roof, 1, crossover).bound == "compute"
    assert ch04.prefill_crossover_tokens("mistral-7b", "H200") < crossover  # more bandwidth: a lower ridge
    short = ch04.prefill_bound_text(short_prompt=64)
    assert f"from about **{crossover:,} prompt tokens**" in short and "**memory-bound**" in short
    assert f"shorter than {crossover:,} tokens" in short
    long = ch04.prefill_bound_text(short_prompt=4 * crossover)
    assert "**compute-bound**" in long and "shorter than" not in long


# --- talk 2's "up to 90%" against the roofline's waiting fraction


def test_the_talks_90_percent_is_judged_against_the_waiting_fraction():
    said = f"{ch04.TALK_DECODE_WAIT:.0%}"
    wait = ch04.decode_wait("mistral-7b", "H100-SXM", 1, 4096)
    assert wait.waiting_fraction > ch04.TALK_DECODE_WAIT  # batch 1 on an H100: nearly all waiting
    text = ch04.decode_wait_text()
    assert f"\"up to {said}\"" in text and "conservative side" in text and f"{wait.waiting_fraction:.1%}" in text
    below = ch04.talk_wait_judgement(ch04.TALK_DECODE_WAIT / 2)  # a step that waits less than the talk says
    assert "overstates this case" in below and "conservative" not in below
    assert "conservative side" in ch04.talk_wait_judgement(ch04.TALK_DECODE_WAIT)


# --- C04-2: the attention kernel is the one the model runs, named from the model


def test_the_attention_kernel_is_read_from_the_loaded_model(embedded):
    assert ch04.attention_implementation(embedded) == embedded.model.config._attn_implementation == "sdpa"
    result = ch04.CompareResult("test", Roof("toy", 100.0, 10.0), [], [], [], [], [], 1, "",
                                ch04.attention_implementation(embedded))
    assert "Attention kernel: transformers' `sdpa`" in ch04.compare_text(result)
    unknown = ch04.CompareResult("test", Roof("toy", 100.0, 10.0), [], [], [], [], [], 1, "", "")
    assert "Attention kernel" not in ch04.compare_text(unknown) and ch04.attention_implementation(object()) == ""


def test_a_ratio_within_one_runs_noise_is_no_verdict():
    """A batch within SINGLE_RUN_NOISE of sequential, or a bigger batch within it of the smaller, is a tie."""
    tie = ch02.serving_text(_serving(3.0, 3.0 / (1 + ch02.SINGLE_RUN_NOISE / 2)), QUIET)
    assert tie.startswith("**Inconclusive on this run:**") and "one run's noise" in tie
    just_past = ch02.serving_text(_serving(3.0, 3.0 / (1 + ch02.SINGLE_RUN_NOISE * 2)), QUIET)
    assert just_past.startswith("**This run shows it:**")


# the bigger batch's total tokens/s over the smaller's, per context: batch 1 at 0.4 s and 1.0 s a step
WIN, LOSS, TIE = 1.6, 0.5, 1 + ch02.SINGLE_RUN_NOISE / 2


def _contexts(*ratios: float) -> list[ch02.ITLPoint]:
    steps = {}
    for context, ratio in zip((64, 256, 1024), ratios, strict=False):
        steps[(context, 1)] = 0.4
        steps[(context, 4)] = 4 * 0.4 / ratio  # batch 4 yields `ratio` x batch 1's tokens/s
    return _itl(steps)


def test_every_mix_of_wins_losses_and_ties_is_said_as_it_is():
    band = f"within one run's noise ({ch02.noise_band_text()})"
    both = ch02.itl_text(_contexts(WIN, LOSS, TIE), QUIET)
    assert both.startswith(f"**Inconclusive on this run:** the contexts disagree (the bigger batch won at 1, lost at "
                           f"1 and was {band} at 1 of 3 contexts)")
    assert "Close other programs" in ch02.itl_text(_contexts(WIN, LOSS), BUSY)  # the load named, and the advice
    won = ch02.itl_text(_contexts(WIN, TIE), QUIET)  # it lost nowhere: no "depends on the context"
    assert won.startswith("**Shown at 1 of 2 contexts on this run:**") and "depends on the context" not in won
    lost = ch02.itl_text(_contexts(LOSS, TIE, TIE), QUIET)  # it won nowhere: the loss is named as one
    assert lost.startswith("**This run measured the opposite at 1 of 3 contexts:**") and band in lost
    assert "smaller than" not in lost and "depends on the context" not in lost
    busy = ch02.itl_text(_contexts(LOSS, TIE), BUSY)
    assert busy.startswith("**Inconclusive on this run:** the bigger batch lost at 1 of 2 contexts")
    assert "busy" in busy and "Close other programs" in busy
    tied = ch02.itl_text(_contexts(TIE, TIE), QUIET)
    assert tied.startswith("**Inconclusive on this run:**") and f"{band} at every one" in tied


def test_the_noise_band_is_judged_as_printed():
    """The verdict reads the ratio the page prints (two decimals): 0.91x and 1.10x are past the band."""
    low, high = ch02.noise_band()
    assert (low, high) == (round(1 / (1 + ch02.SINGLE_RUN_NOISE), 2), round(1 + ch02.SINGLE_RUN_NOISE, 2))
    assert ch02.noise_outcome(1 + ch02.SINGLE_RUN_NOISE) == ch02.SUPPORTED
    assert ch02.noise_outcome(1 / (1 + ch02.SINGLE_RUN_NOISE)) == ch02.CONTRADICTED
    assert ch02.noise_outcome(high - 0.002) == ch02.SUPPORTED  # printed as the band's top
    assert ch02.noise_outcome(low + 0.004) == ch02.CONTRADICTED  # printed as its bottom
    assert ch02.noise_outcome(high - 0.006) == ch02.noise_outcome(low + 0.006) == ch02.INCONCLUSIVE
    assert f"a ratio {ch02.noise_band_text()} is one run's noise" in ch02.serving_text(_serving(3.0, 2.9), QUIET)
