"""The mini serving engine is token-identical to transformers greedy generate in every mode.

One HF reference run (20 prompts of varied lengths, some sharing a system prompt) is reused by
every mode; each mode runs the prompts through the engine in a batch, so the whole file stays fast.
"""

from __future__ import annotations

import pytest
import torch

from infer_lab.engine import Engine, EngineConfig, EngineModel, SamplingParams

from engine_helpers import NEW_TOKENS, assert_pool_clean


@pytest.fixture(scope="module")
def model(embedded) -> EngineModel:
    return EngineModel.from_hf(embedded.model)


def run_engine(model: EngineModel, prompts, arrival_steps=None, **config) -> tuple[Engine, list]:
    engine = Engine(model, EngineConfig(**config))
    outs = engine.generate(
        prompts, SamplingParams(max_tokens=NEW_TOKENS), arrival_steps=arrival_steps
    )
    return engine, [o.token_ids for o in outs]


def test_model_logits_equal_transformers(embedded, model, prompts):
    from infer_lab.engine import AttentionMetadata

    ids = torch.tensor(prompts[3])
    with torch.inference_mode():
        expected = embedded.model(ids[None]).logits[0].float()
    meta = AttentionMetadata(
        query_lens=[len(ids)], context_lens=[len(ids)], sample_indices=list(range(len(ids)))
    )
    got = model.forward(ids, torch.arange(len(ids)), meta, None)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_rope_frequencies_come_from_the_config(embedded, model):
    theta = embedded.model.config.rope_parameters["rope_theta"]
    assert model.shape.rope_theta == theta == 100000.0
    torch.testing.assert_close(model.inv_freq, embedded.model.model.rotary_emb.inv_freq.float())


@pytest.mark.parametrize(
    "config",
    [
        dict(kv_mode="contiguous", max_model_len=256),
        dict(kv_mode="paged", block_size=16),
        dict(kv_mode="paged", block_size=1),
        dict(kv_mode="paged", block_size=32),
    ],
    ids=["contiguous", "paged-b16", "paged-b1", "paged-b32"],
)
def test_batched_modes_match_transformers(model, prompts, reference, config):
    engine, outs = run_engine(model, prompts, max_num_seqs=20, **config)
    assert outs == reference
    assert_pool_clean(engine)


def test_no_cache_matches_transformers(model, prompts, reference):
    engine, outs = run_engine(model, prompts[:6], kv_mode="nocache", max_num_seqs=6)
    assert outs == reference[:6]
    assert_pool_clean(engine)


def test_staggered_arrivals_and_few_slots(model, prompts, reference):
    engine, outs = run_engine(
        model, prompts, arrival_steps=list(range(20)), max_num_seqs=6, block_size=16
    )
    assert outs == reference
    assert max(r.num_seqs for r in engine.step_log) <= 6
    assert_pool_clean(engine)


@pytest.mark.parametrize("cache,block_size", [("hash", 16), ("radix", 16), ("radix", 1)])
def test_prefix_cache_hits_are_token_identical(model, prompts, reference, cache, block_size):
    subset, expected = prompts[4:14], reference[4:14]  # 8 of these share the long system prompt
    engine = Engine(model, EngineConfig(prefix_cache=cache, block_size=block_size, max_num_seqs=4))
    first = [o.token_ids for o in engine.generate(subset, SamplingParams(max_tokens=NEW_TOKENS))]
    assert first == expected
    hits_first = engine.prefix_cache.stats.hit_tokens
    assert hits_first > 0  # the shared system prompt was found
    again = [o.token_ids for o in engine.generate(subset, SamplingParams(max_tokens=NEW_TOKENS))]
    assert again == expected
    stats = engine.prefix_cache.stats
    assert stats.hit_tokens - hits_first >= sum(len(p) for p in subset) - len(subset) * block_size
    assert 0 < stats.hit_rate < 1
    assert_pool_clean(engine)


def test_radix_reuses_a_partial_block_that_hash_cannot(model, embedded):
    base = embedded.random_ids(1, 40, seed=5)[0].tolist()
    a, b = base + [500, 501], base + [600, 601, 602]
    for cache, expected_hit in (("hash", 32), ("radix", 40)):
        engine = Engine(model, EngineConfig(prefix_cache=cache, block_size=16, max_num_seqs=1))
        engine.generate([a, b], SamplingParams(max_tokens=2, ignore_eos=True))
        assert engine.output("req-1").num_cached_prompt_tokens == expected_hit
        assert_pool_clean(engine)


def test_chunked_prefill_matches_and_mixes_prefill_with_decode(model, prompts, reference):
    engine, outs = run_engine(
        model,
        prompts,
        arrival_steps=[2 * i for i in range(20)],
        chunked_prefill=True,
        max_num_batched_tokens=24,
        block_size=16,
    )
    assert outs == reference
    assert max(r.num_tokens for r in engine.step_log) <= 24
    assert any(r.prefill_tokens and r.decode_tokens for r in engine.step_log)
    assert_pool_clean(engine)


