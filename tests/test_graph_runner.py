"""The batched decode attention, the fixed-shape decode runner and the fused projections."""

from __future__ import annotations

import pytest
import torch

from infer_lab.engine import Engine, EngineConfig, EngineModel, SamplingParams
from infer_lab.engine.graph_runner import DecodeBatch, StaticDecodeRunner, buckets_up_to
from infer_lab.engine.kv_cache import PagedKVCache
from infer_lab.engine.layers import causal_attention, decode_attention
from infer_lab.engine.model import fuse_projections


@pytest.fixture(scope="module")
def model(embedded) -> EngineModel:
    return EngineModel.from_hf(embedded.model)


def test_buckets_double_and_end_at_the_limit():
    assert buckets_up_to(1) == [1]
    assert buckets_up_to(20) == [1, 2, 4, 8, 16, 20]
    assert buckets_up_to(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_decode_attention_equals_one_call_per_sequence():
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, d, slots = 6, 2, 16, 200
    k_store = torch.randn(slots, kv_heads, d, generator=gen)
    v_store = torch.randn(slots, kv_heads, d, generator=gen)
    lens = [1, 7, 33, 50]
    tables = [torch.randperm(slots, generator=gen)[:n] for n in lens]  # scattered, like pages
    padded = torch.stack([torch.cat([t, t.new_zeros(50 - len(t))]) for t in tables])
    q = torch.randn(len(lens), heads, d, generator=gen)
    got = decode_attention(q, k_store, v_store, padded, torch.tensor(lens), d**-0.5)
    for i, t in enumerate(tables):
        k = k_store[t].transpose(0, 1)[None]
        v = v_store[t].transpose(0, 1)[None]
        want = causal_attention(q[i][None, :, None, :], k, v, d**-0.5)[0, :, 0]
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)


def test_runner_padding_writes_only_the_scratch_block(model):
    kv = PagedKVCache(
        model.shape, num_blocks=8, block_size=4, dtype=model.dtype, scratch_block=True
    )
    kv.k.zero_()
    kv.v.zero_()
    runner = StaticDecodeRunner(model, kv, max_num_seqs=4, max_model_len=16)
    assert runner.bucket(3, 2) == (4, 2)
    logits = runner.run(
        DecodeBatch(
            input_ids=[5, 6, 7],
            positions=[0, 0, 0],
            slot_mapping=[0, 4, 8],
            block_tables=[[0], [1], [2]],
            context_lens=[1, 1, 1],
        )
    )
    assert logits.shape == (3, model.shape.vocab)
    written = kv.k[0].abs().flatten(1).sum(-1) > 0  # which slots of layer 0 were written
    assert written.nonzero().flatten().tolist() == [0, 4, 8, kv.scratch_block * 4]
    assert kv.pool.all_free()  # the scratch block is outside the pool
    with pytest.raises(ValueError, match="exceeds"):
        runner.bucket(5, 1)


def test_cuda_graphs_and_static_decode_config_errors_are_clear(model):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA device"):
            Engine(model, EngineConfig(cuda_graphs=True))
    with pytest.raises(ValueError, match="kv_mode='paged'"):
        Engine(model, EngineConfig(kv_mode="contiguous", static_decode=True))


def test_static_runner_serves_decode_steps_and_sampling(model, embedded):
    prompts = [embedded.random_ids(1, n, seed=n)[0].tolist() for n in (5, 9, 14)]
    greedy = Engine(model, EngineConfig(static_decode=False)).generate(
        prompts, SamplingParams(max_tokens=6)
    )
    engine = Engine(model, EngineConfig(static_decode=True, max_num_seqs=3))
    outs = engine.generate(prompts, SamplingParams(max_tokens=6))
    assert [o.token_ids for o in outs] == [o.token_ids for o in greedy]
    assert engine.decode_runner.steps >= 5  # every step after the joint prefill
    sampled = [
        Engine(model, EngineConfig(static_decode=static, max_num_seqs=3))
        .generate(prompts, SamplingParams(max_tokens=6, temperature=0.8, seed=3))[1]
        .token_ids
        for static in (False, True)
    ]
    assert sampled[0] == sampled[1]


