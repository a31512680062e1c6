"""LEGACY, being moved into the chapter modules ch07-ch10 and ch12; delete when empty.

The step-by-step demonstrations of modules 07-10, as library functions returning tidy rows.

Notebooks and tour steps only call these and plot the rows; every number is measured here
(times with ``time.perf_counter`` around synchronized engine steps; memory from the allocators).
"""

from __future__ import annotations

import math
import random
from typing import Any

from ..analysis.fragmentation import LAYOUTS, make_layout, make_requests, simulate
from ..bench.engine import run_engine_benchmark
from ..engine import ContiguousKVCache, Engine, EngineConfig, PagedKVCache, SamplingParams, Sequence
from ..shape import ModelShape


def no_cache_vs_kv_cache(
    lm: Any, prompt_len: int = 16, new_tokens: int = 48
) -> list[dict[str, Any]]:
    """Time per generated token vs position, without a cache (recompute all) and with a paged cache.

    Rows: ``mode``, ``position`` (tokens in context), ``step_ms``, ``flops`` (2 * params * tokens
    computed in that step: the O(N^2) total of no-cache is the sum over positions).
    """
    prompt = lm.random_ids(1, prompt_len, seed=7)[0].tolist()
    params = sum(p.numel() for p in lm.model.parameters())
    rows = []
    for mode in ("nocache", "paged"):
        config = EngineConfig(
            kv_mode=mode, max_num_seqs=1, max_model_len=prompt_len + new_tokens + 1
        )
        engine = Engine.from_loaded(lm, config)
        engine.generate([prompt[:4]], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
        engine = Engine.from_loaded(lm, config)
        engine.generate([prompt], SamplingParams(max_tokens=new_tokens, ignore_eos=True))
        for i, rec in enumerate(engine.step_log):
            rows.append(
                {
                    "mode": mode,
                    "position": prompt_len + i,
                    "step_ms": rec.duration_s * 1e3,
                    "tokens_computed": rec.num_tokens,
                    "flops": 2 * params * rec.num_tokens,
                    "phase": "prefill" if i == 0 else "decode",
                }
            )
    return rows


def kv_memory_waste(
    shape: ModelShape,
    prompt_lens: list[int],
    output_lens: list[int],
    max_model_len: int,
    block_size: int = 16,
    bytes_per_value: int = 2,
) -> list[dict[str, Any]]:
    """Wasted KV memory of a contiguous max-length reservation vs paged blocks, for one workload.

    Each request holds ``prompt + output`` tokens at the end of its life. Contiguous mode reserves
    ``max_model_len`` slots per request (over-reservation + internal waste); paged mode reserves
    whole blocks (waste only in each request's last block). Bytes come from the allocators'
    :class:`~.kv_cache.KVMemoryReport` (no model run needed; ``bytes_per_value`` sets the dtype size).
    :func:`kv_waste_breakdown` follows the same workload over time and splits the waste into
    over-reservation, internal and external fragmentation.
    """
    import torch

    dtype = {2: torch.bfloat16, 4: torch.float32}[bytes_per_value]
    tiny = shape.with_layers(1)  # one layer of storage; bytes scaled below
    scale = shape.layers
    n = len(prompt_lens)
    seqs = [
        Sequence(f"r{i}", [0] * p, SamplingParams(max_tokens=o), 0.0)
        for i, (p, o) in enumerate(zip(prompt_lens, output_lens, strict=False))
    ]
    contiguous = ContiguousKVCache(tiny, n, max_model_len, dtype)
    paged = PagedKVCache(
        tiny,
        sum(
            math.ceil((p + o) / block_size) for p, o in zip(prompt_lens, output_lens, strict=False)
        ),
        block_size,
        dtype,
    )
    rows = []
    for name, cache in (("contiguous", contiguous), ("paged", paged)):
        for seq, o in zip(seqs, output_lens, strict=False):
            seq.num_computed, seq.block_table, seq.region = 0, [], None
            cache.allocate(seq, seq.num_tokens + o)
            seq.num_computed = seq.num_tokens + o
        report = cache.memory_report(seqs)
        rows.append(
            {
                "layout": name,
                "requests": n,
                "used_bytes": report.used_bytes * scale,
                "reserved_bytes": report.reserved_bytes * scale,
                "wasted_bytes": report.wasted_bytes * scale,
                "wasted_fraction": report.wasted_fraction,
                "block_size": block_size if name == "paged" else None,
                "max_model_len": max_model_len,
            }
        )
        for seq in seqs:
            cache.free(seq)
    return rows


def kv_waste_breakdown(
    shape: ModelShape,
    prompt_lens: list[int],
    output_lens: list[int],
    max_model_len: int,
    kv_budget_bytes: int,
    max_tokens: int | list[int] | None = 512,
    block_size: int = 16,
    arrival_every: float = 1.0,
    bytes_per_value: int = 2,
) -> list[dict[str, Any]]:
    """KV waste split into over-reservation, internal and external fragmentation, over time.

    The workload runs through :func:`~.fragmentation.simulate` once per layout
    (``contiguous-max``, ``contiguous-exact``, ``paged``) in a shared budget of
    ``kv_budget_bytes // bytes_per_token`` token slots, where ``bytes_per_token = 2 (K and V) x
    layers x kv_heads x head_dim x bytes_per_value``. Request ``i`` arrives at step
    ``int(i * arrival_every)`` and declares ``max_tokens`` (``None``: exactly its output length).

    One row per layout:

    * ``used_fraction``, ``reserved_future_fraction``, ``internal_frag_fraction``,
      ``external_frag_fraction``: time-averaged shares of the memory that was *allocated or
      blocked* (sum over steps of each class / sum over steps of all four; free memory is not in
      the denominator). They sum to 1; ``wasted_fraction = 1 - used_fraction``, the vLLM paper's
      waste.
    * ``*_bytes`` of the same four classes: their mean over the steps of the run, in bytes.
    * ``eol_used_bytes``, ``eol_reserved_bytes``, ``eol_wasted_fraction``: summed over requests at
      the last step of each one's life (the snapshot :func:`kv_memory_waste` takes).
    * ``steps`` to finish the workload, ``mean_running`` / ``peak_running`` requests at once,
      ``preemptions`` (paged only), ``external_frag_steps`` (steps where holes blocked the queue).
    * ``kv_budget_bytes``: the budget actually simulated (rounded down to whole slots).
    """
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * bytes_per_value
    budget_slots = kv_budget_bytes // per_token
    requests = make_requests(prompt_lens, output_lens, max_model_len, max_tokens, arrival_every)
    declared = max_tokens if max_tokens is None or isinstance(max_tokens, int) else "per request"
    rows = []
    for name in LAYOUTS:
        timeline = simulate(
            make_layout(name, budget_slots, max_model_len, block_size), requests, budget_slots
        )
        frac, steps = timeline.fractions(), len(timeline.steps)
        running = [s.running for s in timeline.steps]
        row: dict[str, Any] = {
            "layout": name,
            "requests": len(requests),
            "kv_budget_bytes": budget_slots * per_token,
            "max_model_len": max_model_len,
            "max_tokens": declared,
            "block_size": block_size if name == "paged" else None,
            "steps": steps,
            "mean_running": sum(running) / steps,
            "peak_running": max(running),
            "preemptions": timeline.preemptions,
            "external_frag_steps": sum(1 for s in timeline.steps if s.external),
        }
        for kind, label in _WASTE_CLASSES:
            row[f"{label}_fraction"] = frac[kind]
            row[f"{label}_bytes"] = timeline.total(kind) / steps * per_token
        row["wasted_fraction"] = 1.0 - frac["used"]
        row["eol_used_bytes"] = timeline.eol_used * per_token
        row["eol_reserved_bytes"] = timeline.eol_reserved * per_token
        row["eol_wasted_fraction"] = 1.0 - timeline.eol_used / timeline.eol_reserved
        rows.append(row)
    return rows


# StepSlots field -> column prefix in kv_waste_breakdown's rows
_WASTE_CLASSES = (
    ("used", "used"),
    ("future", "reserved_future"),
    ("internal", "internal_frag"),
    ("external", "external_frag"),
)


def requests_that_fit(
    shape: ModelShape,
    kv_budget_bytes: int,
    prompt_lens: list[int],
    output_lens: list[int],
    max_model_len: int,
    block_size: int = 16,
    bytes_per_value: int = 2,
) -> list[dict[str, Any]]:
    """How many of the requests fit at once in a KV budget: contiguous reservation vs paged blocks."""
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * bytes_per_value
    budget_tokens = kv_budget_bytes // per_token
    contiguous = min(len(prompt_lens), budget_tokens // max_model_len)
    blocks, fit = budget_tokens // block_size, 0
    for p, o in zip(prompt_lens, output_lens, strict=False):
        need = math.ceil((p + o) / block_size)
        if need > blocks:
            break
        blocks -= need
        fit += 1
    return [
        {
            "layout": "contiguous",
            "kv_budget_bytes": kv_budget_bytes,
            "requests_that_fit": contiguous,
        },
        {"layout": "paged", "kv_budget_bytes": kv_budget_bytes, "requests_that_fit": fit},
    ]


def mixed_lengths(
    n: int, seed: int = 0, max_prompt: int = 512, max_output: int = 512
) -> tuple[list[int], list[int]]:
    """A reproducible mixed workload: prompt and output lengths drawn log-uniformly."""
    rng = random.Random(seed)
    return (
        [int(math.exp(rng.uniform(math.log(8), math.log(max_prompt)))) for _ in range(n)],
        [int(math.exp(rng.uniform(math.log(4), math.log(max_output)))) for _ in range(n)],
    )


def static_vs_continuous(
    lm: Any,
    requests: int = 16,
    concurrency: int = 8,
    prompt_len: int = 32,
    max_output: int = 48,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """The same requests (varied output lengths) with static and continuous batching: one row each."""
    rng = random.Random(seed)
    lens = [rng.randint(max(2, max_output // 8), max_output) for _ in range(requests)]
    rows = []
    for mode in ("static", "continuous"):
        r = run_engine_benchmark(
            lm,
            requests=requests,
            concurrency=concurrency,
            prompt_len=prompt_len,
            output_len=max_output,
            output_lens=lens,
            mode=mode,
            seed=seed,
        )
        rows.append(_flat(mode, r))
    return rows


def concurrency_sweep(
    lm: Any,
    concurrencies: list[int],
    requests: int = 16,
    prompt_len: int = 32,
    output_len: int = 32,
) -> list[dict[str, Any]]:
    """Total tokens/s vs tokens/s per user across batch sizes (the Pareto frontier of serving)."""
    rows = []
    for c in concurrencies:
        r = run_engine_benchmark(
            lm,
            requests=max(requests, c),
            concurrency=c,
            prompt_len=prompt_len,
            output_len=output_len,
        )
        row = _flat("continuous", r)
        row["concurrency"] = c
        row["tokens_per_s_per_user"] = 1e3 / r["itl_ms"]["mean"] if r["itl_ms"] else None
        rows.append(row)
    return rows


def decode_paths(
    lm: Any,
    batch: int = 1,
    prompt_len: int = 32,
    output_len: int = 16,
    compile_layers: bool = False,
) -> list[dict[str, Any]]:
    """The same decode run through each decode path this device has, slowest idea first.

    ``per-sequence`` (one attention call per request), ``batched`` (one call for all),
    ``static`` (fixed padded shapes, preallocated buffers) and, on a GPU, ``cuda-graphs``
    (the static step captured once, replayed with one launch). With ``compile_decode`` the
    fastest path is also run with torch.compile's fused layers (compiled during warm-up).
    Each row: ``path``, ``fused``, ``compiled``, ``itl_ms_p50``, ``tokens_per_s_per_user``
    (1 / ITL p50) and ``output_tokens_per_s`` (whole run, prefill included).
    """
    cuda = lm.device.type == "cuda"
    variants = [("per-sequence", False, False), ("batched", cuda, False), ("static", cuda, False)]
    if cuda:
        variants.append(("cuda-graphs", True, False))
    if compile_layers:
        variants.append((variants[-1][0], True, True))
    rows = []
    for path, fused, compiled in variants:
        r = run_engine_benchmark(
            lm,
            requests=batch,
            concurrency=batch,
            prompt_len=prompt_len,
            output_len=output_len,
            decode_path=path,
            fuse_projections=fused,
            compile_layers=compiled,
        )
        itl = r["itl_ms"]["p50"] if r["itl_ms"] else None
        rows.append(
            {
                "path": path,
                "fused": fused,
                "compiled": compiled,
                "batch": batch,
                "itl_ms_p50": itl,
                "tokens_per_s_per_user": 1e3 / itl if itl else None,
                "output_tokens_per_s": r["output_tokens_per_s"],
                "graphs_captured": r["decode_path"]["graphs_captured"],
            }
        )
    return rows


def _flat(label: str, r: dict[str, Any]) -> dict[str, Any]:
    row = {
        "mode": label,
        "output_tokens_per_s": r["output_tokens_per_s"],
        "requests_per_s": r["requests_per_s"],
        "mean_idle_slots": r["mean_idle_slots"],
        "steps": r["steps"],
    }
    for key in ("ttft_ms", "itl_ms"):
        for q in ("p50", "p90", "p99"):
            row[f"{key}_{q}"] = r[key][q] if r[key] else None
    return row
