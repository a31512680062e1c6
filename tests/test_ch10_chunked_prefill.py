"""Chapter 10: chunked prefill keeps every step under its budget; without it one step runs the whole prompt."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from infer_lab.course import ch10_chunked_prefill as ch10


@pytest.fixture(scope="module")
def chunking(embedded):
    tiny = replace(ch10.sizes("cpu", "quick"), long_prompt=48, decoders=2, decode_tokens=8,
                   chunk_tokens=16, arrive_at_step=2)
    return ch10.measure_chunking(embedded, tiny)


def test_without_chunking_one_step_runs_the_whole_long_prompt(chunking):
    whole = chunking.steps_of(False)
    assert max(p.prefill_tokens for p in whole) == 48
    assert chunking.run(False).long_prefill_steps == 1 and chunking.run(False).chunk_tokens is None


def test_with_chunking_every_step_stays_within_the_budget(chunking):
    chunked = chunking.steps_of(True)
    assert max(p.tokens for p in chunked) <= 16 == chunking.run(True).max_step_tokens
    after = [p for p in chunked if p.step >= 2]
    assert sum(p.prefill_tokens for p in after) == 48  # the whole long prompt, in chunks
    # Two decoders share each step, so at most 14 prompt tokens fit beside them.
    assert chunking.run(True).long_prefill_steps >= math.ceil(48 / 14)


def test_decoders_keep_decoding_and_the_long_request_gets_its_token(chunking):
    for run in chunking.runs:
        assert run.decoder_itl_max_s >= run.decoder_itl_p50_s > 0 and run.long_ttft_s > 0
    assert "ms" in ch10.chunking_text(chunking)


def test_a_budget_that_leaves_no_room_for_prefill_is_refused(embedded):
    with pytest.raises(ValueError, match="no room for prefill"):
        ch10.measure_chunking(embedded, replace(ch10.sizes("cpu", "quick"), chunk_tokens=3, decoders=3))
