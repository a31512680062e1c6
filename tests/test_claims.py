"""Each numeric claim of issue #23's list, held by its own check (items named in each test)."""

from __future__ import annotations

import re

import pytest

from infer_lab.attention.quality import VariantQuality
from infer_lab.course import chapter, opener


def test_opener_prices_the_volume_between_two_bounds_and_states_its_mix():  # items 2 and 20
    r = opener.compute()
    for c in r.costs:
        assert 0 < c.usd_per_month_all_input < c.usd_per_month_mix() < c.usd_per_month
        assert c.usd_per_m_input_tokens < c.usd_per_m_tokens
    text = opener.cost_text(r)
    assert f"{opener.ASSUMED_INPUT_PER_OUTPUT:.0f}:1" in text and "lower bound" in text and "upper bound" in text
    assert "spans many models" in text  # the training comparison's caveat
    assert "best case" not in opener.notes(r)
    assert text.split("\n")[-1].startswith("- Training is paid once")  # the deck's slide reads the last line


def test_spending_figures_come_from_the_data_file():  # missing talk topic
    rows = opener._data()["spending"]
    assert [r["value_usd"] for r in rows] == [7.65e11, 1.6e12] and all(r["source"] for r in rows)
    text = opener.spending_text()
    assert "$765 billion" in text and "$1.6 trillion by 2031" in text and "Cited" in text


def _kv(baseline: str):
    ch06 = chapter("06")
    rows = [VariantQuality("as trained", 10.0, 0.0, 46080.0), VariantQuality("int8 KV", 10.1, 0.01, 46080.0 / 3.76)]
    return ch06.kv_text(ch06.KVResult(rows, 256, baseline_dtype=baseline), embedded=False)


def test_kv_quantization_saving_names_its_baseline_dtype():  # item 7
    fp32 = _kv("fp32")
    assert "3.76× less KV per token than this model's fp32 cache" in fp32
    assert "1.88× less than a bf16 cache" in fp32
    assert "bf16 cache, a GPU" not in _kv("bf16") and "this model's bf16 cache" in _kv("bf16")


def test_gpt_oss_text_agrees_with_the_table_under_it():  # item 16
    ch06 = chapter("06")
    text = ch06.gpt_oss_text()
    for row in ch06.fit_rows(gpus=("H100-SXM",), models=("gpt-oss-120b",)):
        users = row.max_users["H100-SXM"]
        assert (f"{row.weight_dtype} ({users:,} users" in text) == (users > 0), row


def test_scale_schemes_are_computed_not_typed():  # item 15
    text = chapter("06").scale_schemes_text()
    numbers = re.findall(r"(\d+\.\d+) GB", text)
    assert len(numbers) == 3 and len(set(numbers)) == 3
    assert "one fp16 scale per 128 weights" in text and "one scale per output row" in text


def test_energy_per_token_states_its_tdp_assumption():  # item 14
    from infer_lab.analysis.capacity import ENERGY_ASSUMPTION

    ch14 = chapter("14")
    assert "TDP" in ENERGY_ASSUMPTION
    text = ch14.scaling_text(ch14.scaling_result())
    assert ENERGY_ASSUMPTION in text
    assert all("TDP" in c.label for c in ch14.FRONTIER_COLUMNS + ch14.LAYOUT_COLUMNS if "J / token" in c.label)


def test_tp_text_names_the_best_layout_and_the_model_differs_from_the_talk():  # items 3 and 10
    ch14 = chapter("14")
    s = ch14.scaling_result()
    text = ch14.scaling_text(s)
    best_pcie = max((r for r in s.layouts if r.gpu == "H100-PCIe"), key=lambda r: r.tokens_per_s)
    assert f"on PCIe come from **{best_pcie.parallelism}**" in text
    assert "a price ratio" in text  # the talk's 6x names no mechanism (talk 2, line 9) ...
    # ... and the talk hedges it ("what seems to be 6 times as many tokens"): no billing is claimed
    assert f"one spending what seems to be about {ch14.TALK_FAST_MODE_COMPUTE:.0f}x the tokens (read as a price)" in text
    assert "billing" not in text
    assert ch14.fixed_batch_text(s.frontier, s.model) in text  # the comparison at a fixed batch, from the frontier


def test_heterogeneous_and_attention_ffn_show_the_whole_comparison():  # items 4 and 5
    ch15 = chapter("15")
    h = ch15.run_hetero(None, ch15.sizes("cpu", "quick"))
    text = ch15.hetero_text(h)
    assert f"all {h.decode_gpu}:" in text and f"all {h.prefill_gpu}:" in text
    s = h.afd_split
    assert f"{s.sequential_step_ms:.1f} ms" in text and "fp8 weights" in text
    seq_gain = s.tokens_per_s_per_gpu * s.step_ms / s.sequential_step_ms / h.afd_colocated.tokens_per_s_per_gpu
    assert f"**{seq_gain:.2f}x**" in text
    assert ("worse than not splitting" in text) == (seq_gain < 1)


