"""Chapter 07's exercises: the online-softmax update, GQA's head grouping, and MLA's ratio stated fairly."""

from __future__ import annotations

import dataclasses
import math

import torch

from ...analysis.memory import kv_bytes_per_token
from ...attention.flash import flash_attention
from ...attention.kv_sizing import mla_ratio_explained
from ...attention.reference import expand_kv_heads, naive_attention, sdpa_attention
from ...shape import model_shape
from . import Exercise
from .checking import Mistake

NUMBER = "07"
SLUG = "attention_variants"
TITLE = "07 · Attention variants and FlashAttention"

ATOL = 1e-5  # fp32, as the chapter's equivalence checks


def _tiled(update, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int, r=None, case: str = ""):
    """Attention of ``q`` (n_q, d) over ``k``, ``v`` (n_k, d) one key tile at a time, through ``update``."""
    scale = 1 / math.sqrt(q.shape[-1])
    running_max = torch.full((q.shape[0], 1), float("-inf"))
    running_sum = torch.zeros(q.shape[0], 1)
    output_acc = torch.zeros(q.shape[0], v.shape[-1])
    for start in range(0, k.shape[0], block):
        scores = (q @ k[start:start + block].T) * scale
        args = (running_max, running_sum, output_acc, scores, v[start:start + block])
        running_max, running_sum, output_acc = r.call(update, *args, case=case) if r else update(*args)
    return output_acc / running_sum


def no_acc_rescale(m, s, acc, scores, values):
    new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - new_m)
    return new_m, s * torch.exp(m - new_m) + p.sum(-1, keepdim=True), acc + p @ values


def no_sum_rescale(m, s, acc, scores, values):
    new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - new_m)
    return new_m, s + p.sum(-1, keepdim=True), acc * torch.exp(m - new_m) + p @ values


def last_tile_only(m, s, acc, scores, values):
    new_m = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - new_m)
    return new_m, p.sum(-1, keepdim=True), p @ values


KNOWN_BUGS = {
    "output_acc was not rescaled by exp(old_max - new_max) when the max grew": no_acc_rescale,
    "running_sum was not rescaled by exp(old_max - new_max) when the max grew": no_sum_rescale,
    "only the last tile counts: the update must carry the running max, sum and accumulator forward":
        last_tile_only,
}

SOFTMAX_CASES = (("one tile of 64 keys", 64, 1.0), ("tiles of 16", 16, 1.0), ("tiles of 7 (a short last one)", 7, 1.0),
                 ("tiles of 1 key", 1, 1.0), ("tiles of 16, scores in the hundreds (exp overflows fp32)", 16, 100.0))


def check_online_softmax(fns, r) -> None:
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(5, 32, generator=g), torch.randn(64, 32, generator=g), torch.randn(64, 32, generator=g)
    for name, block, gain in SOFTMAX_CASES:
        qs = q * gain
        case = f"5 queries, 64 keys, head dim 32, {name}"
        got = _tiled(fns.online_softmax_update, qs, k, v, block, r, case)
        expected = naive_attention(qs[None, None], k[None, None], v[None, None], causal=False)[0, 0]
        library = flash_attention(qs[None, None], k[None, None], v[None, None], block_q=5, block_k=block)[0, 0]
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            r.record(case, False, f"the update must return (running_max, running_sum, output_acc) shaped like "
                                  f"its inputs; the result came out as {getattr(got, 'shape', type(got).__name__)}")
            continue
        diff = (got - expected).abs()
        worst = float(diff.nan_to_num(float("inf")).max())
        if worst <= ATOL:
            r.record(case, True, f"max |difference| from softmax(QK^T)V {worst:.1e} "
                                 f"(the library's tiled attention: {float((library - expected).abs().max()):.1e})")
            continue
        if bool(torch.isnan(got).any() | torch.isinf(got).any()):
            why = "NaN or inf: subtract the running max before exp() so large scores cannot overflow"
        else:
            why = next((text for text, bug in KNOWN_BUGS.items()
                        if torch.allclose(got, _tiled(bug, qs, k, v, block), atol=ATOL)), "")
        row, col = divmod(int(diff.nan_to_num(float("inf")).argmax()), diff.shape[1])
        r.record(case, False, f"max |difference| from softmax(QK^T)V is {worst:.3g} (allowed {ATOL:g}), at "
                              f"query {row}, value dim {col}: expected {expected[row, col].item():.5g}, got "
                              f"{got[row, col].item():.5g}" + (f"; {why}" if why else ""))


GQA_CASES = ((8, 2), (9, 3), (4, 4), (8, 1))


