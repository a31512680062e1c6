"""Benchmarks of attention on this machine: SDPA backends across lengths, decode attention vs KV heads.

Both run on any device (sizes are the caller's choice); the interesting numbers come from a GPU,
where the fused backends avoid writing the N x N scores and decode attention is memory-bound.
Timing follows the harness rules: warm-up, synchronization, repeats, median.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..attention.flash import score_matrix_bytes
from ..harness import summarize, time_call
from ..units import require_positive


def _backends() -> dict[str, Any]:
    names = {
        "math": "MATH",
        "flash": "FLASH_ATTENTION",
        "efficient": "EFFICIENT_ATTENTION",
        "cudnn": "CUDNN_ATTENTION",
    }
    return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}


@dataclass(frozen=True)
class BackendTime:
    """One SDPA backend at one sequence length: its median time, or why it could not run."""

    backend: str
    seq_len: int
    heads: int
    head_dim: int
    score_matrix_bytes: int  # what the math backend holds for the scores
    available: bool
    time_s_p50: float | None
    reason: str = ""


def sdpa_backend_times(
    seq_lens: list[int] | tuple[int, ...],
    heads: int = 32,
    head_dim: int = 128,
    batch: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    causal: bool = True,
    repeats: int = 5,
) -> list[BackendTime]:
    """Median prefill-attention time of each SDPA backend per sequence length.

    A backend this device or dtype cannot run is reported with ``available=False`` and the reason,
    not skipped silently.
    """
    require_positive("repeats", repeats)
    dev = torch.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    rows = []
    for n in seq_lens:
        require_positive("seq_len", n)
        q, k, v = (torch.randn(batch, heads, n, head_dim, device=dev, dtype=dtype) for _ in range(3))
        scores = score_matrix_bytes(n, heads, batch, q.element_size())
        for name, backend in _backends().items():
            try:
                with sdpa_kernel(backend):
                    times = time_call(partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal),
                                      dev, warmup=1, repeats=repeats)
                rows.append(BackendTime(name, n, heads, head_dim, scores, True, summarize(times).p50))
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                rows.append(BackendTime(name, n, heads, head_dim, scores, False, None,
                                        str(exc).splitlines()[0][:160]))
    return rows


@dataclass(frozen=True)
class DecodeAttentionTime:
    """One decode step of attention at one KV-head count: measured, and predicted from the bytes read."""

    kv_heads: int
    context: int
    batch: int
    kv_bytes: int  # K and V read by the step
    time_s_p50: float
    predicted_s: float | None = None  # kv_bytes / bandwidth, when a bandwidth is given

    @property
    def measured_over_predicted(self) -> float | None:
        return self.time_s_p50 / self.predicted_s if self.predicted_s else None


def decode_attention_vs_kv_heads(
    context: int,
    n_heads: int = 32,
    kv_heads: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    head_dim: int = 128,
    batch: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    bandwidth_Bps: float | None = None,
    repeats: int = 10,
) -> list[DecodeAttentionTime]:
    """One decode step of attention (1 query per sequence over ``context`` cached tokens) per KV-head count.

    Returns the measured median time next to the memory-bound prediction ``kv_bytes / bandwidth``
    when ``bandwidth_Bps`` is given (e.g. the measured copy bandwidth of this device).
    """
    require_positive("context", context)
    dev = torch.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    rows = []
    for kv in kv_heads:
        if n_heads % kv:
            raise ValueError(f"{n_heads} query heads cannot be grouped over {kv} KV heads")
        # The engine's decode layout (engine.layers.grouped_decode_attention): the query heads that
        # share a KV head are that head's query rows, so each K/V head is read once for its group.
        q = torch.randn(batch, kv, n_heads // kv, head_dim, device=dev, dtype=dtype)
        k, v = (torch.randn(batch, kv, context, head_dim, device=dev, dtype=dtype) for _ in range(2))
        times = time_call(partial(F.scaled_dot_product_attention, q, k, v), dev, warmup=2, repeats=repeats)
        kv_bytes = 2 * k.numel() * k.element_size()
        rows.append(DecodeAttentionTime(kv, context, batch, kv_bytes, summarize(times).p50,
                                        kv_bytes / bandwidth_Bps if bandwidth_Bps else None))
    return rows