def test_fusing_repoints_transformers_weights_without_new_memory():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    hf = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 10))
    with torch.inference_mode():
        before = hf(ids).logits
    fuse_projections(hf)
    engine_model = EngineModel.from_hf(hf)
    attn = hf.model.layers[0].self_attn
    fused = engine_model.layers[0].qkv_proj
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()
    assert attn.k_proj.weight.data_ptr() == fused[32:].data_ptr()
    assert hf.model.layers[1].mlp.up_proj.weight.data_ptr() == (
        engine_model.layers[1].gate_up_proj[48:].data_ptr()
    )
    with torch.inference_mode():
        torch.testing.assert_close(hf(ids).logits, before)


@pytest.mark.slow
def test_compiled_layers_are_token_identical(embedded, model):
    """torch.compile's fused layers on the static decode path (about 25 s to compile on 2 cores)."""
    prompts = [embedded.random_ids(1, n, seed=n)[0].tolist() for n in (5, 17, 33)]
    params = SamplingParams(max_tokens=8)
    reference = [o.token_ids for o in Engine(model, EngineConfig()).generate(prompts, params)]
    engine = Engine(model, EngineConfig(compile_layers=True, static_decode=True))
    assert engine.layer_fns.compiled and engine.decode_runner is not None
    outs = [o.token_ids for o in engine.generate(prompts, params)]
    assert outs == reference
    assert engine.decode_runner.steps >= 7


def test_decode_attention_ignores_garbage_in_unwritten_slots():
    """Padding reads no slot that was never written: an uninitialized cache may hold NaN."""
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, d = 4, 2, 8
    k_store = torch.full((64, kv_heads, d), float("nan"))
    v_store = torch.full((64, kv_heads, d), float("nan"))
    written = torch.tensor([3, 9, 10, 40, 41])
    k_store[written] = torch.randn(5, kv_heads, d, generator=gen)
    v_store[written] = torch.randn(5, kv_heads, d, generator=gen)
    slots = torch.tensor([[3, 9, 10, 11, 12, 13], [40, 41, 0, 1, 2, 5]])  # the tails are unwritten
    q = torch.randn(2, heads, d, generator=gen)
    got = decode_attention(q, k_store, v_store, slots, torch.tensor([3, 2]), d**-0.5)
    assert torch.isfinite(got).all()
    for b, n in enumerate((3, 2)):
        k = k_store[slots[b, :n]].transpose(0, 1)[None]
        v = v_store[slots[b, :n]].transpose(0, 1)[None]
        want = causal_attention(q[b][None, :, None, :], k, v, d**-0.5)[0, :, 0]
        torch.testing.assert_close(got[b], want)


@pytest.mark.parametrize("static", [False, True], ids=["batched", "static"])
def test_engine_output_is_independent_of_what_the_cache_held_before(model, embedded, static):
    prompts = [embedded.random_ids(1, n, seed=n)[0].tolist() for n in (5, 20, 37)]
    params = SamplingParams(max_tokens=5)
    reference = Engine(model, EngineConfig(batched_decode=False)).generate(prompts, params)
    engine = Engine(model, EngineConfig(static_decode=static, block_size=16))
    engine.kv.k.fill_(float("nan"))  # what torch.empty may hand out
    engine.kv.v.fill_(float("nan"))
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]


def _rerun_capture(fn):
    """A CPU stand-in for a CUDA graph: replay re-runs the step into the captured output tensor."""
    out = fn()

    class Rerun:
        def replay(self):
            with torch.inference_mode():
                out.copy_(fn())

    return Rerun(), out


def test_graph_bookkeeping_replays_from_static_buffers(model, embedded):
    prompts = [embedded.random_ids(1, n, seed=n)[0].tolist() for n in (5, 9, 14, 30, 31)]
    params = SamplingParams(max_tokens=6)
    reference = Engine(model, EngineConfig(static_decode=False)).generate(prompts, params)
    engine = Engine(model, EngineConfig(static_decode=True, max_num_seqs=4, max_model_len=64))
    runner = engine.decode_runner
    runner.use_cuda_graphs, runner.capture = True, _rerun_capture
    assert runner.capture_all() >= 0
    assert set(runner.graphs) == {(b, w) for b in (1, 2, 4) for w in (1, 2, 4)}
    assert engine.kv.pool.all_free()  # capturing wrote only the scratch block
    outs = engine.generate(prompts, params, arrival_steps=[0, 0, 1, 2, 3])
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert runner.replays == runner.steps > 0
