"""The engine in bf16 against transformers in bf16, on the embedded model.

bf16 keeps 8 bits of mantissa, so any difference in the order of a sum can flip the last bit of
a result, and a greedy near-tie with it. What holds, and is asserted here:

* a whole prompt's forward (prefill) gives transformers' logits bit for bit, plain or prepacked;
* one user's decode, with attention called as transformers calls it, gives transformers' greedy
  tokens for all 20 prompts;
* the engine's own one-token attention in bf16 groups the query heads into rows (the faster call
  in bf16 on the course's CPU); SDPA rounds those rows differently, so there the tokens agree
  without being identical: most whole answers are. Every first token (a prefill) is identical too
  where this CPU's bf16 GEMM rounds a row the same whatever rows share the call (AVX-512-bf16 on
  the course's EPYC); with AMX tiles (the Xeon of the 2026-12-03 session) it does not, and the prompts that the
  served engine prefills together in one step only agree. The test asks the machine which it is.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import infer_lab.engine.model as engine_model
from infer_lab import fast_paths
from infer_lab.engine import AttentionMetadata, Engine, EngineConfig, EngineModel, SamplingParams
from infer_lab.engine.cpu import prepack
from infer_lab.engine.layers import span_decode_attention

from engine_helpers import NEW_TOKENS, assert_pool_clean, greedy_reference


@pytest.fixture(scope="module")
def bf16_lm():
    """The embedded model loaded in bf16, as ``load_model(dtype="bf16")`` gives it to a learner."""
    from infer_lab.models import load_model

    return load_model("smollm2-135m", device="cpu", dtype="bf16")


@pytest.fixture(scope="module")
def bf16_reference(bf16_lm, prompts):
    """transformers greedy ``generate`` in bf16 on the 20 prompts."""
    return greedy_reference(bf16_lm, prompts)


def _generate(engine: Engine, prompts: list[list[int]], max_tokens: int = NEW_TOKENS,
              ignore_eos: bool = False) -> list[list[int]]:
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))
    assert_pool_clean(engine)
    return [o.token_ids for o in outs]


def _bf16_models(embedded, bf16_lm, prepacked: bool) -> tuple[EngineModel, ...]:
    cast = EngineModel.from_hf(embedded.model).plain.cast(torch.bfloat16)
    loaded = EngineModel.from_hf(bf16_lm.model).plain
    assert loaded.dtype == cast.dtype == torch.bfloat16
    return (cast.prepacked(),) if prepacked else (cast, loaded)


@pytest.mark.parametrize("prepacked", [False, True], ids=["plain", "prepacked"])
def test_a_prompts_forward_in_bf16_is_transformers_bit_for_bit(embedded, bf16_lm, prompts, prepacked):
    """Plain F.linear everywhere; oneDNN's prepacked bf16 GEMM where this CPU runs it (else skipped,
    with the probe's reason: an AVX2-only CPU refuses it, and the engine then runs the plain path)."""
    if prepacked and (why := prepack.refusal("cpu", torch.bfloat16)) is not None:
        pytest.skip(why)
    models = _bf16_models(embedded, bf16_lm, prepacked)
    for p in prompts[::3]:
        n = len(p)
        meta = AttentionMetadata(query_lens=[n], context_lens=[n], sample_indices=list(range(n)))
        with torch.inference_mode():
            expected = bf16_lm.model(torch.tensor([p])).logits[0].float()
            for model in models:
                assert torch.equal(model.forward(torch.tensor(p), torch.arange(n), meta, None), expected)


