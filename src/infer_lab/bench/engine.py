"""Benchmarks of the engine: throughput, TTFT/ITL percentiles and KV use for one configuration.

These are measurements, never timed tests: warm-up first, every request timed from its arrival,
percentiles instead of single numbers. On a GPU every step ends with a synchronization
(``logits.cpu()`` inside sampling), so wall-clock times are honest.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ..engine import Engine, EngineConfig, RequestOutput, SamplingParams
from ..harness import env_metadata, summarize

DECODE_PATHS = {
    "auto": {},
    "per-sequence": {"batched_decode": False, "static_decode": False},
    "batched": {"batched_decode": True, "static_decode": False},
    "static": {"static_decode": True, "cuda_graphs": False},
    "cuda-graphs": {"static_decode": True, "cuda_graphs": True},
}


def decode_path_config(path: str) -> dict[str, Any]:
    """:class:`EngineConfig` switches of a named decode path (``auto``: CUDA graphs on a GPU, batched on a CPU)."""
    if path not in DECODE_PATHS:
        raise ValueError(f"decode path must be one of {', '.join(DECODE_PATHS)}, got {path!r}")
    return dict(DECODE_PATHS[path])


def percentiles_ms(samples_s: list[float]) -> dict[str, float] | None:
    """p50/p90/p99/mean of seconds, in milliseconds; None when there are no samples."""
    if not samples_s:
        return None
    s = summarize(samples_s)
    return {"p50": s.p50 * 1e3, "p90": s.p90 * 1e3, "p99": s.p99 * 1e3, "mean": s.mean * 1e3}


def workload(
    lm: Any, requests: int, prompt_len: int, shared_prefix_len: int = 0, seed: int = 0
) -> list[list[int]]:
    """``requests`` random prompts of ``prompt_len`` tokens whose first ``shared_prefix_len`` are shared."""
    if shared_prefix_len > prompt_len:
        raise ValueError(
            f"shared_prefix_len ({shared_prefix_len}) cannot exceed prompt_len ({prompt_len})"
        )
    ids = lm.random_ids(requests, prompt_len, seed=seed).cpu()
    if shared_prefix_len:
        ids[:, :shared_prefix_len] = ids[0, :shared_prefix_len]
    return ids.tolist()


def summarize_run(engine: Engine, outputs: list[RequestOutput], elapsed_s: float) -> dict[str, Any]:
    """The tidy result of a finished engine run (the JSON of ``infer-lab bench engine``)."""
    n_out = sum(len(o.token_ids) for o in outputs)
    ttft = [o.ttft_s for o in outputs if o.ttft_s is not None]
    itl = [x for o in outputs for x in o.itl_s]
    log = engine.step_log
    kv = engine.kv
    pool = getattr(kv, "pool", None)
    pc = engine.prefix_cache
    return {
        "output_tokens": n_out,
        "elapsed_s": elapsed_s,
        "output_tokens_per_s": n_out / elapsed_s,
        "requests_per_s": len(outputs) / elapsed_s,
        "ttft_ms": percentiles_ms(ttft),
        "itl_ms": percentiles_ms(itl),
        "steps": len(log),
        "mean_batch_size": sum(r.num_seqs for r in log) / max(len(log), 1),
        "mean_idle_slots": sum(r.idle_slots for r in log) / max(len(log), 1),
        "kv_blocks_total": pool.num_blocks if pool else None,
        "kv_blocks_peak_used": kv.peak_blocks_used if pool else None,
        "kv_block_size": engine.config.block_size if pool else None,
        "prefix_hit_rate": pc.stats.hit_rate if pc else 0.0,
        "prefix_hit_tokens": pc.stats.hit_tokens if pc else 0,
        "num_preemptions": engine.scheduler.num_preemptions,
        "failed_requests": sum(1 for o in outputs if o.finish_reason == "error"),
    }


def run_engine_benchmark(
    lm: Any,
    requests: int = 16,
    concurrency: int = 16,
    prompt_len: int = 64,
    output_len: int = 32,
    mode: str = "continuous",
    prefix_cache: str = "none",
    chunk_tokens: int | None = None,
    kv_mode: str = "paged",
    block_size: int = 16,
    num_blocks: int | None = None,
    shared_prefix_len: int = 0,
    output_lens: list[int] | None = None,
    seed: int = 0,
    warmup: bool = True,
    decode_path: str = "auto",
    fuse_projections: bool = True,
    compile_layers: bool = False,
) -> dict[str, Any]:
    """Run ``requests`` random-prompt requests (EOS ignored) through a fresh engine; all arrive at t=0.

    Args:
        concurrency: batch slots (``max_num_seqs``).
        prompt_len, output_len: tokens per request (``output_lens`` overrides per request).
        mode: ``"continuous"`` or ``"static"`` batching.
        prefix_cache: ``"none"``, ``"hash"`` or ``"radix"``.
        chunk_tokens: per-step token budget with chunked prefill (None: no chunking).
        decode_path: ``auto``, ``per-sequence``, ``batched``, ``static`` or ``cuda-graphs``
            (see :data:`DECODE_PATHS`).
        fuse_projections: one GEMM for q|k|v and one for gate|up (off: five GEMMs).
        compile_layers: torch.compile both halves of every layer (compiled during the warm-up).
    Returns:
        :func:`summarize_run` fields plus ``config``; ``graph_capture_s`` when CUDA graphs are
        captured (before the clock starts, as a server does at start-up).
    """
    for name, value in (
        ("requests", requests),
        ("concurrency", concurrency),
        ("prompt_len", prompt_len),
        ("output_len", output_len),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    lens = output_lens or [output_len] * requests
    if len(lens) != requests:
        raise ValueError("output_lens needs one entry per request")
    config = EngineConfig(
        kv_mode=kv_mode,
        block_size=block_size,
        num_blocks=num_blocks,
        policy=mode,
        max_num_seqs=concurrency,
        chunked_prefill=chunk_tokens is not None,
        max_num_batched_tokens=chunk_tokens or 512,
        prefix_cache=prefix_cache,
        max_model_len=prompt_len + max(lens) + 1,
        fuse_projections=fuse_projections,
        compile_layers=compile_layers,
        **decode_path_config(decode_path),
    )
    if warmup:  # one request, then two: batch 1 and batch > 1 are separate shapes to a compiler
        for n in (1, 2):
            Engine.from_loaded(lm, config).generate(
                workload(lm, n, min(prompt_len, 8), seed=seed + 1),
                SamplingParams(max_tokens=3, ignore_eos=True),
            )
    prompts = workload(lm, requests, prompt_len, shared_prefix_len, seed)
    engine = Engine.from_loaded(lm, config)
    runner = engine.decode_runner
    capture_s = runner.capture_all() if runner is not None and runner.use_cuda_graphs else None
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lens]
    t0 = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    result = summarize_run(engine, outputs, elapsed)
    result["decode_path"] = {
        "requested": decode_path,
        "batched_decode": config.batched_decode,
        "static_decode": runner is not None,
        "cuda_graphs": bool(runner and runner.use_cuda_graphs),
        "fused_projections": config.fuse_projections,
        "compiled": config.compile_layers,
        "static_steps": runner.steps if runner else 0,
        "graphs_captured": len(runner.graphs) if runner else 0,
    }
    if capture_s is not None:
        result["graph_capture_s"] = capture_s
    result["config"] = {
        "requests": requests,
        "concurrency": concurrency,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "mode": mode,
        "prefix_cache": prefix_cache,
        "chunk_tokens": chunk_tokens,
        "kv_mode": kv_mode,
        "block_size": block_size,
        "shared_prefix_len": shared_prefix_len,
    }
    return result


@torch.inference_mode()
def hf_sequential_tokens_per_s(
    lm: Any,
    requests: int,
    prompt_len: int,
    output_len: int,
    seed: int = 0,
    shared_prefix_len: int = 0,
) -> dict[str, float]:
    """Baseline: transformers ``generate`` one request after another (exactly ``output_len`` tokens each)."""
    prompts = workload(lm, requests, prompt_len, shared_prefix_len, seed)
    device = lm.device
    lm.model.generate(
        torch.tensor([prompts[0][:8]], device=device),
        max_new_tokens=2,
        min_new_tokens=2,
        do_sample=False,
    )  # warm-up
    t0 = time.perf_counter()
    for p in prompts:
        lm.model.generate(
            torch.tensor([p], device=device),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    return {"tokens_per_s": requests * output_len / elapsed, "elapsed_s": elapsed}


def benchmark_with_metadata(lm: Any, compare_hf: bool = False, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_engine_benchmark` plus environment metadata and, optionally, the HF sequential baseline."""
    result = run_engine_benchmark(lm, **kwargs)
    if compare_hf:
        cfg = result["config"]
        base = hf_sequential_tokens_per_s(
            lm,
            cfg["requests"],
            cfg["prompt_len"],
            cfg["output_len"],
            seed=kwargs.get("seed", 0),
            shared_prefix_len=cfg["shared_prefix_len"],
        )
        result["baseline_hf_sequential_tokens_per_s"] = base["tokens_per_s"]
        result["speedup_vs_hf_sequential"] = result["output_tokens_per_s"] / base["tokens_per_s"]
    result["environment"] = env_metadata(lm)
    return result
