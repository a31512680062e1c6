"""Chapter 07's exercises: the online-softmax update, GQA's head grouping, and MLA's ratio stated fairly."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from ...analysis.memory import kv_bytes_per_token
from ...attention.flash import flash_attention
from ...attention.kv_sizing import mla_ratio_explained
from ...attention.reference import expand_kv_heads, naive_attention, sdpa_attention
from ...engine import model as engine_model
from ...shape import model_shape
from . import Exercise, build
from .checking import Mistake, short_repr

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


def _no_acc_rescale(m, s, acc, scores, values):
    new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - new_m)
    return new_m, s * torch.exp(m - new_m) + p.sum(-1, keepdim=True), acc + p @ values


def _no_sum_rescale(m, s, acc, scores, values):
    new_m = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - new_m)
    return new_m, s + p.sum(-1, keepdim=True), acc * torch.exp(m - new_m) + p @ values


def _last_tile_only(m, s, acc, scores, values):
    new_m = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - new_m)
    return new_m, p.sum(-1, keepdim=True), p @ values


KNOWN_BUGS = {
    "output_acc was not rescaled by exp(old_max - new_max) when the max grew": _no_acc_rescale,
    "running_sum was not rescaled by exp(old_max - new_max) when the max grew": _no_sum_rescale,
    "only the last tile counts: the update must carry the running max, sum and accumulator forward":
        _last_tile_only,
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


# ---------------------------------------------------------------------------------------------
# Build it: your online-softmax update as the engine's attention, prefill and decode

TILE = 16  # keys per tile: prompts of about 30 tokens take 2-3 tiles


def _tiled_attend(update, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                  scale: float, broken: list[str], where: str) -> torch.Tensor:
    """softmax(q k^T * scale, masked to ``allowed``) v one key tile at a time through ``update``.

    ``q (..., n, d)``, ``k, v (..., ctx, d)``, ``allowed`` broadcastable to ``(..., n, ctx)``.
    """
    lead = q.shape[:-1]
    running_max = torch.full((*lead, 1), float("-inf"), dtype=q.dtype)
    running_sum = torch.zeros((*lead, 1), dtype=q.dtype)
    output_acc = torch.zeros((*lead, v.shape[-1]), dtype=q.dtype)
    for start in range(0, k.shape[-2], TILE):
        scores = (q @ k[..., start:start + TILE, :].transpose(-1, -2)) * scale
        scores = scores.masked_fill(~allowed[..., start:start + TILE], float("-inf"))
        out = update(running_max, running_sum, output_acc, scores, v[..., start:start + TILE, :])
        if not (isinstance(out, (tuple, list)) and len(out) == 3):
            raise TypeError(f"online_softmax_update must return (new_max, new_sum, new_acc), got {short_repr(out, 60)}")
        running_max, running_sum, output_acc = out
    result = output_acc / running_sum
    if not broken:
        ref = torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf")), dim=-1) @ v
        worst = float((result - ref).abs().max())
        if not worst <= ATOL:
            huge = float((q @ k.transpose(-1, -2) * scale).abs().max())
            broken.append(f"{where}: your tiled attention differs from softmax(QK^T)V by up to {worst:.3g} "
                          f"(scores up to {huge:.3g}, tiles of {TILE} keys): " + _update_hint(update))
    return result


def _update_hint(update) -> str:
    """Which part of the update is wrong, from the two-tile test of the implement exercise."""
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(3, 8, generator=g), torch.randn(40, 8, generator=g), torch.randn(40, 8, generator=g)
    k[30] *= 30  # a later tile raises the max: the earlier tiles must be rescaled
    try:
        got = _tiled(update, q, k, v, TILE)
    except Exception as exc:
        return f"the update fails on plain 2-D tiles ({type(exc).__name__}: {exc})"
    expected = flash_attention(q[None, None], k[None, None], v[None, None])[0, 0]
    one_tile = _tiled(update, q, k[:TILE], v[:TILE], TILE)
    if not isinstance(got, torch.Tensor) or not torch.allclose(got, expected, atol=ATOL):
        if isinstance(one_tile, torch.Tensor) and torch.allclose(
                one_tile, flash_attention(q[None, None], k[None, None, :TILE], v[None, None, :TILE])[0, 0], atol=ATOL):
            return ("one tile is right, several are not: when a tile raises the max, rescale the running sum AND "
                    "output_acc by exp(old max - new max)")
        return "even one tile is wrong: probs = exp(scores - new max), sum them into running_sum, probs @ values"
    scores_masked = (q @ k[:2 * TILE].T) / math.sqrt(q.shape[-1])
    scores_masked[:, TILE:] = float("-inf")  # a tile the causal mask hides completely
    state = (torch.full((3, 1), float("-inf")), torch.zeros(3, 1), torch.zeros(3, 8))
    for start in (0, TILE):
        state = update(*state, scores_masked[:, start:start + TILE], v[start:start + TILE])
    if not bool(torch.isfinite(state[2] / state[1]).all()):
        return ("a tile whose scores are all -inf (hidden by the causal mask) gives NaN: the new max must be "
                "max(running max, tile max), never the tile's max alone")
    return ("right on 2-D tiles, wrong with leading (batch, head) dimensions: reduce over the last dimension "
            "(dim=-1, keepdim=True) and multiply with @, which broadcasts")


def engine_attention(update: Any, broken: list[str]) -> tuple[Any, Any]:
    """The engine's two attention functions (prefill, batched decode) as tiles of keys through ``update``
    (the learner's online_softmax_update); the first violation found goes to ``broken``."""

    def causal_attention(q, k, v, scale):
        n, ctx = q.shape[2], k.shape[2]
        allowed = torch.arange(ctx)[None, :] <= torch.arange(n)[:, None] + (ctx - n)
        heads = q.shape[1]
        k, v = expand_kv_heads(k, heads), expand_kv_heads(v, heads)
        return _tiled_attend(update, q, k, v, allowed, scale, broken, f"prefill attention over {ctx} keys")

    def grouped_decode_attention(q, k, v, visible, scale):
        heads = q.shape[1]
        k, v = expand_kv_heads(k.transpose(1, 2), heads), expand_kv_heads(v.transpose(1, 2), heads)
        out = _tiled_attend(update, q[:, :, None, :], k, v, visible[:, None, None, :], scale, broken,
                            f"decode attention of {q.shape[0]} sequences over up to {k.shape[2]} keys")
        return out[:, :, 0, :]

    return causal_attention, grouped_decode_attention


def _swap_attention(update: Any, broken: list[str]) -> Callable[[], None]:
    """Put :func:`engine_attention` in the engine module (every engine in this process uses it); returns
    the function that puts the library's back."""
    saved = engine_model.causal_attention, engine_model.grouped_decode_attention
    engine_model.causal_attention, engine_model.grouped_decode_attention = engine_attention(update, broken)

    def undo() -> None:
        engine_model.causal_attention, engine_model.grouped_decode_attention = saved

    return undo


def install_flash(engine: Any, fns: Any) -> Callable[[], None]:
    """The capstone: the engine's attention through your online_softmax_update() (for the whole process;
    call what it returns to undo)."""
    return _swap_attention(fns.online_softmax_update, [])


def check_flash_engine(fns, r) -> None:
    r.call(fns.online_softmax_update, torch.full((1, 1), float("-inf")), torch.zeros(1, 1), torch.zeros(1, 2),
           torch.zeros(1, 1), torch.zeros(1, 2), case="setup")
    broken: list[str] = []
    undo = _swap_attention(fns.online_softmax_update, broken)
    try:
        run = build.run_engine(build.engine_config(), build.chat_prompts()[:2])
    finally:
        undo()
    case = (f"the engine's attention (prefill and batched decode) as tiles of {TILE} keys through your "
            "online_softmax_update(): 2 chat prompts, 8 greedy tokens each")
    build.compare(r, case, run, build.reference(build.chat_prompts())[:2], hint=broken[0] if broken else "")
    r.record(f"every attention call within {ATOL:g} of softmax(QK^T)V", not broken,
             broken[0] if broken else "held in every layer and step")


EXERCISES.append(
    Exercise("flash_engine", "FlashAttention's tile loop inside the engine", "build",
             "Your online_softmax_update() runs the engine's attention, prefill and decode, one tile of keys at a "
             "time; checked by generating on the embedded model, token for token against transformers.",
             check_flash_engine, functions=("online_softmax_update",),
             symbol="src/infer_lab/engine/model.py::causal_attention, grouped_decode_attention",
             timeout_s=build.BUILD_TIMEOUT_S, install=install_flash))
