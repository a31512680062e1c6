"""Stage 1's check: the forward pass, from its pieces to greedy decoding, then inside the engine.

1. The guided pieces against the library's on hidden shapes: ``rms_norm`` (widths and epsilons
   of both models and more), ``apply_rope`` (pairs ``(i, i + d/2)``, positions in any order,
   three RoPE bases), ``attention`` (grouped-query heads 6/2, 9/3, 8/1, 4/4; full prefill, a
   chunk that is the last ``n`` of a longer context, one decode query).
2. ``forward`` alone, through an ``attend`` of the check's own, against transformers' logits:
   the embedded SmolLM2 and the hidden model (q/k/v bias, an LM head that is not the embedding,
   6 heads over 2 KV heads of 16), over calls that mix a prefill, one decode token and a chunk
   starting mid-sequence, two requests in one flat batch, and ``rows`` that pick some rows only.
3. ``generate``: transformers' greedy tokens on a chat prompt and on the hidden model, with a
   KV cache (each position goes through ``forward`` once).
4. Inside the real engine (paged KV, the library's store): the embedded model's chat prompts, and
   the hidden model with chunked prefill (a chunk's queries are the last ``n`` of its context),
   every token compared with transformers.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import torch

from ...engine import SamplingParams
from ...engine.layers import (
    apply_rope,
    causal_attention,
    rms_norm,
    rope_cos_sin,
    rope_inverse_frequencies,
)
from ...engine.model import EngineModel, forward_tokens
from . import Stage, StageContext
from . import harness as h
from .boundary import BadResult, LearnerCodeError, as_int_list, describe

QUESTIONS = ("What is the capital of France?", "Give me three prime numbers.", "hi")
GENERATE_QUESTION = "Write a haiku about the sea."
SIZES_HINT = ("the hidden model has 6 query heads over 2 KV heads of head_dim 16, a hidden size of 96 and a q/k/v "
              "bias: read every size from model.shape (heads, kv_heads, head_dim), none from SmolLM2")


# ---------------------------------------------------------------------------------------------
# Taking results


def _tensor(result: Any) -> torch.Tensor:
    if isinstance(result, torch.Tensor):
        return result
    if hasattr(result, "__array__"):  # numpy
        return torch.as_tensor(result.__array__())
    raise BadResult("expected a tensor")


def _like(ref_arg: int, shape_of: Callable[[tuple], tuple] | None = None) -> Callable[..., torch.Tensor]:
    """A tensor (or numpy array) shaped like the ``ref_arg``-th argument (or ``shape_of(args)``), in its dtype."""

    def adapt(result: Any, args: tuple, kwargs: dict) -> torch.Tensor:
        ref = args[ref_arg]
        out = _tensor(result)
        want = tuple(shape_of(args)) if shape_of is not None else tuple(ref.shape)
        if tuple(out.shape) != want:
            raise BadResult(f"expected shape {want}, got {tuple(out.shape)}")
        return out.to(dtype=ref.dtype, device=ref.device)

    return adapt


def _as_logits(result: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """fp32 logits ``(len(rows), vocab)`` from any float tensor (or numpy array) of that shape."""
    model = kwargs.get("model", args[0] if args else None)
    rows = kwargs.get("rows", args[4] if len(args) > 4 else None)
    out = _tensor(result)
    want = (len(rows), model.shape.vocab)
    if tuple(out.shape) != want:
        raise BadResult(f"expected logits of shape {want} (one row per entry of rows, one column per token id of "
                        f"the vocabulary), got {tuple(out.shape)}")
    if not out.is_floating_point():
        raise BadResult(f"expected float logits, got {out.dtype}")
    return out.float()


# ---------------------------------------------------------------------------------------------
# Comparing tensors


def _worst(got: torch.Tensor, want: torch.Tensor) -> tuple[float, tuple[int, ...]]:
    """The largest |got - want| (inf where either is NaN/inf) and where it is."""
    diff = (got.double() - want.double()).abs().nan_to_num(float("inf"), float("inf"), float("inf"))
    i = int(diff.argmax())
    return float(diff.flatten()[i]), tuple(int(x) for x in torch.unravel_index(torch.tensor(i), diff.shape))


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    return _worst(got, want)[0] <= tol


def _matches(got: torch.Tensor, alternatives: dict[str, Callable[[], torch.Tensor]], tol: float) -> str:
    """The hint of the first known mistake whose result equals ``got``."""
    for hint, make in alternatives.items():
        try:
            if _close(got, make(), tol):
                return hint
        except (RuntimeError, ValueError, IndexError):
            continue
    return ""


def _compare(ctx: StageContext, case: str, got: torch.Tensor, want: torch.Tensor, tol: float, what: str,
             alternatives: dict[str, Callable[[], torch.Tensor]]) -> bool:
    worst, at = _worst(got, want)
    if worst <= tol:
        return True
    hint = _matches(got, alternatives, tol)
    if not bool(torch.isfinite(got).all()):
        hint = hint or "the result holds NaN or inf"
    ctx.report.record(case, False, f"max |difference| from the library's {what} is {worst:.3g} (allowed {tol:.1g}) at "
                                   f"index {at}: expected {float(want[at]):.6g}, got {float(got[at]):.6g}"
                      + (f"\n    hint: {hint}" if hint else ""))
    return False


# ---------------------------------------------------------------------------------------------
# 1. The guided pieces


def _rms_norm_mistakes(x: torch.Tensor, weight: torch.Tensor, eps: float) -> dict[str, Callable[[], torch.Tensor]]:
    return {
        "the weight is missing: multiply the normalized x by weight": lambda: rms_norm(x, torch.ones_like(weight), eps),
        "eps goes inside the square root: x / sqrt(mean(x^2) + eps)":
            lambda: weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps),
        "the mean is over each token's own values (the last dimension, keepdim=True), not the whole tensor":
            lambda: weight * x * torch.rsqrt(x.pow(2).mean() + eps),
        "RMSNorm does not subtract the mean (that is LayerNorm): divide by the root of mean(x^2)":
            lambda: weight * (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps),
    }


def check_rms_norm(ctx: StageContext) -> bool:
    rng = ctx.rng("rms")
    g = torch.Generator().manual_seed(ctx.subseed("rms"))
    cases = [(96, 1e-6), (576, 1e-5), (rng.randint(8, 200), 0.1), (rng.choice((64, 160, 256)), rng.choice((1e-6, 0.5)))]
    for width, eps in cases:
        tokens = rng.randint(1, 7)
        x = torch.randn(tokens, width, generator=g) * rng.choice((0.05, 1.0, 3.0))
        weight = 1 + 0.3 * torch.randn(width, generator=g)
        case = f"rms_norm(x {tokens}x{width}, weight ({width},), eps={eps:g})"
        got = ctx.call("rms_norm", x, weight, eps, case=case)
        want = rms_norm(x, weight, eps)
        tol = 1e-4 * (1 + float(want.abs().max()))
        if not _compare(ctx, case, got, want, tol, "rms_norm", _rms_norm_mistakes(x, weight, eps)):
            return False
    ctx.report.record(f"rms_norm on {len(cases)} hidden shapes", True, "widths " + ", ".join(str(w) for w, _ in cases))
    return True


def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    angles = positions[:, None].float() * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _library_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)
    return apply_rope(x, cos[:, None, :], sin[:, None, :])


def _rope_mistakes(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor
                   ) -> dict[str, Callable[[], torch.Tensor]]:
    return {
        "that rotates pairs (0, 1), (2, 3), ... (interleaved); transformers' Llama rotates pair (i, i + d/2): "
        "x1 = x[..., :d/2], x2 = x[..., d/2:], out = (x1 cos - x2 sin, x2 cos + x1 sin), angles repeated twice":
            lambda: _rope_interleaved(x, positions, inv_freq),
        "the positions are ignored (0, 1, 2, ... were used): each token turns by ITS position times inv_freq":
            lambda: _library_rope(x, torch.arange(len(positions)), inv_freq),
        "the rotation goes the wrong way: rotate_half(x) is (-x2, x1), and out = x cos + rotate_half(x) sin":
            lambda: _library_rope(x, -positions, inv_freq),
    }


def check_apply_rope(ctx: StageContext) -> bool:
    rng = ctx.rng("rope")
    g = torch.Generator().manual_seed(ctx.subseed("rope"))
    cases = [(6, 16, 5000.0), (9, 64, 10000.0), (rng.choice((2, 4)), rng.choice((8, 32)), 100000.0)]
    for heads, d, theta in cases:
        tokens = rng.randint(2, 6)
        positions = torch.tensor(rng.sample(range(300), tokens))  # in no order, far from 0
        x = torch.randn(tokens, heads, d, generator=g)
        inv_freq = rope_inverse_frequencies(d, theta)
        case = f"apply_rope(x {tokens}x{heads}x{d}, positions {positions.tolist()}, inv_freq of base {theta:g})"
        got = ctx.call("apply_rope", x, positions, inv_freq, case=case)
        want = _library_rope(x, positions, inv_freq)
        tol = 2e-4 * (1 + float(x.abs().max()))
        if not _compare(ctx, case, got, want, tol, "RoPE", _rope_mistakes(x, positions, inv_freq)):
            return False
    ctx.report.record(f"apply_rope on {len(cases)} hidden shapes", True, "head dims " + ", ".join(str(d) for _, d, _ in cases)
                      + ", positions up to 300")
    return True


def _library_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, offset: bool = True,
                       interleave: bool = True) -> torch.Tensor:
    n, heads, _ = q.shape
    ctx_len, kv_heads, _ = k.shape
    if not interleave:
        k, v = k.repeat(1, heads // kv_heads, 1), v.repeat(1, heads // kv_heads, 1)
    if offset:
        return causal_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                scale)[0].transpose(0, 1)
    k, v = k.repeat_interleave(heads // k.shape[1], dim=1), v.repeat_interleave(heads // v.shape[1], dim=1)
    scores = torch.einsum("nhd,chd->hnc", q, k) * scale
    future = torch.arange(ctx_len)[None, :] > torch.arange(n)[:, None]  # no offset: query i sees keys 0..i
    return torch.einsum("hnc,chd->nhd", scores.masked_fill(future, float("-inf")).softmax(-1), v)


def _plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return torch.einsum("hnc,chd->nhd", (torch.einsum("nhd,chd->hnc", q, k) * scale).softmax(-1), v)


def _attention_mistakes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
                        ) -> dict[str, Callable[[], torch.Tensor]]:
    n, heads, length, kv_heads = q.shape[0], q.shape[1], k.shape[0], k.shape[1]
    mistakes = {}
    if 1 < kv_heads < heads:
        mistakes[f"query head h reads KV head h // {heads // kv_heads} (consecutive heads share one): "
                 "repeat_interleave, not repeat"] = lambda: _library_attention(q, k, v, scale, interleave=False)
    if n < length:
        mistakes[f"the {n} queries are the LAST {n} positions of the context of {length}: query i sees keys "
                 f"0 .. {length - n} + i, not 0 .. i"] = lambda: _library_attention(q, k, v, scale, offset=False)
    if n > 1:
        mistakes["no causal mask: query i must not see the keys after its own position"] = \
            lambda: _plain_attention(q, k, v, scale)
    mistakes["multiply the scores q.k by scale (head_dim ** -0.5) before the softmax"] = \
        lambda: _library_attention(q, k, v, 1.0)
    return mistakes


def check_attention(ctx: StageContext) -> bool:
    rng = ctx.rng("attention")
    g = torch.Generator().manual_seed(ctx.subseed("attention"))
    ctx_len = rng.randint(9, 17)
    cases = [(ctx_len, ctx_len, 6, 2, 16, "a whole prompt"), (rng.randint(2, 5), ctx_len, 6, 2, 16, "a chunk: the last "
             "n positions of the context"), (1, ctx_len, 9, 3, 64, "one decoding token"),
             (4, 7, 8, 1, 8, "a chunk, one KV head (MQA)"), (5, 5, 4, 4, 16, "a whole prompt, as many KV heads as heads")]
    for n, length, heads, kv_heads, d, what in cases:
        q = torch.randn(n, heads, d, generator=g)
        k, v = torch.randn(length, kv_heads, d, generator=g), torch.randn(length, kv_heads, d, generator=g)
        scale = d**-0.5
        case = (f"attention(q {n}x{heads}x{d}, k, v {length}x{kv_heads}x{d}, scale={scale:.3g}): {what}, "
                f"{heads} heads over {kv_heads} KV heads")
        got = ctx.call("attention", q, k, v, scale, case=case)
        want = _library_attention(q, k, v, scale)
        if not _compare(ctx, case, got, want, 1e-4, "attention", _attention_mistakes(q, k, v, scale)):
            return False
    ctx.report.record(f"attention on {len(cases)} hidden shapes", True, "GQA 6/2 and 9/3, MQA, MHA; whole prompts, "
                      "chunks that end a longer context, one decoding token")
    return True


# ---------------------------------------------------------------------------------------------
# 2. forward alone, against transformers


class _CheckAttend:
    """The check's own ``attend``: each request's K/V kept in the model's dtype, attention by the library.

    ``spans`` for the next call: ``(request, n)`` per piece of the flat batch, in order.
    """

    def __init__(self, model: EngineModel):
        self.model = model
        self.kv: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.spans: list[tuple[int, int]] = []
        self.calls = 0

    def __call__(self, layer: int, q: Any, k: Any, v: Any) -> torch.Tensor:
        s, total = self.model.shape, sum(n for _, n in self.spans)
        want_q, want_kv = (total, s.heads, s.head_dim), (total, s.kv_heads, s.head_dim)
        shapes = [tuple(getattr(t, "shape", ())) for t in (q, k, v)]
        if shapes != [want_q, want_kv, want_kv]:
            raise ValueError(f"attend(layer, q, k, v) takes q of shape (tokens, heads, head_dim) = {want_q} and k, v "
                             f"of (tokens, kv_heads, head_dim) = {want_kv}; it was given q {shapes[0]}, k {shapes[1]}, "
                             f"v {shapes[2]}")
        if not isinstance(layer, int) or not 0 <= layer < s.layers:
            raise ValueError(f"attend's first argument is the layer index 0 .. {s.layers - 1}, got {layer!r}")
        self.calls += 1
        dtype = self.model.dtype
        out = torch.empty_like(q)
        first = 0
        for request, n in self.spans:
            key = (request, layer)
            k_new, v_new = k[first: first + n].to(dtype), v[first: first + n].to(dtype)
            if key in self.kv:
                k_new, v_new = torch.cat((self.kv[key][0], k_new)), torch.cat((self.kv[key][1], v_new))
            self.kv[key] = (k_new, v_new)
            qi = q[first: first + n].to(dtype)
            out[first: first + n] = _library_attention(qi, k_new, v_new, self.model.scale).to(q.dtype)
            first += n
        return out


def _hf_logits(model: h.CheckModel, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model.lm.model(torch.tensor([ids])).logits[0].float()


def _plan(rng: random.Random, lengths: list[int]) -> list[list[tuple[int, int, int]]]:
    """Calls of (request, start, stop) pieces: a prefill, one decode token, a chunk mid-sequence, the rest."""
    cuts = []
    for length in lengths:
        a = rng.randint(4, length - 8)
        b = rng.randint(a + 3, length - 2)
        cuts.append([(0, a), (a, a + 1), (a + 1, b), (b, length)])
    return [[(r, *cuts[r][c]) for r in range(len(lengths))] for c in range(4)]


def _forward_alternatives(em: EngineModel, plan: list[list[tuple[int, int, int]]], ids: list[list[int]],
                          rows: list[list[int]], call: int) -> dict[str, Callable[[], torch.Tensor]]:
    """Known mistakes, as the library's forward pass on a changed model, up to ``call``."""

    def through(model: EngineModel, restart: bool = False) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            attend = _CheckAttend(model)
            out = None
            for c in range(call + 1):
                attend.spans = [(r, b - a) for r, a, b in plan[c]]
                tokens = torch.tensor([t for r, a, b in plan[c] for t in ids[r][a:b]])
                positions = torch.tensor([p - (a if restart else 0) for r, a, b in plan[c] for p in range(a, b)])
                out = forward_tokens(model, tokens, positions, attend, rows[c])
            return out

        return run

    alternatives = {}
    if em.layers[0].qkv_bias is not None:
        alternatives["the q/k/v bias is never added: layer.qkv_bias (q|k|v stacked like qkv_proj) is not None in "
                     "this model; add it after the projection"] = \
            through(EngineModel(em.shape, em.embed, [dataclasses.replace(w, qkv_bias=None) for w in em.layers],
                                em.final_norm, em.lm_head, em.inv_freq))
    alternatives["the LM head is the embedding here; this model's is not (its embeddings are untied): multiply by "
                 "model.lm_head"] = through(EngineModel(em.shape, em.embed, em.layers, em.final_norm, em.embed,
                                                        em.inv_freq))
    alternatives["RoPE turned each call's tokens by 0, 1, 2, ...: use the positions argument (a decoding token sits "
                 "at position len(context) - 1, a later chunk starts where the earlier one ended)"] = \
        through(em, restart=True)
    return alternatives


