"""Claims of chapters 05-08 that the audits found wrong, each computed from its numbers and checked
both ways: the case the run shows and one where the numbers point the other way."""

from __future__ import annotations

import dataclasses

import pytest

from infer_lab.analysis import capacity, memory
from infer_lab.attention import kv_sizing
from infer_lab.catalog import get_gpu
from infer_lab.course import ch05_capacity_planner as ch05
from infer_lab.course import ch06_quantization as ch06
from infer_lab.course import ch07_attention_variants as ch07
from infer_lab.course import ch08_kv_cache_paged as ch08
from infer_lab.course import chapter

# --- chapter 05: a prefill-heavy preset is priced per request, not per output token alone --------------


def test_a_request_cost_splits_prefill_and_decode_from_the_plans_prices():
    plan = capacity.plan("mistral-7b", "MI300X", context=8192, prompt_tokens=7680, weight_dtype="fp8",
                         kv_dtype="fp8")
    cost = capacity.request_cost(plan)
    assert (cost.prompt_tokens, cost.output_tokens) == (7680, 512)
    assert cost.prefill_usd == pytest.approx(7680 * plan.usd_per_m_input_tokens / 1e6)
    assert cost.decode_usd == pytest.approx(512 * plan.usd_per_m_output_tokens / 1e6)
    assert cost.usd_per_m_tokens == pytest.approx(cost.total_usd / 8192 * 1e6)
    short_prompt = capacity.request_cost(dataclasses.replace(plan, prompt_tokens=256))
    assert short_prompt.prefill_share < 0.5 < cost.prefill_share  # the split follows the prompt's length


def test_the_cost_split_words_follow_the_numbers():
    assert ch05.cost_split_words(6.5, 4.0) == "prefill is 62% of the cost, more than decode"
    assert ch05.cost_split_words(4.0, 6.5) == "decode is 62% of the cost, more than prefill"
    assert ch05.cost_split_words(1.0, 1.0) == "prefill and decode cost the same"


def test_the_summarization_preset_line_says_prefill_is_most_of_its_cost():
    presets = {p.preset: p for p in ch05.plan_presets("mistral-7b")}
    summarize, chat = presets["batch-summarization"], presets["premium-chat"]
    for preset in (summarize, chat):
        cost = capacity.request_cost(preset.best)
        line = ch05.preset_line(preset)
        assert f"{cost.prompt_tokens:,} prompt + {cost.output_tokens:,} output tokens" in line
        assert ch05.cost_split_words(cost.prefill_usd, cost.decode_usd) in line
    assert capacity.request_cost(summarize.best).prefill_share > 0.5
    assert capacity.request_cost(chat.best).prefill_share < 0.5
    assert "prefill is" in ch05.preset_line(summarize) and "decode is" in ch05.preset_line(chat)


# --- chapter 06: activation outliers are not a weight-scale matter; NF4 is one format in 03 and 06 ----------


def test_the_median_feature_steps_follow_the_outlier_ratio():
    from infer_lab.quant.formats import INT8_MAX

    assert ch06.median_feature_steps(30.0) == f"{INT8_MAX / 30:.1f} of int8's {INT8_MAX} steps on each side of zero"
    far = ch06.median_feature_steps(4 * INT8_MAX)  # the other way: under half a step left
    assert "rounds to zero" in far and "rounds to zero" not in ch06.median_feature_steps(30.0)


def test_the_outlier_words_say_the_weight_only_formats_do_not_scale_activations():
    row = ch06.OutlierRow("model.layers.0.self_attn.q_proj", 3, 60.0, 2.0, 30.0)
    text = ch06.outliers_text([row])
    assert ch06.median_feature_steps(30.0) in text
    assert "weight-only" in text and "LLM.int8" in text and "AWQ" in text
    assert "confine" not in text  # group-wise weight scales do not contain an activation outlier


