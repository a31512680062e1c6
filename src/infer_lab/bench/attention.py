"""Benchmarks of attention on this machine: SDPA backends across lengths, decode attention vs KV heads.

Both run on any device (sizes are the caller's choice); the interesting numbers come from a GPU,
where the fused backends avoid writing the N x N scores and decode attention is memory-bound.
Timing follows the harness rules: warm-up, synchronization, repeats, median.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from ..attention.flash import score_matrix_bytes
from ..harness import summarize, time_call
from ..units import require_positive


def _backends() -> dict[str, Any]:
    from torch.nn.attention import SDPBackend

    names = {
        "math": "MATH",
        "flash": "FLASH_ATTENTION",
        "efficient": "EFFICIENT_ATTENTION",
        "cudnn": "CUDNN_ATTENTION",
    }
    return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}


def sdpa_backend_times(
    seq_lens: list[int],
    heads: int = 32,
    head_dim: int = 128,
    batch: int = 1,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    causal: bool = True,
    repeats: int = 5,
) -> list[dict[str, Any]]:
    """Median prefill-attention time of each SDPA backend per sequence length.

    A backend this device or dtype cannot run is reported with ``available=False`` and the reason,
    not skipped silently. ``score_matrix_bytes`` is what the math backend must hold for the scores.
    """
    from torch.nn.attention import sdpa_kernel

    require_positive("repeats", repeats)
    dev = torch.device(device)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    rows = []
    for n in seq_lens:
        require_positive("seq_len", n)
        q, k, v = (
            torch.randn(batch, heads, n, head_dim, device=dev, dtype=dtype) for _ in range(3)
        )
        for name, backend in _backends().items():
            row: dict[str, Any] = {
                "backend": name,
                "seq_len": n,
                "heads": heads,
                "head_dim": head_dim,
                "score_matrix_bytes": score_matrix_bytes(n, heads, batch, q.element_size()),
            }
            try:
                with sdpa_kernel(backend):
                    times = time_call(
                        partial(F.scaled_dot_product_attention, q, k, v, is_causal=causal),
                        dev,
                        warmup=1,
                        repeats=repeats,
                    )
                row.update(available=True, time_s_p50=summarize(times).p50)
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                row.update(available=False, time_s_p50=None, reason=str(exc).splitlines()[0][:160])
            rows.append(row)
    return rows


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
) -> list[dict[str, Any]]:
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
        q = torch.randn(batch, n_heads, 1, head_dim, device=dev, dtype=dtype)
        k, v = (
            torch.randn(batch, kv, context, head_dim, device=dev, dtype=dtype) for _ in range(2)
        )
        times = time_call(
            partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=kv != n_heads),
            dev,
            warmup=2,
            repeats=repeats,
        )
        kv_bytes = 2 * k.numel() * k.element_size()
        measured = summarize(times).p50
        row = {
            "kv_heads": kv,
            "context": context,
            "batch": batch,
            "kv_bytes": kv_bytes,
            "time_s_p50": measured,
        }
        if bandwidth_Bps:
            row["predicted_s"] = kv_bytes / bandwidth_Bps
            row["measured_over_predicted"] = measured / row["predicted_s"]
        rows.append(row)
    return rows
