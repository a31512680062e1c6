"""Attention variants: every path equals SDPA (prefill and cached decode), and the real-model conversions."""

from __future__ import annotations

import pytest
import torch

from infer_lab.attention import (
    Attention,
    AttentionConfig,
    FlashTiling,
    MLAConfig,
    MultiHeadLatentAttention,
    convert_to_mqa,
    flash_attention,
    kv_rows_read,
    naive_attention,
    naive_attention_hbm_bytes,
    patched_attention,
    sdpa_attention,
    tiled_attention_hbm_bytes,
)

TOL = 1e-5


def _decode_outputs(layer, x, prefix: int, **kwargs):
    cache = layer.new_cache()
    outs = [layer(x[:, :prefix], cache, **kwargs)]
    outs += [layer(x[:, i : i + 1], cache, **kwargs) for i in range(prefix, x.shape[1])]
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("n_kv_heads,window", [(None, None), (2, None), (1, None), (4, 5), (1, 3)])
@pytest.mark.parametrize("backend", ["naive", "flash"])
def test_every_variant_equals_sdpa_prefill_and_cached_decode(n_kv_heads, window, backend):
    torch.manual_seed(0)
    layer = Attention(AttentionConfig(d_model=64, n_heads=4, n_kv_heads=n_kv_heads, window=window))
    x = torch.randn(2, 11, 64)
    reference = layer(x, backend="sdpa")  # full prefill through torch's SDPA
    torch.testing.assert_close(layer(x, backend=backend), reference, atol=TOL, rtol=0)
    decoded, cache = _decode_outputs(layer, x, prefix=7, backend=backend)
    torch.testing.assert_close(decoded, reference, atol=TOL, rtol=0)
    assert cache.tokens == (min(11, window) if window else 11)


def test_gqa_with_all_kv_heads_equals_mha():
    torch.manual_seed(1)
    mha = Attention(AttentionConfig(64, 4))
    gqa = Attention(AttentionConfig(64, 4, n_kv_heads=4))
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(1, 9, 64)
    assert mha.config.kind == "MHA" == gqa.config.kind
    torch.testing.assert_close(gqa(x), mha(x), atol=0, rtol=0)


def test_mqa_equals_gqa_with_one_group():
    torch.manual_seed(2)
    q, kv = torch.randn(1, 6, 8, 16), torch.randn(2, 1, 1, 8, 16)
    k, v = kv[0], kv[1]
    mqa = naive_attention(q, k, v)
    gqa_one_group = naive_attention(
        q, k.expand(1, 6, 8, 16), v.expand(1, 6, 8, 16)
    )  # 6 KV heads, all equal
    torch.testing.assert_close(mqa, gqa_one_group, atol=TOL, rtol=0)
    layer = Attention(AttentionConfig(64, 4, n_kv_heads=1))
    assert layer.config.kind == "MQA" and layer.k_proj.out_features == 16


def test_mla_absorbed_equals_naive_and_sdpa():
    torch.manual_seed(3)
    mla = MultiHeadLatentAttention(
        MLAConfig(
            d_model=64,
            n_heads=4,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=8,
        )
    )
    x = torch.randn(2, 10, 64)
    reference = mla(x, backend="sdpa")
    naive, _ = _decode_outputs(mla, x, prefix=6, decode="naive")
    absorbed, cache = _decode_outputs(mla, x, prefix=6, decode="absorbed")
    torch.testing.assert_close(naive, reference, atol=TOL, rtol=0)
    torch.testing.assert_close(absorbed, naive, atol=TOL, rtol=0)
    torch.testing.assert_close(mla(x, decode="absorbed"), reference, atol=TOL, rtol=0)
    # the cache holds one latent + one RoPE key per token, fp32
    assert cache.nbytes == 2 * 10 * (16 + 4) * 4


def test_mla_config_from_deepseek_v3():
    from infer_lab.catalog import load_model_config

    cfg = MLAConfig.from_hf_config(load_model_config("deepseek-v3"))
    assert cfg.cached_values_per_token == 576 and cfg.n_heads == 128


