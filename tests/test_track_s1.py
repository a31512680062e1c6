"""Stage 1, the forward pass: the starter fails, the solution passes, near misses are caught by name,
and correct answers written differently pass."""

from __future__ import annotations

import re

import pytest
from track_helpers import check_text, failures, mutated, solution_result

from infer_lab.course import track

KEY = "forward"


def test_the_starter_is_not_done_and_the_solution_passes(tmp_path, track_solutions):
    starter = track.starter_path(track.stage(KEY)).read_text()
    assert check_text(KEY, starter, tmp_path).status == "todo"
    result = solution_result(track_solutions, KEY)
    assert result.passed, failures(result)
    assert result.tokens_identical and len(result.engine_runs) == 2
    said = " | ".join(o.detail for o in result.outcomes) + " | ".join(o.case for o in result.outcomes)
    chunks = re.search(r"\((\d+) chunks continued a prompt\)", said)
    assert chunks and int(chunks.group(1)) > 0, said  # chunked prefill really ran: queries shorter than contexts
    assert "(a KV cache)" in said


NEAR_MISSES = [  # (name, {old: new}, what the check must say)
    ("qkv-bias-never-added", {"F.linear(x, w.qkv_proj, w.qkv_bias)": "F.linear(x, w.qkv_proj)"},
     "q/k/v bias is never added"),
    ("smollm2-sizes-hard-coded", {"import torch\n": "import dataclasses\n\nimport torch\n",
                                  "    s = model.shape\n    q_size":
                                  "    s = dataclasses.replace(model.shape, heads=9, kv_heads=3, head_dim=64)\n    q_size"},
     "read every size from model.shape"),
    ("rope-interleaved-pairs", {"angles = torch.cat((angles, angles), dim=-1)[:, None, :]":
                                "angles = angles.repeat_interleave(2, dim=-1)[:, None, :]",
                                "rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)":
                                "rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)"},
     "interleaved"),
    ("mask-ignores-context-offset", {"torch.arange(n, device=q.device)[:, None] + (ctx - n)":
                                     "torch.arange(n, device=q.device)[:, None]"},
     "are the LAST"),
    ("gqa-repeat", {"k = k.repeat_interleave(heads // kv_heads, dim=1)": "k = k.repeat(1, heads // kv_heads, 1)",
                    "v = v.repeat_interleave(heads // kv_heads, dim=1)": "v = v.repeat(1, heads // kv_heads, 1)"},
     "repeat_interleave, not repeat"),
    ("lm-head-is-the-embedding", {"F.linear(h, model.lm_head)": "F.linear(h, model.embed)"},
     "multiply by model.lm_head"),
    ("positions-from-zero-each-call", {"q.reshape(-1, s.heads, s.head_dim), positions,":
                                       "q.reshape(-1, s.heads, s.head_dim), torch.arange(len(h)),",
                                       "k.reshape(-1, s.kv_heads, s.head_dim), positions,":
                                       "k.reshape(-1, s.kv_heads, s.head_dim), torch.arange(len(h)),"},
     "use the positions argument"),
    ("eps-outside-the-root", {"torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)":
                              "1 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + eps)"}, "eps goes inside"),
    ("generate-without-a-cache", {"        ids, positions = torch.tensor([token], device=device), "
                                  "torch.tensor([len(prompt_ids) + len(out) - 1], device=device)":
                                  "        cache.clear()\n        ids = torch.tensor(list(prompt_ids) + out)\n"
                                  "        positions = torch.arange(len(ids))"},
     "keep each layer's K/V in a cache"),
]