def test_nf4_counts_the_same_bits_in_the_memory_equation_and_the_quantizer():
    import torch

    from infer_lab.quant.formats import NF4_FORMAT, quantize_nf4

    weight = torch.randn(32, 4 * NF4_FORMAT.group_size)
    stored = quantize_nf4(weight)
    assert NF4_FORMAT is memory.WEIGHT_FORMATS["nf4"]
    assert stored.nbytes == memory.WEIGHT_FORMATS["nf4"].bytes_for(weight.numel())
    assert stored.nbytes * 8 / weight.numel() == NF4_FORMAT.bits_per_element
    text = ch06.nf4_scheme_text()
    assert f"{NF4_FORMAT.bits_per_element:g} bits per weight" in text
    assert f"{memory.weight_bytes('mistral-7b', 'nf4').total / 1e9:.2f} GB" in text


def test_int4_counts_the_same_bits_in_the_memory_equation_and_the_symmetric_quantizer():
    import torch

    from infer_lab.quant.formats import INT4_FORMAT, INT4_ZERO_POINT_BITS, quantize_int4

    weight = torch.randn(32, 4 * INT4_FORMAT.group_size)
    groups = weight.shape[0] * weight.shape[1] // INT4_FORMAT.group_size
    assert INT4_FORMAT is memory.WEIGHT_FORMATS["int4"]
    assert quantize_int4(weight, symmetric=True).nbytes == INT4_FORMAT.bytes_for(weight.numel())
    # the zero-point variant is not what the planner counts: it stores one zero point more per group
    zero_point = quantize_int4(weight).nbytes
    assert zero_point == INT4_FORMAT.bytes_for(weight.numel()) + groups * INT4_ZERO_POINT_BITS // 8
    assert zero_point * 8 / weight.numel() > INT4_FORMAT.bits_per_element


def test_the_scale_schemes_text_names_the_chapters_right():
    equation, planner = chapter("memory_equation").NUMBER, chapter("capacity_planner").NUMBER
    text = ch06.scale_schemes_text()
    assert f"memory equation of chapter {equation}" in text and f"capacity planner of chapter {planner}" in text
    assert f"planner (chapter {equation})" not in text
    assert f"chapter {equation}'s table" in ch06.nf4_scheme_text()


def test_chapter_numbers_in_the_text_follow_the_registry(monkeypatch):
    import infer_lab.course as course

    renumbered = {"memory_equation": "31", "capacity_planner": "52"}  # a renumbered course renumbers the text
    real = course.chapter
    monkeypatch.setattr(course, "chapter", lambda slug: _Number(renumbered[slug]) if slug in renumbered else real(slug))
    text = ch06.scale_schemes_text()
    assert "memory equation of chapter 31" in text and "capacity planner of chapter 52" in text


@dataclasses.dataclass(frozen=True)
class _Number:
    NUMBER: str


def test_only_the_from_scratch_formats_are_called_weight_only():
    text = ch06.weight_only_text()
    formats, compare = ch06.part_number("formats"), ch06.part_number("compare")
    assert f"parts {formats}-{compare}" in text and "**only the weights**" in text
    assert "`bnb-int8`" in text and "LLM.int8" in text and "quantizes the activations too" in text
    assert "This chapter's int8, int4 and NF4" not in text
    assert text in ch06.outliers_text([ch06.OutlierRow("model.layers.0.self_attn.q_proj", 7, 60.0, 1.0, 60.0)])


