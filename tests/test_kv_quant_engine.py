"""int8 / fp8 KV blocks in the engine's paged pool: fewer bytes, nearly the same predictions."""

from __future__ import annotations

import pytest

from infer_lab.bench.kv_quality import kv_quant_quality, requests_that_fit
from infer_lab.engine import Engine, EngineConfig, SamplingParams
from infer_lab.evaluation import eval_token_ids

from engine_helpers import assert_pool_clean


def test_quantized_kv_bytes_per_token_are_counted_from_the_tensors(embedded):
    plain = Engine.from_loaded(embedded, EngineConfig())
    assert plain.kv.bytes_per_token == 2 * 30 * 3 * 64 * 4  # SmolLM2-135M, fp32: 46,080 B
    for kv_dtype in ("int8", "fp8"):
        engine = Engine.from_loaded(embedded, EngineConfig(kv_dtype=kv_dtype))
        # one byte per value plus one fp32 scale per token per head: 2 x 30 x 3 x (64 + 4)
        assert engine.kv.bytes_per_token == 2 * 30 * 3 * (64 + 4) == 12_240
    assert requests_that_fit(2**30, 12_240, 1024) == 85 > requests_that_fit(2**30, 46_080, 1024) == 22


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_quantized_kv_predicts_nearly_what_full_precision_does(embedded, kv_dtype):
    ids = eval_token_ids(embedded.tokenizer, max_tokens=160).tolist()
    (row,) = kv_quant_quality(embedded, ids, (kv_dtype,), chunk=32)
    assert row.tokens_scored == len(ids) - 1
    assert row.top1_agreement >= 0.95
    assert abs(row.perplexity_change) < 0.03  # within 3% of the full-precision cache


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_quantized_kv_serves_requests_and_frees_every_block(embedded, prompts, kv_dtype):
    engine = Engine.from_loaded(embedded, EngineConfig(kv_dtype=kv_dtype, max_num_seqs=8, block_size=8,
                                                       prefix_cache="radix"))
    outs = engine.generate(prompts[:8], SamplingParams(max_tokens=6))
    assert all(o.finish_reason in ("stop", "length") and o.token_ids for o in outs)
    assert_pool_clean(engine)


def test_kv_dtype_needs_the_paged_pool():
    with pytest.raises(ValueError, match="paged"):
        EngineConfig(kv_dtype="int8", kv_mode="contiguous").validate()
    with pytest.raises(ValueError, match="kv_dtype must be"):
        EngineConfig(kv_dtype="int4").validate()