def test_no_development_target_on_the_page():  # item 13
    from infer_lab.course import ch12_speculative_decoding as mod

    assert not hasattr(mod, "target_check")


def test_the_saved_hf_step_is_one_range_in_every_chapter():  # item 9
    from infer_lab.course.ch02_feel_the_pain import saved_batch1_steps_ms
    from infer_lab.course.saved import load_saved

    data = load_saved("*hf-baseline*.json")[0].data
    lo, hi = saved_batch1_steps_ms(data)
    assert lo < hi
    quoted = f"between **{lo:.0f} and {hi:.0f} ms**"
    ch09_text, ch04_note = chapter("09").launch_overhead_text(), chapter("04").saved().notes[1]
    assert quoted in ch09_text and quoted in ch04_note
    ratio = re.search(r"\((\d+–\d+)× the roofline's", ch09_text).group(1)
    assert f"({ratio}× the roofline's" in ch04_note  # one number, with its reason, in both chapters
    assert "14.2 GB of its 14.5 GB of weights" in ch09_text  # and both weight figures, with why they differ


def test_external_reference_measurements_are_labelled_so():  # saved evidence
    from infer_lab.course.saved import load_saved

    for r in load_saved("h200-*.json"):
        assert r.external and "External reference measurement" in r.label and "not part of this repository" in r.label


def test_the_kv_visualizer_draws_the_room_the_fit_reports():  # 02: visualizer vs "at most N users"
    from infer_lab.analysis import memory
    from infer_lab.catalog import get_gpu
    from infer_lab.course import calculator

    curves = calculator.kv_curves("mistral-7b", context=4096, users=200, gpu="H100-SXM")
    users_at_room = curves.kv_budget_bytes // memory.kv_bytes("mistral-7b", 4096)
    fit = memory.fit("mistral-7b", get_gpu("H100-SXM").memory_bytes, 4096)
    users_at_gpu_line = get_gpu("H100-SXM").memory_bytes // memory.kv_bytes("mistral-7b", 4096)
    assert users_at_room == fit.max_users < users_at_gpu_line
    fig = calculator.kv_visualizer_figure(curves)
    labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert any(label.startswith("room for KV after weights + overhead") for label in labels)


def test_attention_share_and_the_talks_claim():  # item 17
    ch03 = chapter("03")
    cross = ch03.attention_crossover_context("mistral-7b")
    below, above = ch03.flop_share("mistral-7b", cross - 1), ch03.flop_share("mistral-7b", cross)
    assert below.attention_flops < below.layers_flops / 2 <= above.attention_flops
    text = ch03.attention_claim_text("mistral-7b", 4096)
    assert f"{cross:,} tokens" in text and "most compute-intensive" in text


def test_the_model_table_explains_sliding_windows_and_active_parameters():  # item 18
    ch03 = chapter("03")
    notes = ch03.models_notes(ch03.model_rows(4096, models=["gpt-oss-120b", "mistral-7b"]))
    assert "gpt-oss-120b" in notes and "sliding window" in notes and "embedding" in notes
    assert "mistral-7b" not in notes


def test_mla_text_explains_the_talks_correction_kindly():  # item 11
    text = chapter("07").mla_text()
    assert "like-for-like" in text and "not in the transcript" in text  # a reading, not a fact (C07-6)


def test_the_sglang_claim_is_set_against_what_the_cache_alone_saves():  # item 19
    ch10 = chapter("10")
    runs = [ch10.WorkloadRun("agentic_branching", c, 16, 8, 1000, computed, hit, 0.1, 0.1, 1.0)
            for c, computed, hit in (("none", 1000, 0.0), ("hash", 400, 0.60), ("radix", 340, 0.66))]
    text = ch10.sglang_claim_text(ch10.WorkloadsResult(runs, 16, 64, 8))
    assert "3–4×" in text and re.search(r"\b66(\.0)?%", text) and re.search(r"\b60(\.0)?%", text)
    assert f"{400 / 340:.2f}× the prefill tokens" in text and f"{1000 / 340:.2f}× fewer" in text
    assert ch10.sglang_claim_text(ch10.WorkloadsResult(runs[:0], 16, 64, 8)) == ""


def test_the_triangle_has_no_cost_corner():  # item 12
    from infer_lab.analysis.capacity import PRESETS

    for w in PRESETS.values():
        corners = w.corner.split(" (")[0].split(" + ")
        assert set(corners) <= {"quality", "latency", "throughput"}, w.corner


def test_single_run_ratios_near_one_are_not_read_as_differences():  # item 6 (chapter 09's sentences)
    ch09 = chapter("09")
    assert ch09._versus(1.05) == "within one run's noise of" and ch09._versus(0.95) == "within one run's noise of"
    assert ch09._versus(1.85) == "1.85×" and ch09._versus(0.28) == "0.28×"


