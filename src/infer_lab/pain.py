"""Module 01, "Feel the pain": the four problems of serving an LLM, measured on your machine.

1. Memory grows with tokens and with users (KV bytes counted from the cache tensors).
2. Time to first token grows with context length (prefill).
3. Naive serving runs requests one after another.
4. Each decode step (the inter-token latency) costs a full read of the weights and the KV.

Every function returns tidy rows (dicts) that a DataFrame, a plot or a report can use.
All timing goes through :mod:`infer_lab.harness` (warm-up, sync, repeats, percentiles).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from .harness import (
    cache_kwarg,
    cache_tensor_bytes,
    progress,
    summarize,
    synchronize,
    timed_generate,
)


@dataclass(frozen=True)
class PainSizes:
    """Sweep sizes for module 01; ``for_device`` picks them for the hardware at hand."""

    contexts: tuple[int, ...]
    users: tuple[int, ...]
    ttft_lengths: tuple[int, ...]
    itl_contexts: tuple[int, ...]
    itl_batches: tuple[int, ...]
    n_requests: int
    prompt_len: int
    new_tokens: int
    repeats: int
    itl_steps: int = 8

    @staticmethod
    def for_device(device: torch.device, quick: bool) -> PainSizes:
        if device.type == "cuda":
            return PainSizes(contexts=(512, 2048, 8192, 16384), users=(1, 8, 32, 64),
                             ttft_lengths=(128, 512, 2048, 8192, 16384), itl_contexts=(128, 2048, 8192, 16384),
                             itl_batches=(1, 8, 32, 64, 128), n_requests=4, prompt_len=512,
                             new_tokens=32 if quick else 128, repeats=3 if quick else 5)
        if quick:
            return PainSizes(contexts=(64, 256), users=(1, 4), ttft_lengths=(32, 128, 256),
                             itl_contexts=(64, 256), itl_batches=(1, 4), n_requests=3, prompt_len=32,
                             new_tokens=6, repeats=2, itl_steps=4)
        return PainSizes(contexts=(128, 512, 1024, 2048), users=(1, 4, 8, 16), ttft_lengths=(64, 256, 1024, 2048),
                         itl_contexts=(128, 1024, 2048), itl_batches=(1, 4, 16), n_requests=8, prompt_len=128,
                         new_tokens=32, repeats=3)


@torch.inference_mode()
def _prefill_kv_bytes(lm, batch: int, length: int) -> int:
    """Run one prefill and count the bytes of the KV cache it produced."""
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.model.config)
    lm.model(lm.random_ids(batch, length), use_cache=True, logits_to_keep=1, **{cache_kwarg(lm.model): cache})
    return cache_tensor_bytes(cache)


def memory_growth(lm, contexts: tuple[int, ...], users: tuple[int, ...]) -> list[dict[str, Any]]:
    """Measured KV bytes after a prefill, for each context (1 user) and each user count (first context).

    Rows: ``axis`` ('context' or 'users'), ``context``, ``users``, ``tokens``, ``kv_bytes`` (from the
    cache tensors), ``weight_bytes`` (from the parameters), ``kv_bytes_per_token``.
    """
    rows = []
    weight_bytes = lm.weight_bytes
    plan = [("context", c, 1) for c in contexts] + [("users", contexts[0], u) for u in users]
    for axis, ctx, n_users in progress(plan, desc="KV bytes"):
        kv = _prefill_kv_bytes(lm, n_users, ctx)
        rows.append({"axis": axis, "context": ctx, "users": n_users, "tokens": ctx * n_users, "kv_bytes": kv,
                     "weight_bytes": weight_bytes, "kv_bytes_per_token": kv / (ctx * n_users)})
    return rows


@torch.inference_mode()
def ttft_vs_context(lm, lengths: tuple[int, ...], repeats: int = 3) -> list[dict[str, Any]]:
    """Prefill time (TTFT) of one request for each prompt length: p50/p90 over repeats, in ms."""
    rows = []
    for length in progress(lengths, desc="TTFT vs context"):
        ids = lm.random_ids(1, length)
        timed_generate(lm, ids, 1)  # warm-up at this shape
        samples = [timed_generate(lm, ids, 1).ttft_s for _ in range(repeats)]
        s = summarize(samples)
        rows.append({"prompt_len": length, "ttft_ms_p50": s.p50 * 1e3, "ttft_ms_p90": s.p90 * 1e3,
                     "ttft_ms_min": s.min * 1e3, "repeats": repeats})
    return rows


@torch.inference_mode()
def sequential_vs_batched(lm, n_requests: int, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    """N identical-size requests served one after another vs together in one batch.

    Returns ``{'requests': rows, 'summary': rows}``. Each request row has its arrival (all at
    t=0), start, first-token and finish times in seconds, for a Gantt chart.
    """
    ids = lm.random_ids(n_requests, prompt_len)
    timed_generate(lm, ids[:1], 2)  # warm-up
    requests = []
    synchronize(lm.device)
    t0 = time.perf_counter()
    for i in range(n_requests):
        start = time.perf_counter() - t0
        rec = timed_generate(lm, ids[i : i + 1], new_tokens)
        finish = time.perf_counter() - t0
        requests.append({"mode": "sequential", "request": i, "start_s": start, "first_token_s": start + rec.ttft_s,
                         "finish_s": finish})
    seq_total = time.perf_counter() - t0
    rec = timed_generate(lm, ids, new_tokens)
    for i in range(n_requests):
        requests.append({"mode": "batched", "request": i, "start_s": 0.0, "first_token_s": rec.ttft_s,
                         "finish_s": rec.e2e_s})
    out_tokens = n_requests * new_tokens
    summary = [
        {"mode": "sequential", "wall_s": seq_total, "output_tokens_per_s": out_tokens / seq_total,
         "mean_finish_s": sum(r["finish_s"] for r in requests[:n_requests]) / n_requests},
        {"mode": "batched", "wall_s": rec.e2e_s, "output_tokens_per_s": out_tokens / rec.e2e_s,
         "mean_finish_s": rec.e2e_s},
    ]
    return {"requests": requests, "summary": summary, "n_requests": n_requests, "prompt_len": prompt_len,
            "new_tokens": new_tokens}


@torch.inference_mode()
def itl_vs_context_and_batch(lm, contexts: tuple[int, ...], batches: tuple[int, ...], steps: int = 8
                             ) -> list[dict[str, Any]]:
    """Decode step time (ITL) for each (context, batch): p50/p90 over ``steps`` cached decode steps."""
    rows = []
    grid = [(c, b) for c in contexts for b in batches]
    for ctx, batch in progress(grid, desc="ITL grid"):
        ids = lm.random_ids(batch, ctx)
        timed_generate(lm, ids, 2)  # warm-up at this shape
        rec = timed_generate(lm, ids, steps + 1)
        s = summarize(rec.itl_s)
        rows.append({"context": ctx, "batch": batch, "itl_ms_p50": s.p50 * 1e3, "itl_ms_p90": s.p90 * 1e3,
                     "tokens_per_s_total": batch / s.p50, "tokens_per_s_per_user": 1 / s.p50,
                     "kv_bytes": rec.kv_bytes})
    return rows


def run_all(lm, sizes: PainSizes) -> dict[str, Any]:
    """All four measurements of module 01 with the given sizes."""
    return {
        "memory": memory_growth(lm, sizes.contexts, sizes.users),
        "ttft": ttft_vs_context(lm, sizes.ttft_lengths, sizes.repeats),
        "serving": sequential_vs_batched(lm, sizes.n_requests, sizes.prompt_len, sizes.new_tokens),
        "itl": itl_vs_context_and_batch(lm, sizes.itl_contexts, sizes.itl_batches, sizes.itl_steps),
    }