def test_the_shipped_mxfp4_checkpoint_explains_why_it_is_larger_than_int4():
    shipped, int4 = memory.weight_bytes("gpt-oss-120b", "mxfp4"), memory.weight_bytes("gpt-oss-120b", "int4")
    assert shipped.total > int4.total and shipped.kept_modules  # attention, routers, embeddings stay bf16
    text = ch06.shipped_format_text("gpt-oss-120b", "mxfp4", "int4")
    assert text.startswith("mxfp4 is larger than int4") and "modules_to_not_convert" in text
    assert all(f"`{m}`" in text for m in shipped.kept_modules)
    assert f"{memory.WEIGHT_FORMATS['mxfp4'].bits_per_element:g} bits per weight" in text
    # the other way: against int8 mxfp4 is smaller; a model with no shipped checkpoint keeps nothing back
    assert ch06.shipped_format_text("gpt-oss-120b", "mxfp4", "int8").startswith("mxfp4 is smaller than int8")
    plain = ch06.shipped_format_text("mistral-7b", "mxfp4", "int4")
    assert "modules_to_not_convert" not in plain and "over the same weights" in plain
    gib = f"{get_gpu('H100-SXM').memory_gib:g} GiB"
    page = ch06.gpt_oss_text()
    assert text in page and f"On one H100 ({gib})" in page and f"one {gib} GPU" in page and "80 GB GPU" not in page


# --- chapter 07: real deployments, the model's own KV in the window row, the talk's figures as read -------


def test_a_deployment_is_a_power_of_two_of_gpus_for_the_shipped_weights():
    assert kv_sizing.shipped_weight_dtype("deepseek-v3") == "fp8"
    assert kv_sizing.shipped_weight_dtype("mistral-7b") == "bf16"
    spare = 1 + kv_sizing.WEIGHT_SPARE
    weights = memory.weight_bytes("mistral-7b", "bf16").total
    for fewest, deployed in ((1, 1), (3, 4), (4, 4), (5, 8), (9, 16)):  # the memory of a GPU that needs `fewest`
        gpu_memory = int(weights * spare / (fewest - 0.5))
        assert kv_sizing.gpus_to_hold("mistral-7b", gpu_memory, "bf16") == deployed
    rows = [r for r in kv_sizing.variant_memory_table(gpu="H100-SXM") if r.model == "deepseek-v3"]
    heads = memory.as_shape("deepseek-v3").heads
    assert {r.weight_dtype for r in rows} == {"fp8"} and all(heads % r.n_gpus == 0 for r in rows)
    h100 = get_gpu("H100-SXM").memory_bytes
    assert rows[0].n_gpus == kv_sizing.gpus_to_hold("deepseek-v3", h100, "fp8")
    assert rows[0].n_gpus < kv_sizing.gpus_to_hold("deepseek-v3", h100, "bf16")  # the bf16 sizing took more


def test_the_window_row_of_an_mla_model_windows_its_latent_not_the_mha_expansion():
    rows = {r.variant: r for r in kv_sizing.variant_memory_table(models=("deepseek-v3",), context=32768)}
    window = next(v for v in rows if v.startswith("sliding"))
    assert rows[window].kv_bytes_per_user == memory.kv_bytes_per_token("deepseek-v3") * 4096
    assert rows[window].kv_bytes_per_user < rows["MLA"].kv_bytes_per_user < rows["MHA"].kv_bytes_per_user
    gqa = {r.variant: r for r in kv_sizing.variant_memory_table(models=("mistral-7b",), context=32768)}
    assert gqa[next(v for v in gqa if v.startswith("sliding"))].kv_bytes_per_user == (
        memory.kv_bytes_per_token("mistral-7b") * 4096)


def test_the_deployment_sentence_names_each_models_weights_and_gpus():
    rows = ch07.memory_rows("H100-SXM", 32768)
    text = ch07.memory_text(rows)
    for model in {r.model for r in rows}:
        r = next(x for x in rows if x.model == model)
        assert f"{model}, {r.weight_dtype} weights" in text and f"on {r.n_gpus} H100-SXM" in text


def test_the_talks_figures_are_read_against_the_computed_ratios_both_ways():
    from infer_lab.attention.kv_sizing import mla_ratio_explained
    ratios = mla_ratio_explained()
    text = ch07.talk_mla_text(ratios)
    assert f"{ratios['7b_layer'].ratio:.1f}× of {ratios['7b_layer'].comparison}" in text
    assert f"{ratios['same_shape_k128'].ratio:.1f}× of" in text and "probably" in text
    assert "not in the transcript" in text and "Neither forgot" not in text
    other = ch07.talk_mla_text(ratios, first=30.0, corrected=5.0)  # figures no computed ratio is near
    assert other.count("none of the ratios computed here") == 2 and "both are right answers" not in other


