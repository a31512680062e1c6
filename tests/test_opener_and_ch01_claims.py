"""The opener's numbers, the memory model of a shipped quantized checkpoint, the self-paced guide's
cross-references and notebook 01's new parts (content audit 2026-12-03: O-1, O-2, O-3, R-1, D-1,
C01-1, I.3, I.4): each claim computed from its numbers, checked where it holds and where it flips."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from page_helpers import edited_notebook

from infer_lab.analysis import memory
from infer_lab.analysis.params import param_counts
from infer_lab.catalog import get_gpu, load_model_config
from infer_lab.course import ch01_foundations as ch01
from infer_lab.course import chapter, chapters, opener
from infer_lab.shape import model_shape
from infer_lab.units import LARGE, fmt_bytes, human

ROOT = Path(__file__).resolve().parents[1]
LONG_INTEGER = re.compile(r"\d{1,3}(?:,\d{3}){5,}")  # 16 digits or more, written out


def _for_people(text: str) -> None:
    assert not re.search(r"\de[+-]?\d", text) and not LONG_INTEGER.search(text), text


# --- units.human: large values as a power of ten (O-2, I.4) ----------------------------------------


@pytest.mark.parametrize(("value", "digits", "keep_zeros", "expected"), [
    (6 * 70_553_706_496 * 15e12, 2, False, "6.3 × 10²⁴"),  # the opener's training FLOPs
    (-6.35e24, 3, False, "-6.35 × 10²⁴"),
    (9.96e24, 2, False, "1 × 10²⁵"),  # the rounding carries into the exponent
    (3.2e15, 3, True, "3.20 × 10¹⁵"),  # a table column keeps its zeros
    (3.2e15, 3, False, "3.2 × 10¹⁵"),
    (8.94e-08, 3, False, "8.94 × 10⁻⁸"),  # the small side is unchanged
    (9.996e-05, 3, False, "1 × 10⁻⁴"),
    (1536.0, 3, False, "1,536"),  # whole numbers below LARGE keep every digit
])
def test_human_writes_huge_and_tiny_values_as_powers_of_ten(value, digits, keep_zeros, expected):
    assert human(value, digits, keep_zeros) == expected
    _for_people(human(value, digits, keep_zeros))


def test_human_switches_to_a_power_of_ten_exactly_at_large():
    below = human(LARGE - 1)
    assert "×" not in below and below.replace(",", "") == str(int(LARGE - 1))  # exact: a float holds it
    assert "×" in human(LARGE) and "×" in human(-LARGE)


def test_the_opener_writes_its_training_flops_rounded():
    result = opener.compute()
    text = opener.cost_text(result)
    flops = human(result.training.training_flops, 2)
    assert f"about {flops} FLOP" in text and "× 10" in flops
    _for_people(opener.summary(result))
    for frame in opener.tables(result).values():
        _for_people(frame.to_string())


def test_the_2025_volume_is_a_lower_bound_as_said():  # O-3
    by_month = {v.as_of: v for v in opener.token_volumes()}
    assert by_month["2025-05"].qualifier == "over"
    assert by_month["2025-05"].label().startswith("over ")


# --- D-1: gpt-oss in mxfp4 as shipped ------------------------------------------------------------


def test_gpt_oss_mxfp4_counts_only_the_experts_in_four_bits():
    counts = param_counts("gpt-oss-120b")
    mx, bf16 = memory.weight_format("mxfp4"), memory.weight_format("bf16")
    shipped = memory.weight_bytes("gpt-oss-120b", "mxfp4")
    assert shipped.total == mx.bytes_for(counts.experts) + bf16.bytes_for(counts.total - counts.experts)
    assert shipped.kept_modules  # read from the config's quantization_config
    assert memory.weight_bytes(model_shape("gpt-oss-120b"), "mxfp4").total == shipped.total  # a shape too
    # the same config without the block: every matmul in 4 bits, fewer bytes
    bare = {k: v for k, v in load_model_config("gpt-oss-120b").items() if k != "quantization_config"}
    every_matmul = memory.weight_bytes(bare, "mxfp4")
    assert every_matmul.total == mx.bytes_for(counts.matmul) + bf16.bytes_for(counts.total - counts.matmul)
    assert every_matmul.total < shipped.total and not every_matmul.kept_modules
    # the list names what it keeps: keeping the whole MLP leaves only attention quantized (it is not kept)
    config = load_model_config("gpt-oss-120b")
    mlp_kept = {**config, "quantization_config": {"quant_method": "mxfp4",
                                                  "modules_to_not_convert": ["model.layers.*.mlp"]}}
    assert memory.weight_bytes(mlp_kept, "mxfp4").matmul_bytes == mx.bytes_for(counts.attention)
    # the list belongs to the checkpoint's own format: int4 applied by the course quantizes every matmul
    int4 = memory.weight_bytes("gpt-oss-120b", "int4")
    assert int4.matmul_bytes == memory.weight_format("int4").bytes_for(counts.matmul) and not int4.kept_modules


def test_chapter_06_prints_the_shipped_size():
    from infer_lab.course import ch06_quantization as ch06

    assert f"{fmt_bytes(memory.weight_bytes('gpt-oss-120b', 'mxfp4').total)} in mxfp4" in ch06.gpt_oss_text()


# --- R-1 / I.3: the self-paced guide's cross-references ------------------------------------------


def _self_paced():
    spec = importlib.util.spec_from_file_location("build_self_paced", ROOT / "scripts" / "build_self_paced.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOPICS = {"memory equation": "memory equation", "capacity planner": "capacity planner", "KV cache": "kv cache",
          "roofline": "roofline", "every step time from": "batching"}


def test_the_cross_references_point_at_the_chapters_they_name():
    text = _self_paced().cross_references(chapter)
    for phrase, in_title in TOPICS.items():
        number = re.search(rf"{phrase} (?:of )?(\d\d)", text).group(1)
        assert in_title in chapter(number).TITLE.lower(), (phrase, number, chapter(number).TITLE)


def test_the_cross_references_follow_a_renumbering():
    numbers = {"memory_equation": "31", "capacity_planner": "52", "kv_cache_paged": "83",
               "prefill_decode_roofline": "44", "batching": "95"}
    text = _self_paced().cross_references(lambda slug: SimpleNamespace(NUMBER=numbers[slug]))
    assert "memory equation of 31" in text and "capacity planner of 52" in text and "KV cache of 83" in text
    assert "roofline of 44" in text and "from 95 on" in text


def test_the_guide_says_where_the_opener_is_taught():
    guide = _self_paced()
    pointer = guide.opener_pointer(chapters())
    home = re.search(r"Chapter (\d\d) opens", pointer).group(1)
    assert chapter(home).OPENER_TITLE == opener.TITLE and opener.TITLE in pointer
    assert guide.opener_pointer([chapter("02")]) == ""  # no chapter opens with it: nothing claimed
    rendered = " ".join(guide.render().split())
    assert guide.cross_references(chapter) in rendered and pointer in rendered


# --- O-1 and C01-1: notebook 01's part 0 and the GPU memory levels --------------------------------


def test_the_rate_guess_says_which_way_it_is_off():
    volume = opener.token_volumes()[-1]
    rate = volume.tokens_per_s
    low, high, close = (ch01.rate_guess_text(g, volume) for g in (rate / 100, rate * 100, rate * 1.2))
    assert "100× higher** than your guess" in low
    assert "100× lower** than your guess" in high
    assert "close" in close and "higher" not in close and "lower" not in close
    assert "You guessed" not in ch01.rate_guess_text(None, volume)
    assert f"**{volume.qualifier} {opener.tokens_in_words(rate)} tokens per second**" in low


def test_the_rate_carries_the_volumes_qualifier():
    volume = opener.token_volumes()[-1]
    assert volume.qualifier == "over"  # Google's own words: a lower bound, so the rate is one too
    rate = opener.tokens_in_words(volume.tokens_per_s)
    assert f"**over {rate} tokens per second**" in ch01.rate_guess_text(None, volume)
    about = dataclasses.replace(volume, qualifier="about")  # an estimate: the rate is "about", not "over"
    text = ch01.rate_guess_text(None, about)
    assert text.startswith("About ") and f"**about {rate} tokens per second**" in text and "over" not in text


def test_the_spending_figures_are_talk_2s_as_it_said_them():
    text = opener.spending_text()
    assert "talk 2" in text and "Cerebras and Gimlet Labs" in text and "two talks" not in text
    assert "about $765 billion" not in text and "$765 billion" in text  # the talk: a flat "$765 billion"


def test_the_gpu_memory_levels_come_from_the_catalog_and_chapter_04():
    from infer_lab.course import ch04_prefill_decode_roofline as ch04

    s = ch04.sizes("cpu", "quick")
    text = ch01.gpu_memory_text()
    assert "SRAM" in text and "shared memory" in text and fmt_bytes(get_gpu(s.gpu).memory_bytes) in text
    wait = ch04.decode_wait(s.model, s.gpu, 1, s.context)
    assert f"{wait.waiting_fraction:.1%}" in ch01.gpu_decode_wait_text()


def test_the_opener_knobs_reach_the_words():
    short = opener.compute(("mistral-7b",), context=1024, itl_slo_ms=20.0)
    default = opener.compute()
    assert short.context == 1024 and f"at {short.context:,} tokens" in opener.batch_text(short)
    assert f"at {default.context:,} tokens" in opener.batch_text(default)
    assert [c.model for c in short.costs] == ["mistral-7b"] and short.costs[0].itl_slo_ms == 20.0
    assert "under 20 ms" in opener.cost_text(short)


def test_changing_the_context_in_the_opener_cell_changes_the_prices(tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    _, shipped = edited_notebook("01", tmp_path).why_cost_matters.run(ch01=ch01, mo=mo, opener=opener,
                                                                      rate_guess=SimpleNamespace(value=9))
    assert shipped["opening"] == opener.compute()  # the cell as shipped: the opener's own models, context and SLO
    cell = edited_notebook("01", tmp_path, tokens_per_user=1024).why_cost_matters
    _, defs = cell.run(ch01=ch01, mo=mo, opener=opener, rate_guess=SimpleNamespace(value=9))
    edited = defs["opening"]
    assert edited.context == 1024 != opener.compute().context
    assert edited.batch_costs[-1].users > opener.compute().batch_costs[-1].users  # shorter: more users fit


def test_the_loop_question_counts_the_prompt_with_the_models_tokenizer(embedded):
    prompt = ch01.sizes("cpu", "quick").loop_prompt
    count = len(embedded.tokenizer.encode(prompt))
    assert f"**{count} tokens for this model's tokenizer**" in ch01.loop_question(embedded, prompt)
    longer = prompt + " a city on the Seine"  # a longer prompt: a larger count, from the same tokenizer
    assert f"**{len(embedded.tokenizer.encode(longer))} tokens" in ch01.loop_question(embedded, longer)
    assert len(embedded.tokenizer.encode(longer)) > count
    no_tokenizer = SimpleNamespace(tokenizer=None, word_ids=lambda text: torch.arange(len(text.split()))[None])
    assert f"**{len(prompt.split())} token ids (no tokenizer" in ch01.loop_question(no_tokenizer, prompt)