def test_forced_preemption_is_token_identical(model, prompts, reference):
    # 14 blocks of 16 = 224 tokens for 20 requests: running requests must give their blocks back.
    engine, outs = run_engine(
        model, prompts, max_num_seqs=20, block_size=16, num_blocks=14, max_model_len=224
    )
    assert engine.scheduler.num_preemptions > 0
    assert outs == reference
    assert max(r.kv_blocks_used for r in engine.step_log) <= 14
    assert_pool_clean(engine)


def test_static_batching_waits_for_the_whole_batch(model, prompts, reference):
    engine, outs = run_engine(model, prompts[:6], policy="static", max_num_seqs=3)
    assert outs == reference[:6]
    seqs = list(engine.requests.values())
    # Nobody from the second batch starts before everybody in the first batch has finished.
    assert max(s.token_times_s[-1] for s in seqs[:3]) < min(s.token_times_s[0] for s in seqs[3:])
    assert_pool_clean(engine)


@pytest.mark.parametrize(
    "config",
    [
        dict(batched_decode=False),
        dict(static_decode=True, block_size=16),
        dict(static_decode=True, block_size=1, max_num_seqs=5),
        dict(static_decode=True, block_size=32, max_num_seqs=20),
    ],
    ids=["per-sequence-attention", "static-b16", "static-b1-5slots", "static-b32"],
)
def test_decode_paths_match_transformers(model, prompts, reference, config):
    """Per-sequence attention (the reference path) and the fixed-shape padded decode runner."""
    engine, outs = run_engine(model, prompts, arrival_steps=[i // 3 for i in range(20)], **config)
    assert outs == reference
    if engine.decode_runner is not None:
        assert not engine.decode_runner.use_cuda_graphs  # CPU: the static path runs eagerly
        assert any(r.prefill_tokens == 0 and r.num_seqs > 1 for r in engine.step_log)
    assert_pool_clean(engine)


def test_static_decode_with_chunked_prefill_and_preemption(model, prompts, reference):
    engine, outs = run_engine(
        model,
        prompts,
        arrival_steps=[i for i in range(20)],
        static_decode=True,
        chunked_prefill=True,
        max_num_batched_tokens=32,
        max_num_seqs=20,
        block_size=16,
        num_blocks=14,
        max_model_len=224,
    )
    assert outs == reference
    assert engine.scheduler.num_preemptions > 0
    assert_pool_clean(engine)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "separate-gemms"])
def test_fused_and_separate_projections_match_transformers(embedded, model, prompts, reference, fused):
    w = model.layers[0]
    attn = embedded.model.model.layers[0].self_attn
    n_q = attn.q_proj.weight.shape[0]
    assert w.qkv_proj.shape[0] == n_q + 2 * attn.k_proj.weight.shape[0]
    # fused once at load: transformers' own weights are views into the stacked tensor
    assert attn.k_proj.weight.data_ptr() == w.qkv_proj[n_q:].data_ptr()
    engine, outs = run_engine(
        model, prompts, max_num_seqs=20, static_decode=True, fuse_projections=fused
    )
    assert outs == reference
    assert_pool_clean(engine)


@pytest.mark.parametrize("kv_mode", ["paged", "contiguous"])
def test_a_lone_decode_reads_its_kv_in_place_and_stays_identical(model, prompts, reference, kv_mode):
    """One user at a time: each request's context is one run of slots, read as a view (no gather)."""
    engine = Engine(model, EngineConfig(max_num_seqs=1, kv_mode=kv_mode))
    calls = {"gather": 0, "span": 0}
    gather, read_span = engine.kv.gather, engine.kv.read_span

    def counting_gather(*a):
        calls["gather"] += 1
        return gather(*a)

    def counting_span(*a):
        calls["span"] += 1
        return read_span(*a)

    engine.kv.gather, engine.kv.read_span = counting_gather, counting_span
    outs = engine.generate(prompts[:4], SamplingParams(max_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == reference[:4]
    # every decode step of every layer read in place: later requests get consecutive blocks too
    decode_steps = sum(1 for r in engine.step_log if r.prefill_tokens == 0)
    assert calls["span"] == decode_steps * model.shape.layers and calls["gather"] == 0
    assert_pool_clean(engine)
    if kv_mode == "paged":  # a table that is not one run falls back to the gather
        from infer_lab.engine import AttentionMetadata

        meta = AttentionMetadata(query_lens=[1], context_lens=[20], block_tables=[[3, 5]])
        assert engine.kv.context_span(meta, 0) is None
        meta.block_tables = [[4, 5, 9]]
        assert engine.kv.context_span(meta, 0) == (4 * engine.kv.block_size, 20)
