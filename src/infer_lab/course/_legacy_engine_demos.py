"""LEGACY, being moved into the chapter modules ch07-ch10 and ch12; delete when empty.

The step-by-step demonstrations of modules 07-10, as library functions returning tidy rows.

Notebooks and tour steps only call these and plot the rows; every number is measured here
(times with ``time.perf_counter`` around synchronized engine steps; memory from the allocators).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence as Seq
from typing import Any

from ..analysis.fragmentation import LAYOUTS, make_layout, make_requests, simulate
from ..bench.engine import percentiles_ms, run_engine_benchmark
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


def prefix_match_granularity(
    lm: Any, block_size: int = 16, prompt_len: int = 48, shared: Seq[int] | None = None
) -> list[dict[str, Any]]:
    """Tokens each prefix cache reuses when two prompts share their first ``k`` tokens.

    Two requests run one after the other through a fresh engine; the second asks the cache for
    its prompt. Rows: ``cache`` (hash or radix), ``shared_tokens`` (k), ``reused_tokens``
    (the engine's measured ``prefix_hit_tokens``). Nothing is assumed about granularity: the
    rows show whether a cache follows k exactly or in whole blocks.
    """
    ks = (
        sorted(shared)
        if shared is not None
        else sorted(
            {0, 1, *range(4, prompt_len - 7, 4), *range(block_size - 1, prompt_len - 7, block_size)}
        )
    )
    return [
        {
            "cache": cache,
            "shared_tokens": k,
            "reused_tokens": run_engine_benchmark(
                lm,
                requests=2,
                concurrency=1,
                prompt_len=prompt_len,
                output_len=1,
                prefix_cache=cache,
                block_size=block_size,
                shared_prefix_len=k,
                warmup=False,
            )["prefix_hit_tokens"],
        }
        for cache in ("hash", "radix")
        for k in ks
    ]


def prefix_workloads(
    lm: Any, system_len: int = 96, turns: int = 3, branches: int = 3, seed: int = 0
) -> dict[str, list[list[list[int]]]]:
    """Three prefix-sharing workloads as *waves* of prompts (each wave runs after the previous one).

    * ``shared_system_prompt``: 8 users, one long system prompt, short different questions
      (one user first, then seven together).
    * ``multi_turn_chat``: 3 conversations; turn t's prompt is turn t-1's prompt + reply + new question.
    * ``agentic_branching``: propose-then-review: a shared history, ``branches`` proposals from it,
      then a review of each proposal that extends that branch (a tree of shared prefixes).
    Replies are random ids standing in for generated text (prefix reuse depends only on ids).
    """
    g = random.Random(seed)
    vocab = lm.config.vocab_size

    def toks(n: int) -> list[int]:
        return [g.randrange(100, vocab) for _ in range(n)]

    system = toks(system_len)
    users = [system + toks(g.randint(8, 24)) for _ in range(8)]
    shared = [users[:1], users[1:]]  # the first user warms the cache for the others
    chats, waves = [system[:32] + toks(16) for _ in range(3)], []
    for _ in range(turns):
        waves.append([list(c) for c in chats])
        chats = [c + toks(12) + toks(10) for c in chats]
    history = system + toks(48)
    proposals = [history + toks(16) for _ in range(branches)]
    reviews = [p + toks(12) + toks(8) for p in proposals]
    agentic = [[history + toks(8)], proposals, reviews]
    return {"shared_system_prompt": shared, "multi_turn_chat": waves, "agentic_branching": agentic}


def prefix_cache_comparison(
    lm: Any, output_len: int = 4, block_size: int = 16, system_len: int = 96, seed: int = 0
) -> list[dict[str, Any]]:
    """Hit rate, prefill tokens computed and TTFT for none / hash / radix on the three workloads."""
    rows = []
    for workload, waves in prefix_workloads(lm, system_len=system_len, seed=seed).items():
        longest = max(len(p) for w in waves for p in w)
        for cache in ("none", "hash", "radix"):
            config = EngineConfig(
                prefix_cache=cache,
                block_size=block_size,
                max_num_seqs=8,
                max_model_len=longest + output_len + 1,
            )
            engine = Engine.from_loaded(lm, config)
            engine.generate([waves[0][0][:4]], SamplingParams(max_tokens=1))  # warm-up
            engine = Engine.from_loaded(lm, config)
            ttfts, prompt_tokens = [], 0
            t0 = time.perf_counter()
            for wave in waves:
                outs = engine.generate(wave, SamplingParams(max_tokens=output_len, ignore_eos=True))
                ttfts += [o.ttft_s for o in outs]
                prompt_tokens += sum(len(p) for p in wave)
            elapsed = time.perf_counter() - t0
            computed = sum(r.prefill_tokens for r in engine.step_log)
            stats = engine.prefix_cache.stats if engine.prefix_cache else None
            ttft = percentiles_ms(ttfts)
            rows.append(
                {
                    "workload": workload,
                    "cache": cache,
                    "block_size": block_size,
                    "prompt_tokens": prompt_tokens,
                    "prefill_tokens_computed": computed,
                    "prefill_tokens_saved": prompt_tokens - computed,
                    "hit_rate": stats.hit_rate if stats else 0.0,
                    "ttft_ms_p50": ttft["p50"],
                    "ttft_ms_mean": ttft["mean"],
                    "elapsed_s": elapsed,
                }
            )
    return rows


def chunked_prefill_effect(
    lm: Any,
    long_prompt: int = 768,
    decoders: int = 4,
    decode_tokens: int = 40,
    chunk_tokens: int = 64,
    arrive_at_step: int = 8,
) -> list[dict[str, Any]]:
    """A long prompt arrives while ``decoders`` requests are decoding: their ITL, with and without chunking.

    Rows (one per engine step): ``chunking``, ``step``, ``step_ms``, ``prefill_tokens``,
    ``decode_tokens``; plus one ``summary`` row per setting with the decoders' ITL p50/max and
    the long request's TTFT.
    """
    prompts = (
        lm.random_ids(decoders, 16, seed=11).tolist()
        + lm.random_ids(1, long_prompt, seed=12).tolist()
    )
    arrivals = [0] * decoders + [arrive_at_step]
    params = [SamplingParams(max_tokens=decode_tokens, ignore_eos=True)] * decoders + [
        SamplingParams(max_tokens=4, ignore_eos=True)
    ]
    rows = []
    for chunking in (False, True):
        config = EngineConfig(
            max_num_seqs=decoders + 1,
            chunked_prefill=chunking,
            max_num_batched_tokens=chunk_tokens,
            max_model_len=long_prompt + 8,
        )
        Engine.from_loaded(lm, config).generate(
            [prompts[0][:4]], SamplingParams(max_tokens=2)
        )  # warm-up
        engine = Engine.from_loaded(lm, config)
        outs = engine.generate(prompts, params, arrival_steps=arrivals)
        for rec in engine.step_log:
            rows.append(
                {
                    "chunking": chunking,
                    "kind": "step",
                    "step": rec.step,
                    "step_ms": rec.duration_s * 1e3,
                    "prefill_tokens": rec.prefill_tokens,
                    "decode_tokens": rec.decode_tokens,
                }
            )
        itl = [x for o in outs[:decoders] for x in o.itl_s]
        rows.append(
            {
                "chunking": chunking,
                "kind": "summary",
                "decoder_itl_ms_p50": percentiles_ms(itl)["p50"],
                "decoder_itl_ms_max": max(itl) * 1e3,
                "long_request_ttft_ms": outs[-1].ttft_s * 1e3,
                "chunk_tokens": chunk_tokens if chunking else None,
                "long_prompt": long_prompt,
            }
        )
    return rows
