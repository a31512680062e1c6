"""One readable attention layer with a KV cache: MHA, GQA, MQA and sliding-window are settings.

* MHA: ``n_kv_heads == n_heads`` (every query head has its own K and V).
* GQA: ``n_heads % n_kv_heads == 0``; each group of ``n_heads / n_kv_heads`` query heads shares one K/V head.
* MQA: ``n_kv_heads == 1``.
* Sliding window: ``window=w`` lets each token see only the last ``w`` tokens, and the cache keeps
  only those, so its memory stops growing at ``w`` tokens.

The KV cache stores K after RoPE, which is what every engine caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.layers import apply_rope, rope_cos_sin, rope_inverse_frequencies
from .flash import flash_attention
from .reference import naive_attention, sdpa_attention

BACKENDS = ("naive", "sdpa", "flash")


@dataclass(frozen=True)
class AttentionConfig:
    """Shape of one attention layer. ``n_kv_heads=None`` means MHA; ``window=None`` means full attention."""

    d_model: int
    n_heads: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    window: int | None = None
    rope_theta: float = 10000.0

    def __post_init__(self):
        kv = self.kv_heads
        if self.d_model < 1 or self.n_heads < 1 or kv < 1:
            raise ValueError(f"d_model, n_heads and n_kv_heads must be >= 1, got {self}")
        if self.n_heads % kv:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={kv}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; pass head_dim"
            )
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 token, got {self.window}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def dim(self) -> int:
        """Per-head dimension."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def kind(self) -> str:
        """'MHA', 'GQA-<groups>' or 'MQA', with ' + window <w>' for sliding window."""
        kv = self.kv_heads
        base = "MHA" if kv == self.n_heads else "MQA" if kv == 1 else f"GQA-{kv}"
        return base + (f" + window {self.window}" if self.window else "")


class KVCache:
    """K and V of past tokens for one layer, ``(batch, kv_heads, tokens, head_dim)``, grown by concatenation.

    With ``window`` set, only the most recent ``window`` tokens are kept after each step.
    ``position`` counts every token ever appended (the next token's absolute position).
    """

    def __init__(self, window: int | None = None):
        self.window = window
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.position = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add the new tokens' K/V; return all K/V the new queries may need (before trimming)."""
        keys = k if self.keys is None else torch.cat([self.keys, k], dim=-2)
        values = v if self.values is None else torch.cat([self.values, v], dim=-2)
        self.position += k.shape[-2]
        if self.window is not None:
            self.keys, self.values = keys[..., -self.window :, :], values[..., -self.window :, :]
        else:
            self.keys, self.values = keys, values
        return keys, values

    @property
    def tokens(self) -> int:
        """Tokens held now (at most ``window`` with a sliding window)."""
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def nbytes(self) -> int:
        """Exact bytes of the stored K and V tensors."""
        if self.keys is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))


class Attention(nn.Module):
    """Causal self-attention with RoPE, parameterized by :class:`AttentionConfig`.

    ``backend`` picks who computes softmax(QK^T)V: ``'naive'`` (written out), ``'sdpa'`` (torch's
    fused op, the reference) or ``'flash'`` (the tiled online-softmax version).
    """

    def __init__(self, config: AttentionConfig, backend: str = "naive"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
        self.config, self.backend = config, backend
        d, h, kv, hd = config.d_model, config.n_heads, config.kv_heads, config.dim
        self.q_proj = nn.Linear(d, h * hd, bias=False)
        self.k_proj = nn.Linear(d, kv * hd, bias=False)
        self.v_proj = nn.Linear(d, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)

    def new_cache(self) -> KVCache:
        """An empty cache sized for this layer's window."""
        return KVCache(window=self.config.window)

    def project(
        self, x: torch.Tensor, start_position: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V of ``x`` ``(batch, tokens, d_model)`` with RoPE applied at positions from ``start_position``."""
        b, t, _ = x.shape
        c = self.config
        q = self.q_proj(x).view(b, t, c.n_heads, c.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.kv_heads, c.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.kv_heads, c.dim).transpose(1, 2)
        positions = torch.arange(start_position, start_position + t, device=x.device)
        inv_freq = rope_inverse_frequencies(c.dim, c.rope_theta, x.device)
        cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)  # (t, dim): broadcasts over batch and heads
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str | None = None
    ) -> torch.Tensor:
        """Causal (and windowed) attention of ``q`` over ``k``/``v`` with the chosen backend."""
        backend = backend or self.backend
        window = self.config.window
        if backend == "naive":
            return naive_attention(q, k, v, causal=True, window=window)
        if backend == "sdpa":
            return sdpa_attention(q, k, v, causal=True, window=window)
        if backend == "flash":
            return flash_attention(q, k, v, causal=True, window=window)
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, backend: str | None = None
    ) -> torch.Tensor:
        """Attend ``x`` ``(batch, tokens, d_model)`` over the cached tokens plus itself; updates ``cache``."""
        start = cache.position if cache is not None else 0
        q, k, v = self.project(x, start)
        if cache is not None:
            k, v = cache.append(k, v)
        out = self.attend(q, k, v, backend)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
