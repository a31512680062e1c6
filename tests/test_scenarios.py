"""Every serving scenario a chapter describes can exist: the planner's own fit check passes and the
context is within the model's limit (issue #23, items 1 and 8)."""

from __future__ import annotations

import pytest

from infer_lab.analysis import memory
from infer_lab.catalog import get_gpu, list_models
from infer_lab.course import chapter


def test_llama_3_1_70b_is_llama_3_70b_with_a_long_context():
    old, new = memory.as_shape("llama-3-70b"), memory.as_shape("llama-3.1-70b")
    assert memory.kv_bytes_per_token(old) == memory.kv_bytes_per_token(new) == 327_680
    assert memory.context_limit(old) == 8192 and memory.context_limit(new) == 131_072
    assert "llama-3.1-70b" in list_models()


def test_scenario_problems_name_both_ways_to_be_impossible():
    h100 = get_gpu("H100-SXM").memory_bytes
    # the configuration issue 23 found in chapter 16: 32 users x 32,768 tokens of Llama-3-70B on 2x H100
    problems = memory.scenario_problems("llama-3-70b", h100, 32_768, users=32, n_gpus=2)
    assert len(problems) == 2 and "8,192 positions" in problems[0] and "at most 1 users" in problems[1]
    assert memory.scenario_problems("llama-3.1-70b", h100, 32_768, users=32, n_gpus=8) == []
    assert memory.within_limit("mistral-7b", [4096, 32768, 65536, 131072]) == [4096, 32768]


@pytest.mark.parametrize("size", ["quick", "full"])
def test_every_scenario_of_chapter_14_fits(size):
    ch16 = chapter("16")
    found = ch16.scenarios(ch16.sizes("cpu", size))
    assert len(found) >= 3
    for sc in found:
        what = sc.pop("what")
        assert memory.scenario_problems(**sc) == [], what
    assert "8 GPUs, the fewest" in ch16.disaggregation_direction(ch16.sizes("cpu", size)).motivation


def test_chapter_14_refuses_a_scenario_that_cannot_fit():
    with pytest.raises(ValueError, match="do not fit on 8x"):
        chapter("16").serving_gpus("llama-3.1-70b", "L4", 131_072, users=64)


def test_chapter_02_caps_one_users_context_and_the_tradeoff_at_the_model_limit():
    ch03 = chapter("03")
    view = ch03.fit_view("mistral-7b", "H100-SXM", 4096, 1)
    assert max(p.context for p in view.tradeoff) <= 32_768 and view.dropped_contexts == (65_536, 131_072)
    text = ch03.fit_text(view)
    assert "reads at most **32,768 positions**" in text and "65,536" in text
    sizes = ch03.sizes("cpu", "quick")  # the chapter's own workload fits and is readable
    assert memory.scenario_problems(sizes.model, get_gpu(sizes.gpu).memory_bytes, sizes.context, sizes.users,
                                    kv_dtype=sizes.kv_dtype) == []


@pytest.mark.parametrize("size", ["quick", "full"])
def test_chapter_04_tradeoff_stays_within_every_model_limit(size):
    ch05 = chapter("05")
    s = ch05.sizes("cpu", size)
    result = ch05.tradeoff(s.models, s.tradeoff_gpu, s.contexts)
    for p in result.points:
        assert p.context <= memory.context_limit(p.model), (p.model, p.context)


def test_chapter_12_scale_out_and_chapter_13_scaling_contexts_are_readable():
    ch13, ch14, ch15 = chapter("13"), chapter("14"), chapter("15")
    q = ch13.SCALE_OUT
    assert q["context"] <= memory.context_limit(q["model"])
    s = ch14.sizes("cpu", "quick")
    assert s.scaling_context <= memory.context_limit(s.scaling_model)
    p = ch15.sizes("cpu", "quick")
    assert p.plan_context <= memory.context_limit(p.plan_model)


def test_chapter_06_variant_tables_stay_within_each_model_limit():
    ch07 = chapter("07")
    rows = ch07.memory_rows()
    assert rows
    for r in rows:
        assert r.context <= memory.context_limit(r.model), (r.model, r.context)