@pytest.mark.parametrize(
    "causal,window,q_len", [(False, None, 33), (True, None, 33), (True, 7, 33), (True, None, 1)]
)
def test_flash_equals_sdpa(causal, window, q_len):
    torch.manual_seed(4)
    q = torch.randn(2, 4, q_len, 16)
    k, v = torch.randn(2, 2, 33, 16), torch.randn(2, 2, 33, 16)
    torch.testing.assert_close(
        flash_attention(q, k, v, causal, window, block_q=8, block_k=5),
        sdpa_attention(q, k, v, causal, window),
        atol=TOL,
        rtol=0,
    )


def test_hbm_bytes_naive_grows_quadratically_tiled_does_not_write_scores():
    n, d = 16384, 128
    naive = naive_attention_hbm_bytes(n, d)
    tiled = tiled_attention_hbm_bytes(n, d, block_q=128)
    assert naive == (4 * n * d + 4 * n * n) * 2
    assert naive_attention_hbm_bytes(2 * n, d) > 3.9 * naive  # the N^2 term dominates
    assert tiled < naive / 1.9  # at d=128, block 128: K/V re-reads cost 2·N² vs the scores' 4·N²
    assert (
        tiled_attention_hbm_bytes(n, d, block_q=256) < tiled
    )  # bigger tiles (more SRAM), fewer re-reads
    with pytest.raises(ValueError):
        flash_attention(
            torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), block_q=0
        )


def test_tiled_bytes_follow_the_mask_and_the_cache_assumption():
    """Causal tiles skip the keys in their future; with every re-read in L2, K and V come from HBM once."""
    assert kv_rows_read(10, 4) == 10 * 3  # three query tiles, each reads all 10 keys
    assert kv_rows_read(10, 4, causal=True) == 4 + 8 + 10  # keys up to each tile's last query
    n, d = 4096, 128
    once = tiled_attention_hbm_bytes(n, d, kv_rereads_from_hbm=False)
    assert once == 4 * n * d * 2  # Q, K, V read once and O written once
    assert once < tiled_attention_hbm_bytes(n, d, causal=True) < tiled_attention_hbm_bytes(n, d)
    with pytest.raises(ValueError, match="cannot hold one row"):
        FlashTiling(sram_bytes=100, head_dim=128)


def test_bad_configs_are_clear():
    with pytest.raises(ValueError, match="multiple"):
        AttentionConfig(64, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="window"):
        AttentionConfig(64, 4, window=0)
    with pytest.raises(ValueError, match="backend"):
        Attention(AttentionConfig(64, 4), backend="cuda")


def test_variant_memory_comes_from_the_analysis_over_all_layers():
    from infer_lab.analysis.memory import kv_bytes_per_token
    from infer_lab.attention.kv_sizing import variant_memory_table

    rows = {(r.model, r.variant): r for r in variant_memory_table(context=4096)}
    assert (
        rows[("mistral-7b", "GQA-8")].kv_bytes_per_token
        == kv_bytes_per_token("mistral-7b")
        == 131072
    )
    assert rows[("mistral-7b", "MHA")].mha_over_variant == 1.0
    assert rows[("mistral-7b", "GQA-8")].mha_over_variant == 4.0
    assert rows[("mistral-7b", "MQA")].max_users > rows[("mistral-7b", "GQA-8")].max_users
    mla = rows[("deepseek-v3", "MLA")]
    assert mla.kv_bytes_per_token == kv_bytes_per_token("deepseek-v3")


def test_attention_uses_the_engines_one_rope():
    import infer_lab.attention.mla as mla
    import infer_lab.attention.reference as reference
    import infer_lab.attention.variants as variants
    from infer_lab.engine import layers

    assert variants.apply_rope is layers.apply_rope is mla.apply_rope
    assert variants.rope_cos_sin is layers.rope_cos_sin is mla.rope_cos_sin
    assert not hasattr(reference, "apply_rope") and not hasattr(reference, "rope_cos_sin")
    # RoPE keeps relative positions: q·k depends only on the distance between their positions
    torch.manual_seed(6)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    inv_freq = layers.rope_inverse_frequencies(16, 10000.0)

    def rotated_dot(pq: int, pk: int) -> float:
        cq, sq = layers.rope_cos_sin(torch.tensor([pq]), inv_freq, torch.float32)
        ck, sk = layers.rope_cos_sin(torch.tensor([pk]), inv_freq, torch.float32)
        return float((layers.apply_rope(q, cq, sq) * layers.apply_rope(k, ck, sk)).sum())

    assert rotated_dot(7, 3) == pytest.approx(rotated_dot(14, 10), abs=1e-5)