def check_expand_kv_heads(fns, r) -> None:
    g = torch.Generator().manual_seed(60)
    for heads, kv_heads in GQA_CASES:
        kind = "MHA" if heads == kv_heads else ("MQA" if kv_heads == 1 else "GQA")
        case = f"{heads} query heads over {kv_heads} KV heads ({kind})"
        q = torch.randn(2, heads, 6, 16, generator=g)
        k, v = torch.randn(2, kv_heads, 6, 16, generator=g), torch.randn(2, kv_heads, 6, 16, generator=g)
        got_k = r.call(fns.expand_kv_heads, k, heads, case=case)
        got_v = r.call(fns.expand_kv_heads, v, heads, case=case)
        expected = expand_kv_heads(k, heads)
        if not isinstance(got_k, torch.Tensor) or got_k.shape != expected.shape:
            r.record(case, False, f"expected shape {tuple(expected.shape)}, got "
                                  f"{tuple(getattr(got_k, 'shape', ())) or type(got_k).__name__}")
            continue
        if torch.equal(got_k, expected):
            out = naive_attention(q, got_k, got_v, causal=True)
            worst = float((out - sdpa_attention(q, k, v, causal=True)).abs().max())
            r.record(case, worst <= ATOL, f"attention with your K/V equals SDPA's grouped-query attention "
                                          f"(max |difference| {worst:.1e})")
            continue
        group = heads // kv_heads
        wrong = next((h for h in range(heads) if not torch.equal(got_k[:, h], k[:, h // group])), 0)
        detail = f"query head {wrong} should see KV head {wrong // group} (heads {(wrong // group) * group}.." \
                 f"{(wrong // group + 1) * group - 1} share it)"
        if torch.equal(got_k, k.repeat(1, group, 1, 1)):
            detail += "; your heads cycle 0, 1, .., 0, 1: repeat_interleave, not repeat"
        r.record(case, False, detail)


def _ratio_cases():
    ratios = mla_ratio_explained()
    same, real, per_layer = ratios["same_shape_k128"], ratios["same_shape_k192"], ratios["7b_layer"]
    yield "DeepSeek-V3 vs an MHA of its own shape (128 heads, K and V 128), 61 layers each", \
        (128, same.k_head_dim, same.v_head_dim, 61, 512, 64, 61), same.ratio
    yield "the same with DeepSeek's real K head of 192 (128 + 64 RoPE)", \
        (128, real.k_head_dim, real.v_head_dim, 61, 512, 64, 61), real.ratio
    yield "one Mistral-7B MHA layer (32 heads of 128) vs one MLA layer", \
        (32, per_layer.k_head_dim, per_layer.v_head_dim, 1, 512, 64, 1), per_layer.ratio
    # Unequal depths: Mistral-7B's 32 layers as MHA (its 32 query heads each with a K and a V) against
    # DeepSeek-V3's 61 MLA layers, from the memory equation's bytes per token (bf16 on both sides).
    mistral, v3 = model_shape("mistral-7b"), model_shape("deepseek-v3")
    mha = dataclasses.replace(mistral, kv_heads=mistral.heads)
    yield (f"Mistral-7B as MHA ({mha.layers} layers, {mha.heads} heads of {mha.head_dim}) vs DeepSeek-V3's "
           f"{v3.layers} MLA layers"), \
        (mha.heads, mha.head_dim, mha.head_dim, mha.layers, v3.mla.kv_lora_rank, v3.mla.qk_rope_head_dim,
         v3.layers), kv_bytes_per_token(mha) / kv_bytes_per_token(v3)


def check_mla_ratio(fns, r) -> None:
    for case, args, expected in _ratio_cases():
        got = r.call(fns.mha_over_mla, *args, case=case)
        mha_layers, mla_layers = args[3], args[-1]
        mistakes = [Mistake(0.5, "half of it: MHA caches a K AND a V per head")]
        if mla_layers > 1:
            mistakes.append(Mistake(mla_layers, f"{mla_layers}x too large: that is all of MHA's layers against ONE "
                                                "MLA layer (the one-layer mistake): count MLA's layers too"))
        if mha_layers > 1:
            mistakes.append(Mistake(1 / mha_layers, f"{mha_layers}x too small: ONE MHA layer against all of MLA's "
                                                   "layers: count MHA's layers too"))
        if mha_layers != mla_layers:
            mistakes.append(Mistake(mla_layers / mha_layers, "the per-layer ratio: the two models have different "
                                    f"depths ({mha_layers} vs {mla_layers} layers), so multiply each side by its "
                                    "own layer count"))
        r.close(case, got, expected, rel_tol=1e-9, mistakes=mistakes)


EXERCISES = [
    Exercise("online_softmax_update", "The online-softmax update", "implement",
             "Write the update that folds one tile of keys into a running max, sum and output; checked "
             "against softmax(QK^T)V and the library's tiled attention, huge scores included.",
             check_online_softmax),
    Exercise("expand_kv_heads", "Grouped-query attention's head grouping", "implement",
             "Expand KV heads to serve their groups of query heads; checked against the reference and by "
             "running attention against SDPA's GQA.", check_expand_kv_heads),
    Exercise("mha_over_mla", "MLA's ratio, stated fairly", "predict",
             "Predict how many times less MLA caches than an MHA; checked against the library's ratios "
             "(57x, 71x, the per-layer 14x).", check_mla_ratio),
]
