"""LEGACY, being moved into the chapter modules ch07-ch10 and ch12; delete when empty.

The step-by-step demonstrations of modules 07-10, as library functions returning tidy rows.

Notebooks and tour steps only call these and plot the rows; every number is measured here
(times with ``time.perf_counter`` around synchronized engine steps; memory from the allocators).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence as Seq
from typing import Any

from ..bench.engine import percentiles_ms, run_engine_benchmark
from ..engine import Engine, EngineConfig, SamplingParams


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
