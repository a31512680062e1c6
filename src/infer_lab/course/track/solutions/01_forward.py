"""Stage 1 · The forward pass: a reference solution."""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    angles = positions[:, None].float() * inv_freq[None, :]  # (T, d/2), fp32
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]  # (T, 1, d): pair i and i + d/2 share an angle
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    n, heads, _ = q.shape
    ctx, kv_heads, _ = k.shape
    k = k.repeat_interleave(heads // kv_heads, dim=1)  # query head h reads KV head h // group
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("nhd,chd->hnc", q, k) * scale
    hidden = torch.arange(ctx, device=q.device)[None, :] > torch.arange(n, device=q.device)[:, None] + (ctx - n)
    probs = scores.masked_fill(hidden, float("-inf")).softmax(dim=-1)
    return torch.einsum("hnc,chd->nhd", probs, v)


def forward(model, token_ids: torch.Tensor, positions: torch.Tensor, attend, rows: list[int]) -> torch.Tensor:
    s = model.shape
    q_size, kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
    h = model.embed[token_ids]
    for layer, w in enumerate(model.layers):
        x = rms_norm(h, w.input_norm, s.rms_norm_eps)
        q, k, v = F.linear(x, w.qkv_proj, w.qkv_bias).split((q_size, kv_size, kv_size), dim=-1)
        q = apply_rope(q.reshape(-1, s.heads, s.head_dim), positions, model.inv_freq)
        k = apply_rope(k.reshape(-1, s.kv_heads, s.head_dim), positions, model.inv_freq)
        o = attend(layer, q, k, v.reshape(-1, s.kv_heads, s.head_dim))
        h = h + F.linear(o.reshape(len(h), -1), w.o_proj)
        x = rms_norm(h, w.post_attention_norm, s.rms_norm_eps)
        gate, up = F.linear(x, w.gate_up_proj).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, w.down_proj)
    h = rms_norm(h[rows], model.final_norm, s.rms_norm_eps)
    return F.linear(h, model.lm_head).float()


def generate(model, prompt_ids: list[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> K, V of every position so far
    scale = model.shape.head_dim**-0.5

    def attend(layer, q, k, v):
        if layer in cache:
            k, v = torch.cat((cache[layer][0], k)), torch.cat((cache[layer][1], v))
        cache[layer] = (k, v)
        return attention(q, k, v, scale)

    device = model.embed.device
    ids, positions = torch.tensor(prompt_ids, device=device), torch.arange(len(prompt_ids), device=device)
    out: list[int] = []
    while len(out) < max_new_tokens:
        logits = forward(model, ids, positions, attend, [len(ids) - 1])
        token = int(logits[0].argmax())
        out.append(token)
        if token == eos_token_id:
            break
        ids, positions = torch.tensor([token], device=device), torch.tensor([len(prompt_ids) + len(out) - 1], device=device)
    return out