@pytest.mark.parametrize("bf16_kernel", ["as this CPU has it", "refused"])
def test_one_users_decode_with_transformers_attention_call_is_token_identical(
    embedded, bf16_lm, prompts, bf16_reference, monkeypatch, bf16_kernel
):
    """Whatever GEMM path this CPU takes for bf16, and with oneDNN's bf16 GEMM refused as on an
    AVX2-only laptop (then plain F.linear on the bf16 weights, the fallback), the same tokens."""
    if bf16_kernel == "refused":
        monkeypatch.setattr(fast_paths, "_FORCED", {"prepack-bf16"})
    calls = []

    def transformers_call(*args, **kwargs):
        calls.append(1)
        return span_decode_attention(*args, **kwargs, grouped=False)

    monkeypatch.setattr(engine_model, "span_decode_attention", transformers_call)
    # the engine's bf16 option on the fp32 model (its weights cast are the bf16 load's: see above)
    engine = Engine.from_loaded(embedded, EngineConfig(max_num_seqs=1, dtype="bf16"))
    assert engine.model.dtype == torch.bfloat16
    assert (engine.gemm_plan.refused is not None) == (bf16_kernel == "refused" or not prepack.supported("cpu", torch.bfloat16))
    assert _generate(engine, prompts) == bf16_reference
    # the decode steps read their context in place, through that call
    assert len(calls) >= len(prompts) * engine.model.shape.layers * (NEW_TOKENS - 1) // 2


def _rows_round_alone(engine: Engine) -> bool:
    """Whether this machine's bf16 GEMM, as the engine calls it, gives a row the same bits alone as
    among other rows (then a prompt prefilled beside others is prefilled exactly as alone)."""
    from infer_lab.engine.cpu.prepack import linear

    w = engine.model.layers[0].gate_up_proj
    x = torch.randn(48, engine.model.shape.hidden, generator=torch.Generator().manual_seed(0)).bfloat16()
    return torch.equal(linear(x[:9], w), linear(x, w)[:9])


def test_the_engines_own_bf16_attention_agrees_with_transformers(bf16_lm, prompts, bf16_reference):
    engine = Engine.from_loaded(bf16_lm, EngineConfig())
    got = _generate(engine, prompts)  # batched, as served
    first = sum(g[0] == r[0] for g, r in zip(got, bf16_reference, strict=True))
    if _rows_round_alone(engine):
        assert first == len(prompts)  # a prefill: exact
    else:
        assert first >= 0.75 * len(prompts), f"{first} of {len(prompts)} first tokens identical"
    whole = sum(g == r for g, r in zip(got, bf16_reference, strict=True))
    assert whole >= 0.75 * len(prompts), f"{whole} of {len(prompts)} answers identical"


def test_the_two_attention_calls_differ_only_by_rounding():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, 64, generator=gen)
    k, v = torch.randn(200, 3, 64, generator=gen), torch.randn(200, 3, 64, generator=gen)
    grouped, transformers = (functools.partial(span_decode_attention, grouped=g) for g in (True, False))
    torch.testing.assert_close(grouped(q, k, v, 0.125), transformers(q, k, v, 0.125))
    q16, k16, v16 = q.bfloat16(), k.bfloat16(), v.bfloat16()
    torch.testing.assert_close(grouped(q16, k16, v16, 0.125), transformers(q16, k16, v16, 0.125))
    # and the default follows the dtype: transformers' call in fp32, grouped rows below it
    assert torch.equal(span_decode_attention(q, k, v, 0.125), transformers(q, k, v, 0.125))
    assert torch.equal(span_decode_attention(q16, k16, v16, 0.125), grouped(q16, k16, v16, 0.125))


def test_a_model_cast_after_loading_gets_its_projections_fused_again(embedded, prompts):
    """``model.to(dtype)`` replaces every weight with a copy: the stacked q|k|v and gate|up made at
    load must follow, or the engine would multiply by the old fp32 weights."""
    hf16 = copy.deepcopy(embedded.model).to(torch.bfloat16)
    model = EngineModel.from_hf(hf16)
    attn, mlp = hf16.model.layers[0].self_attn, hf16.model.layers[0].mlp
    assert {w.dtype for w in model.gemm_weights()} == {torch.bfloat16}
    assert torch.equal(model.layers[0].qkv_proj,
                       torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert attn.q_proj.weight.data_ptr() == model.layers[0].qkv_proj.data_ptr()  # views again
    assert mlp.up_proj.weight.data_ptr() == model.layers[0].gate_up_proj[mlp.gate_proj.out_features:].data_ptr()
    # the original is untouched, and an engine over the cast copy runs
    assert EngineModel.from_hf(embedded.model).layers[0].qkv_proj.dtype == torch.float32
    engine = Engine(model, EngineConfig(max_num_seqs=2))
    assert all(len(t) == 3 for t in _generate(engine, prompts[:2], 3, ignore_eos=True))