@pytest.mark.parametrize("name, changes, phrase", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_a_near_miss_is_caught(tmp_path, name, changes, phrase):
    result = check_text(KEY, mutated(KEY, changes), tmp_path, fail_fast=True)
    assert result.status == "fail", f"the near miss passed: {[o.detail for o in result.outcomes]}"
    said = failures(result)
    assert phrase in said, said


FLOAT64_INSIDE = {  # every activation and weight in float64; logits back in float32
    "    h = model.embed[token_ids]\n    for layer, w in enumerate(model.layers):":
    "    def d(t):\n        return None if t is None else t.double()\n\n"
    "    h = d(model.embed[token_ids])\n    for layer, w in enumerate(model.layers):",
    "F.linear(x, w.qkv_proj, w.qkv_bias)": "F.linear(x, d(w.qkv_proj), d(w.qkv_bias))",
    "F.linear(o.reshape(len(h), -1), w.o_proj)": "F.linear(o.reshape(len(h), -1).double(), d(w.o_proj))",
    "F.linear(x, w.gate_up_proj)": "F.linear(x, d(w.gate_up_proj))",
    "F.linear(F.silu(gate) * up, w.down_proj)": "F.linear(F.silu(gate) * up, d(w.down_proj))",
    "F.linear(h, model.lm_head).float()": "F.linear(h, d(model.lm_head)).float()",
    "x32 = x.float()": "x32 = x.double()",
    "return weight * x32.to(x.dtype)": "return weight.to(x.dtype) * x32.to(x.dtype)",
}

NUMPY_NORM_AND_TUPLES = {  # rms_norm in numpy (returns an array), generate returns a tuple
    "import torch\n": "import numpy as np\nimport torch\n",
    "    x32 = x.float()\n    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)\n"
    "    return weight * x32.to(x.dtype)":
    "    a = x.detach().cpu().numpy().astype(np.float64)\n"
    "    return a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + eps) * weight.detach().cpu().numpy()",
    "x = rms_norm(h, w.input_norm, s.rms_norm_eps)": "x = torch.as_tensor(rms_norm(h, w.input_norm, s.rms_norm_eps))"
                                                     ".to(h.dtype)",
    "x = rms_norm(h, w.post_attention_norm, s.rms_norm_eps)":
        "x = torch.as_tensor(rms_norm(h, w.post_attention_norm, s.rms_norm_eps)).to(h.dtype)",
    "h = rms_norm(h[rows], model.final_norm, s.rms_norm_eps)":
        "h = torch.as_tensor(rms_norm(h[rows], model.final_norm, s.rms_norm_eps)).to(h.dtype)",
    "    return out\n": "    return tuple(out)\n",
}

ANOTHER_WAY = '''"""Stage 1 written another way: complex-number RoPE, SDPA, separate q/k/v products, a preallocated cache."""

import torch
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    return weight * (x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps))


def apply_rope(x, positions, inv_freq):
    half = x.shape[-1] // 2
    turn = torch.polar(torch.ones(len(positions), half), positions.float()[:, None] * inv_freq)  # e^(i angle)
    z = torch.complex(x[..., :half].float(), x[..., half:].float()) * turn[:, None, :]
    return torch.cat((z.real, z.imag), dim=-1).to(x.dtype)


def attention(q, k, v, scale):
    n, ctx = q.shape[0], k.shape[0]
    allowed = torch.ones(n, ctx, dtype=torch.bool).tril(diagonal=ctx - n)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=allowed, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def forward(model, token_ids, positions, attend, rows):
    shape = model.shape
    d = shape.head_dim
    sizes = [shape.heads * d, shape.kv_heads * d, shape.kv_heads * d]
    x = model.embed[token_ids]
    for i, layer in enumerate(model.layers):
        normed = rms_norm(x, layer.input_norm, shape.rms_norm_eps)
        weights = layer.qkv_proj.split(sizes)
        biases = layer.qkv_bias.split(sizes) if layer.qkv_bias is not None else [None] * 3
        q, k, v = (normed @ w.T + (b if b is not None else 0) for w, b in zip(weights, biases))
        q = apply_rope(q.view(len(x), shape.heads, d), positions, model.inv_freq)
        k = apply_rope(k.view(len(x), shape.kv_heads, d), positions, model.inv_freq)
        x = x + attend(i, q, k, v.view(len(x), shape.kv_heads, d)).flatten(1) @ layer.o_proj.T
        normed = rms_norm(x, layer.post_attention_norm, shape.rms_norm_eps)
        gate_w, up_w = layer.gate_up_proj.chunk(2)
        x = x + (F.silu(normed @ gate_w.T) * (normed @ up_w.T)) @ layer.down_proj.T
    x = rms_norm(x[torch.tensor(rows, dtype=torch.long)], model.final_norm, shape.rms_norm_eps)
    return (x @ model.lm_head.T).to(torch.float32)


def generate(model, prompt_ids, max_new_tokens, eos_token_id):
    s = model.shape
    size = len(prompt_ids) + max_new_tokens
    keys = torch.zeros(s.layers, size, s.kv_heads, s.head_dim)
    values = torch.zeros_like(keys)
    filled = [0]

    def attend(layer, q, k, v):
        start = filled[0]
        keys[layer, start:start + len(k)] = k
        values[layer, start:start + len(v)] = v
        end = start + len(k)
        if layer == s.layers - 1:
            filled[0] = end
        return attention(q, keys[layer, :end], values[layer, :end], s.head_dim ** -0.5)

    ids = list(prompt_ids)
    step_ids, step_pos = ids, list(range(len(ids)))
    for _ in range(max_new_tokens):
        logits = forward(model, torch.tensor(step_ids), torch.tensor(step_pos), attend, [len(step_ids) - 1])
        nxt = logits[-1].argmax().item()
        ids.append(nxt)
        yield nxt
        if eos_token_id is not None and nxt == eos_token_id:
            return
        step_ids, step_pos = [nxt], [len(ids) - 1]
'''

VARIANTS = {"float64-inside": FLOAT64_INSIDE, "numpy-norm-and-tuples": NUMPY_NORM_AND_TUPLES}


@pytest.mark.parametrize("name", [*VARIANTS, "another-way"])
def test_a_correct_variant_passes(tmp_path, name):
    text = ANOTHER_WAY if name == "another-way" else mutated(KEY, VARIANTS[name])
    result = check_text(KEY, text, tmp_path)
    assert result.passed, failures(result)
    assert result.tokens_identical