def test_a_missing_saved_run_says_so_instead_of_an_empty_box(monkeypatch):  # 06, 07, 11, 13
    from infer_lab.course import nb

    monkeypatch.setattr(nb, "has_gpu", lambda: False)
    assert "No GPU run of this chapter is saved" in nb.saved_view(None).text
    monkeypatch.setattr(nb, "has_gpu", lambda: True)
    assert nb.saved_view(None).text == nb.saved_view(None).text and "No GPU run" not in nb.saved_view(None).text


def test_chapter_12_says_no_vllm_or_sglang_run_is_saved():
    ch13 = chapter("13")
    if ch13.saved() is None:
        assert "No saved vLLM or SGLang results" in ch13.summary(ch13.Result(size="quick", model="m"))


def test_the_talks_heterogeneous_claims_are_cited_from_data():  # Trainium + Cerebras over EFA, 3-10x
    """The 3-10x was said of Gimlet's mixed-hardware cloud against homogeneous systems at equal power
    (talk 2, line 23), not of the SRAM chip: the data keeps it off the chip, and the page says whose it is."""
    from infer_lab.catalog import UnknownNameError, get_cited_chip, get_cited_system_claim

    claims = get_cited_chip("Cerebras-WSE-3").talk_claims
    mixed = get_cited_system_claim("heterogeneous-vs-homogeneous")
    assert claims["pairing"]["speedup"] == 5 and claims["pairing"]["baseline"] == "the same physical system size"
    assert not any("power" in key for key in claims)  # no equal-power claim is filed under the chip
    assert mixed["speedup_range"] == [3, 10] and "homogeneous" in mixed["baseline"] and "Gimlet" in mixed["who"]
    text = chapter("15").cited_pairing_text()
    assert "Trainium" in text and "EFA" in text and "Cited, not computed" in text
    claim = text[text.index("3–10×"):]
    assert "Gimlet" in text[:text.index("3–10×")] and claim.index("homogeneous") < claim.index(".")
    assert "not about the SRAM chip" in text and "for the same physical system size" in text
    pair = claims["pairing"]  # which 5x: the pairing's (talk 2, line 23), not the tokens/s ratio
    assert (f"Neither the 3–10× nor the pairing's {pair['speedup']:.0f}× (for {pair['baseline']}) names the "
            "systems compared, a workload or a measured power") in text
    assert "no model, workload or measurement details given" in mixed["source"]
    with pytest.raises(UnknownNameError, match="heterogeneous-vs-homogeneous"):
        get_cited_system_claim("Cerebras-WSE-3")


def test_pd_pools_are_told_with_summarization_and_story_writing():
    ch15 = chapter("15")
    assert ch15._pd_counts("1P:3D TP1") == (1, 3) and ch15._pd_counts("2P H100 : 2D H200 TP1") == (2, 2)
    text = ch15.pools_text({"summarize": "3P:1D TP1", "story": "1P:3D TP1"})
    assert "prefill 3 of 4" in text and "prefill 1 of 4" in text and "expected direction" not in text
    assert "expected direction" in ch15.pools_text({"summarize": "1P:3D TP1", "story": "3P:1D TP1"})


@pytest.mark.parametrize("gpu", ["H100-SXM", "L4"])
def test_a_coding_agents_prompt_is_priced_on_the_learners_gpu(gpu):  # chunked prefill's motivation
    from infer_lab.analysis import memory

    ch11 = chapter("11")
    rows = ch11.agent_prompt_rows(gpu)
    assert [r.prompt_tokens for r in rows] == [200_000, 1_000_000]
    for r in rows:
        assert r.prompt_tokens <= memory.context_limit(ch11.AGENT_MODEL)
        assert r.steps_missed == pytest.approx(r.prefill_s / r.decode_step_s)
        assert r.decode_step_s < r.chunked_step_s < r.prefill_s
    assert rows[1].prefill_s > 5 * rows[0].prefill_s * rows[0].n_gpus / rows[1].n_gpus  # attention is quadratic
    text = ch11.agent_prompt_text(rows)
    assert f"{rows[0].steps_missed:,.0f} decode steps" in text
    with pytest.raises(ValueError, match="reads at most"):
        ch11.agent_prompt_rows(gpu, model="mistral-7b")


def test_qat_and_speculation_as_a_frontier_shift_are_on_the_page():
    from infer_lab.analysis.roofline import gpu_roof

    assert "QAT" in chapter("06").qat_vs_ptq_text() and "PTQ" in chapter("06").qat_vs_ptq_text()
    ch12 = chapter("12")
    curve = ch12.roofline_curve("h200", "mistral-7b", gpu_roof("h200"), 4, 600, 2.2, "bf16", ch12.ANALYTIC_BATCHES)
    text = ch12.frontier_shift_text(curve)
    assert f"{curve.speedup[0]:.2f}× the tokens per step at batch 1" in text