def test_the_mla_rope_text_takes_its_sizes_from_the_shape():
    mla = memory.as_shape("deepseek-v3").mla
    text = ch07.mla_rope_text()
    assert f"{mla.kv_lora_rank}-value latent" in text and f"{mla.qk_rope_head_dim}-value key" in text
    assert "rotary position embedding" in text
    with pytest.raises(ValueError):
        ch07.mla_rope_text("mistral-7b")


def test_a_gpus_on_chip_figures_are_cited_to_the_catalogs_source():
    from infer_lab.catalog import get_on_chip_memory
    for gpu in ("MI300X", "H100-SXM"):
        flash = ch07.flash_text(ch07.flash_result(ch07.flash_tiling(gpu), gpu))
        assert get_on_chip_memory(gpu).source in flash and ch07.figure_sources_text(gpu) in flash


# --- chapter 08: the paged/contiguous ratio is set by max_model_len and the workload -------------------


def _fit(contiguous: int, paged: int, mean_tokens: int):
    settings = ch08.WasteSettings()
    per_token = memory.kv_bytes_per_token(settings.shape, settings.kv_dtype)
    rows = [ch08.FitRow("contiguous", contiguous, settings.budget_bytes, contiguous * settings.max_model_len * per_token,
                        contiguous * mean_tokens * per_token, None, settings.max_model_len),
            ch08.FitRow("paged", paged, settings.budget_bytes, paged * mean_tokens * per_token,
                        paged * mean_tokens * per_token, 16, settings.max_model_len)]
    return ch08.FitResult(settings, 16, rows)


def test_the_ratio_is_explained_by_max_model_len_over_the_mean_request():
    mean = 264
    fit = _fit(8, 60, mean)
    expected = f"{fit.settings.max_model_len / mean:.1f}×"
    text = ch08.ratio_cause_text(fit)
    assert f"ends at {mean:,} tokens" in text and f"mean request = {expected}, close to the 7.5× measured" in text
    unlike = ch08.ratio_cause_text(_fit(2, 60, mean))  # the other way: 30× is not what the lengths explain
    assert "unlike the 30.0× measured" in unlike and "close to" not in unlike
    capped = ch08.ratio_cause_text(_fit(8, fit.settings.requests, mean))
    assert "capped by the workload" in capped
    for words in (text, unlike, capped):  # the cited figures stand beside the computed one, every time
        assert f"({ch08.TALK_REQUESTS}×)" in words and f"{ch08.PAPER_THROUGHPUT[0]}–{ch08.PAPER_THROUGHPUT[1]}×" in words


def test_the_fit_text_carries_the_cause_of_its_ratio():
    fit = ch08.run_fit(ch08.WasteSettings())
    assert ch08.ratio_cause_text(fit) in ch08.fit_text(fit)


def test_the_workloads_length_limit_and_its_words_come_from_one_constant(monkeypatch):
    settings = ch08.WasteSettings()
    prompts, outputs = settings.lengths()
    longest = settings.max_model_len // ch08.LENGTH_DIVISOR
    assert max(prompts) <= longest and max(outputs) <= longest
    words = ch08.share_words(ch08.LENGTH_DIVISOR)
    assert f"up to {words} of max_model_len" in ch08.ratio_cause_text(_fit(8, 60, 264))
    for part in ("scenario", "fit"):  # another limit, in both files that read it: the lengths and the words follow it
        monkeypatch.setattr(f"{ch08.__name__}.{part}.LENGTH_DIVISOR", 2)
    prompts, outputs = settings.lengths()
    assert max(prompts + outputs) > longest and max(prompts + outputs) <= settings.max_model_len // 2
    assert "up to half of max_model_len" in ch08.ratio_cause_text(_fit(8, 60, 264))
    assert ch08.share_words(5) == "1/5"
