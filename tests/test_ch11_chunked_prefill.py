"""Chapter 11: the workload of a long prompt among decoders, and the prediction the page makes before the run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infer_lab.bench.long_prompt import long_prompt_among_decoders
from infer_lab.course import ch11_chunked_prefill as ch11


def test_the_long_prompt_arrives_last_among_short_decoders(embedded):
    w = long_prompt_among_decoders(embedded, decoders=3, long_prompt=48, arrive_at_step=2, decoder_prompt=8,
                                   decode_tokens=5, long_output=2)
    assert [len(p) for p in w.prompts] == [8, 8, 8, 48]
    assert w.output_lens == [5, 5, 5, 2] and w.arrival_steps == [0, 0, 0, 2]
    assert long_prompt_among_decoders(embedded, 3, 48, 2, 8, 5, 2) == w  # seeded
    with pytest.raises(ValueError, match="at least"):
        long_prompt_among_decoders(embedded, 0, 48, 2)


def test_the_prediction_is_the_whole_prompt_in_one_step_or_the_budget():
    assert ch11.predicted_step_tokens(256, 3, 32) == {False: 259, True: 32}
    assert ch11.predicted_step_tokens(20, 3, 32) == {False: 23, True: 23}  # shorter than the budget: no chunks
    scenario = replace(ch11.sizes("cpu", "quick"), long_prompt=256, decoders=3, max_num_batched_tokens=32)
    text = ch11.prediction_text(scenario)
    assert "256 + 3 = **259 tokens**" in text and "**32 tokens**" in text and "at least 9 steps" in text