# ---------------------------------------------------------------------------------------------
# The real model


def test_patched_attention_without_changes_matches_the_model(embedded):
    ids = embedded.random_ids(1, 24)
    with torch.inference_mode():
        reference = embedded.model(ids).logits
        with patched_attention(embedded.model):
            patched = embedded.model(ids).logits
        with patched_attention(embedded.model, window=4):
            windowed = embedded.model(ids).logits
    torch.testing.assert_close(patched, reference, atol=1e-4, rtol=1e-4)
    assert (
        float((windowed - reference).abs().max()) > 1e-2
    )  # a 4-token window really changes the output
    assert embedded.model.config._attn_implementation == "sdpa"


def test_mqa_conversion_shrinks_kv_and_costs_quality(embedded):
    from transformers import DynamicCache

    from infer_lab.evaluation import eval_token_ids, perplexity
    from infer_lab.harness import cache_tensor_bytes

    mqa = convert_to_mqa(embedded.model)
    assert embedded.model.config.num_key_value_heads == 3 and mqa.config.num_key_value_heads == 1
    ids = eval_token_ids(embedded.tokenizer, 96)
    caches = []
    for model in (embedded.model, mqa):
        cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(ids[None, :8], cache=cache, use_cache=True)
        caches.append(cache_tensor_bytes(cache))
    assert caches[0] == 3 * caches[1] == 3 * 8 * 30 * 2 * 64 * 4  # 8 tokens, 30 layers, K+V, fp32
    base = perplexity(embedded.model, ids, window=96).perplexity
    pooled = perplexity(mqa, ids, window=96).perplexity
    assert pooled > base * 1.05, (base, pooled)  # mean-pooling without uptraining is not free
    with pytest.raises(ValueError, match="cannot pool"):
        convert_to_mqa(embedded.model, n_kv_heads=2)


def _tiny_llama(kv_heads: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=8,
    )
    return LlamaForCausalLM(config).eval()


def test_mean_pooling_is_exact_when_the_pooled_heads_are_equal():
    model = _tiny_llama()
    ids = torch.randint(0, 64, (1, 10))
    for layer in model.model.layers:
        for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.weight.data[8:] = proj.weight.data[:8]  # KV head 1 := KV head 0
    with torch.inference_mode():
        reference = model(ids).logits
        same = convert_to_mqa(model, n_kv_heads=2)(ids).logits  # pooling 2 -> 2 changes nothing
        pooled = convert_to_mqa(model, n_kv_heads=1)(ids).logits
    torch.testing.assert_close(same, reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(pooled, reference, atol=1e-5, rtol=0)
    assert model.config.num_key_value_heads == 2  # the original is untouched


def test_attention_benchmarks_run_and_report_unavailable_backends():
    from infer_lab.bench.attention import decode_attention_vs_kv_heads, sdpa_backend_times

    rows = sdpa_backend_times([64], heads=2, head_dim=16, repeats=1)
    math_row = next(r for r in rows if r.backend == "math")
    assert math_row.available and math_row.time_s_p50 > 0
    assert math_row.score_matrix_bytes == 2 * 64 * 64 * 4
    assert all(r.available or r.reason for r in rows)
    decode = decode_attention_vs_kv_heads(
        256, n_heads=4, kv_heads=(1, 4), head_dim=16, bandwidth_Bps=1e10, repeats=1
    )
    assert [r.kv_bytes for r in decode] == [2 * 256 * 16 * 4, 2 * 4 * 256 * 16 * 4]
    assert all(r.predicted_s > 0 and r.measured_over_predicted > 0 for r in decode)