def check_forward(ctx: StageContext, model: h.CheckModel, requests: int) -> bool:
    rng = ctx.rng(f"forward:{model.lm.name}")
    em = EngineModel.from_hf(model.lm.model)
    lengths = [rng.randint(16, 26) for _ in range(requests)]
    ids = [h.random_prompt(rng, model.vocab, n) for n in lengths]
    refs = [_hf_logits(model, x) for x in ids]
    plan = _plan(rng, lengths)
    attend = _CheckAttend(em)
    label = "the embedded SmolLM2" if model.lm.source == "embedded" else "the hidden model"
    all_rows: list[list[int]] = []
    total_rows = 0
    for c, pieces in enumerate(plan):
        n = sum(b - a for _, a, b in pieces)
        where = [(r, p) for r, a, b in pieces for p in range(a, b)]
        rows = list(range(n)) if c % 2 == 0 else sorted(rng.sample(range(n), max(1, n // 2)))
        all_rows.append(rows)
        attend.spans = [(r, b - a) for r, a, b in pieces]
        tokens = torch.tensor([t for r, a, b in pieces for t in ids[r][a:b]])
        positions = torch.tensor([p for _, p in where])
        text = "; ".join(f"request {r} positions {a}..{b - 1}" for r, a, b in pieces)
        case = f"forward on {label}, call {c + 1} of {len(plan)} ({text}; rows {describe(rows)})"
        try:
            got = ctx.fn("forward")(em, tokens, positions, attend, rows)
        except LearnerCodeError as exc:
            ran = model.lm.source != "embedded" and isinstance(exc.__cause__, (RuntimeError, ValueError, IndexError))
            sizes = f"\n    hint: the embedded model ran; {SIZES_HINT}" if ran else ""
            ctx.report.record(case, False, f"{exc}{sizes}")
            return False
        if attend.calls != (c + 1) * em.shape.layers:
            ctx.report.record(case, False, f"attend was called {attend.calls - c * em.shape.layers} times in this "
                                           f"call; call it once per layer ({em.shape.layers} layers), with the layer index")
            return False
        want = torch.stack([refs[where[i][0]][where[i][1]] for i in rows])
        tol = 2e-4 * max(1.0, float(want.abs().max())) + 1e-4
        worst, (i, token) = _worst(got, want)
        if worst > tol:
            hint = _matches(got, _forward_alternatives(em, plan, ids, all_rows, c), tol)
            r, p = where[rows[i]]
            ctx.report.record(case, False, f"logits differ from transformers' by up to {worst:.3g} (allowed {tol:.1g}): "
                                           f"row {i} (request {r}, position {p}), token id {token}: expected "
                                           f"{float(want[i, token]):.5g}, got {float(got[i, token]):.5g}"
                              + (f"\n    hint: {hint}" if hint else ""))
            return False
        total_rows += len(rows)
    ctx.report.record(f"forward on {label}: logits equal transformers'", True,
                      f"{len(plan)} calls ({requests} request{'s' if requests > 1 else ''} in one flat batch; a prefill, one decoding token, a "
                      f"chunk starting mid-sequence, the rest), {total_rows} rows within fp32 tolerance")
    return True


# ---------------------------------------------------------------------------------------------
# 3. generate


def _first_difference(got: list[int], ref: h.Reference) -> int | None:
    """Where ``got`` parts from the reference (None: equal, or parted only at a near tie)."""
    want = list(ref.tokens)
    j = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    if j is None and len(got) == len(want):
        return None
    j = min(len(got), len(want)) if j is None else j
    if j < len(ref.margins) and ref.margins[j] < h.TIE_MARGIN:
        return None
    return j


def check_generate(ctx: StageContext, model: h.CheckModel, prompt: list[int], max_new: int, eos: int | None,
                   label: str) -> bool:
    em = EngineModel.from_hf(model.lm.model)
    ref = h.reference(model, prompt, SamplingParams(max_tokens=max_new, ignore_eos=eos is None))
    fed: list[int] = []
    module = ctx.module
    original = module.forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        tokens = kwargs.get("token_ids", args[1] if len(args) > 1 else None)
        fed.append(len(tokens))
        return original(*args, **kwargs)

    case = f"generate on {label}: {len(prompt)} prompt tokens, up to {max_new} new, eos_token_id={eos}"
    module.forward = counting  # generate looks forward up in its module when it calls it
    try:
        got = ctx.call("generate", em, list(prompt), max_new, eos, case=case)
    finally:
        module.forward = original
    if not fed:
        return ctx.report.record(case, False, "generate never called forward (the check counts the calls to this "
                                              "file's forward function): decode with your own forward pass")
    j = _first_difference(got, ref)
    if j is not None:
        want = list(ref.tokens)
        what = (f"expected {want[j]} {h.tokens_text(model, [want[j]])}, got {got[j]} {h.tokens_text(model, [got[j]])}"
                if j < len(got) and j < len(want) else f"{len(got)} tokens instead of {len(want)}")
        hint = ""
        if j >= len(want) and eos is not None:
            hint = "stop after the EOS token (keep it in the list) or at max_new_tokens, whichever comes first"
        elif j > 0:
            hint = ("the first token is right, a later one is not: after the prompt, feed only the newest token, "
                    "at position len(prompt) + (tokens generated so far) - 1, and attend over every cached K/V")
        return ctx.report.record(case, False, f"first different token at output position {j} (the {j} before it "
                                              f"agree): {what}" + (f"\n    hint: {hint}" if hint else ""))
    most = len(prompt) + len(got)
    if sum(fed) > most:
        return ctx.report.record(case, False, f"the tokens are right, but forward was given {sum(fed)} tokens in "
                                              f"{len(fed)} calls for a prompt of {len(prompt)} and {len(got)} new "
                                              f"tokens: keep each layer's K/V in a cache and give forward only the "
                                              f"newest token ({most - 1} tokens in all)")
    return ctx.report.record(case, True, f"{len(got)} tokens identical to transformers' greedy output; forward given "
                                         f"{sum(fed)} tokens in {len(fed)} calls (a KV cache)")


# ---------------------------------------------------------------------------------------------
# 4. Inside the engine


def check_engine(ctx: StageContext) -> None:
    parts = ctx.parts()
    chat = h.chat_trace(QUESTIONS, max_tokens=8)
    result = h.run(h.embedded(), h.engine_config(block_size=5), parts, chat)
    h.compare(ctx.report, f"inside the engine: {chat.describe()}, blocks of 5", result)

    rng = ctx.rng("engine")
    model = h.hidden()
    bs, budget = rng.choice((3, 7)), rng.randint(8, 12)
    trace = h.random_trace(ctx.subseed("trace"), model.vocab, n=7 if ctx.full else 5, prompt_lens=(14, 34),
                           new_tokens=(6, 16), arrival_steps=3, name="a hidden trace on the hidden model")
    config = h.engine_config(block_size=bs, max_model_len=64, chunked_prefill=True, max_num_batched_tokens=budget)
    chunks = [0]
    result = h.run(model, config, parts, trace, on_step=h.count_prompt_chunks(chunks))
    h.compare(ctx.report, f"inside the engine: {trace.describe()}, blocks of {bs}, chunked prefill under "
                          f"{budget} tokens a step ({chunks[0]} chunks continued a prompt)", result)


def check(ctx: StageContext) -> None:
    if not (check_rms_norm(ctx) and check_apply_rope(ctx) and check_attention(ctx)):
        return
    if not (check_forward(ctx, h.embedded(), 1) and check_forward(ctx, h.hidden(), 2)):
        return
    rng = ctx.rng("generate")
    chat = h.embedded().lm.chat_ids(GENERATE_QUESTION)[0].tolist()
    hidden = h.hidden()
    ok = check_generate(ctx, h.embedded(), chat, 8, h.embedded().eos, "the embedded SmolLM2 (a chat prompt)")
    ok = check_generate(ctx, hidden, h.random_prompt(rng, hidden.vocab, rng.randint(6, 14)), rng.randint(10, 16),
                        None, "the hidden model") and ok
    if ok:
        check_engine(ctx)


STAGE = Stage(
    number=1, key="forward", title="The forward pass", file="01_forward.py",
    components={"forward": "forward"}, chapter="01", reads=("01", "03"), minutes=120,
    task="The decoder on real weights: RMSNorm, RoPE, grouped-query causal attention, then the whole forward pass "
         "(embedding, every layer with its q/k/v bias if any, the final norm, the LM head) over a flat batch of "
         "tokens, and greedy decoding with a KV cache of your own.",
    check=check, requires=("rms_norm", "apply_rope", "attention", "forward", "generate"),
    adapters={"rms_norm": _like(0), "apply_rope": _like(0), "attention": _like(0), "forward": _as_logits,
              "generate": as_int_list},
    symbol="src/infer_lab/engine/model.py::forward_tokens",
)
