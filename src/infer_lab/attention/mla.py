"""Multi-head latent attention (MLA, DeepSeek-V2/V3), written out with two decode paths.

Per token the cache holds one latent vector ``c`` (``kv_lora_rank`` values, shared by all
heads) and one decoupled RoPE key ``k_rope`` (``qk_rope_head_dim`` values, also shared).
Per head, keys and values are up-projections of the latent:

    k_nope_h = W_uk_h c        v_h = W_uv_h c        k_h = [k_nope_h, k_rope]

* Naive decode decompresses every cached token into per-head K and V, then attends.
* Absorbed decode never builds K or V: since q_nope_h · (W_uk_h c) = (W_uk_hᵀ q_nope_h) · c, the query
  is moved into latent space once, attention runs against the latents, and W_uv is applied
  after the weighted sum. The two are equal up to rounding; absorbed reads far fewer bytes.

RoPE cannot be absorbed (it depends on the position), which is why it lives in a separate small
key. Simplifications versus DeepSeek: no low-rank query compression and no YaRN scaling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..engine.layers import apply_rope, rope_cos_sin, rope_inverse_frequencies
from .reference import allowed_mask, naive_attention, sdpa_attention

DECODE_PATHS = ("naive", "absorbed")


@dataclass(frozen=True)
class MLAConfig:
    """MLA shape. DeepSeek-V3: 128 heads, latent 512, nope 128, rope 64, v 128."""

    d_model: int
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_theta: float = 10000.0

    def __post_init__(self):
        for name in (
            "d_model",
            "n_heads",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for RoPE, got {self.qk_rope_head_dim}")

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], scale_down: int = 1) -> MLAConfig:
        """From a DeepSeek-style config dict (e.g. ``catalog.load_model_config('deepseek-v3')``).

        ``scale_down`` divides every width (not head count ratios) to get a small same-proportion layer.
        """
        return cls(
            d_model=cfg["hidden_size"] // scale_down,
            n_heads=max(cfg["num_attention_heads"] // scale_down, 1),
            kv_lora_rank=cfg["kv_lora_rank"] // scale_down,
            qk_nope_head_dim=cfg["qk_nope_head_dim"] // scale_down,
            qk_rope_head_dim=cfg["qk_rope_head_dim"] // scale_down,
            v_head_dim=cfg["v_head_dim"] // scale_down,
            rope_theta=cfg.get("rope_theta", 10000.0),
        )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cached_values_per_token(self) -> int:
        """Numbers cached per token per layer: latent + decoupled RoPE key (576 for DeepSeek-V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class MLACache:
    """Cached latents ``(batch, tokens, kv_lora_rank)`` and RoPE keys ``(batch, tokens, rope_dim)``."""

    def __init__(self):
        self.latent: torch.Tensor | None = None
        self.k_rope: torch.Tensor | None = None
        self.position = 0

    def append(
        self, latent: torch.Tensor, k_rope: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.latent = latent if self.latent is None else torch.cat([self.latent, latent], dim=1)
        self.k_rope = k_rope if self.k_rope is None else torch.cat([self.k_rope, k_rope], dim=1)
        self.position += latent.shape[1]
        return self.latent, self.k_rope

    @property
    def nbytes(self) -> int:
        """Exact bytes of the cached latents and RoPE keys."""
        if self.latent is None:
            return 0
        return sum(t.numel() * t.element_size() for t in (self.latent, self.k_rope))


class MultiHeadLatentAttention(nn.Module):
    """MLA layer: ``forward(x, cache, decode='naive'|'absorbed')``."""

    def __init__(self, config: MLAConfig):
        super().__init__()
        c = self.config = config
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.qk_head_dim, bias=False)
        self.kv_down = nn.Linear(c.d_model, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(c.kv_lora_rank, eps=1e-6)
        self.k_up = nn.Linear(c.kv_lora_rank, c.n_heads * c.qk_nope_head_dim, bias=False)  # W_uk
        self.v_up = nn.Linear(c.kv_lora_rank, c.n_heads * c.v_head_dim, bias=False)  # W_uv
        self.o_proj = nn.Linear(c.n_heads * c.v_head_dim, c.d_model, bias=False)
        self.scale = 1 / math.sqrt(c.qk_head_dim)

    def new_cache(self) -> MLACache:
        return MLACache()

    def _queries_and_latents(self, x: torch.Tensor, start: int):
        c = self.config
        b, t, _ = x.shape
        positions = torch.arange(start, start + t, device=x.device)
        inv_freq = rope_inverse_frequencies(c.qk_rope_head_dim, c.rope_theta, x.device)
        cos, sin = rope_cos_sin(positions, inv_freq, x.dtype)
        q = self.q_proj(x).view(b, t, c.n_heads, c.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_down(x).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        return (
            q_nope,
            apply_rope(q_rope, cos, sin),
            self.kv_norm(latent),
            apply_rope(k_rope, cos, sin),
        )

    def decompress(
        self, latent: torch.Tensor, k_rope: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head K ``(b, heads, t, nope+rope)`` and V ``(b, heads, t, v_dim)`` from cached latents."""
        c = self.config
        b, t, _ = latent.shape
        k_nope = self.k_up(latent).view(b, t, c.n_heads, c.qk_nope_head_dim).transpose(1, 2)
        v = self.v_up(latent).view(b, t, c.n_heads, c.v_head_dim).transpose(1, 2)
        k_rope_heads = k_rope[:, None].expand(b, c.n_heads, t, c.qk_rope_head_dim)
        return torch.cat([k_nope, k_rope_heads], dim=-1), v

    def attend_naive(self, q_nope, q_rope, latent, k_rope, backend: str = "naive") -> torch.Tensor:
        """Decompress K/V and attend (``backend`` 'naive' or 'sdpa'); returns ``(b, heads, q, v_dim)``."""
        k, v = self.decompress(latent, k_rope)
        q = torch.cat([q_nope, q_rope], dim=-1)
        fn = sdpa_attention if backend == "sdpa" else naive_attention
        return fn(q, k, v, causal=True, scale=self.scale)

    def attend_absorbed(self, q_nope, q_rope, latent, k_rope) -> torch.Tensor:
        """Attend in latent space with W_uk folded into the query and W_uv applied afterwards."""
        c = self.config
        w_uk = self.k_up.weight.view(c.n_heads, c.qk_nope_head_dim, c.kv_lora_rank)
        w_uv = self.v_up.weight.view(c.n_heads, c.v_head_dim, c.kv_lora_rank)
        q_latent = torch.einsum("bhqn,hnr->bhqr", q_nope, w_uk)
        scores = q_latent @ latent[:, None].transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(
            -2, -1
        )
        scores = scores * self.scale
        mask = allowed_mask(q_nope.shape[-2], latent.shape[1], causal=True, device=latent.device)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(latent.dtype)
        out_latent = weights @ latent[:, None]  # (b, heads, q, kv_lora_rank)
        return torch.einsum("bhqr,hvr->bhqv", out_latent, w_uv)

    def forward(
        self,
        x: torch.Tensor,
        cache: MLACache | None = None,
        decode: str = "naive",
        backend: str = "naive",
    ) -> torch.Tensor:
        """Attend ``x`` over the cache plus itself. ``decode`` picks the path: 'naive' or 'absorbed'."""
        if decode not in DECODE_PATHS:
            raise ValueError(f"unknown MLA path {decode!r}; use one of {', '.join(DECODE_PATHS)}")
        start = cache.position if cache is not None else 0
        q_nope, q_rope, latent, k_rope = self._queries_and_latents(x, start)
        if cache is not None:
            latent, k_rope = cache.append(latent, k_rope)
        if decode == "absorbed":
            out = self.attend_absorbed(q_nope, q_rope, latent, k_rope)
        else:
            out = self.attend_naive(q_nope, q_rope, latent, k_rope, backend)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
