"""Benchmarks of the engine: throughput, TTFT/ITL percentiles and KV use for one configuration.

These are measurements, never timed tests: warm-up first, every request timed from its arrival,
percentiles instead of single numbers. On a GPU every step ends with a synchronization
(``logits.cpu()`` inside sampling), so wall-clock times are honest.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from ..engine import Engine, EngineConfig, RequestOutput, SamplingParams
from ..harness import env_metadata, summarize
from .ledger import (
    copy_bandwidth,
    decode_step_bytes,
    engine_weight_bytes,
    kv_dtype_of,
    ledger_row,
    mean_decode_context,
)

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
    pool = kv if hasattr(kv, "num_used_blocks") else None  # paged KV
    pc = engine.prefix_cache
    decode = [r for r in log if r.prefill_tokens == 0 and r.decode_tokens > 0 and not r.failed]
    decode_s, decode_tokens = sum(r.duration_s for r in decode), sum(r.decode_tokens for r in decode)
    lens = ([len(o.prompt_ids) for o in outputs], [len(o.token_ids) for o in outputs])
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
        "decode_steps": len(decode),
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s else None,
        "mean_decode_batch": decode_tokens / len(decode) if decode else None,
        "mean_decode_context": mean_decode_context(*lens) if decode else None,
        "samples": {"ttft_s": ttft, "e2e_s": [o.e2e_s for o in outputs], "steps": {
            "duration_s": [r.duration_s for r in log], "num_seqs": [r.num_seqs for r in log],
            "prefill_tokens": [r.prefill_tokens for r in log], "decode_tokens": [r.decode_tokens for r in log]}},
    }


def engine_step_bytes(lm: Any, engine: Engine, run: dict[str, Any]) -> int | None:
    """Bytes (:func:`~.ledger.decode_step_bytes`) of a mean pure decode step of a :func:`summarize_run`
    result, at its mean batch and context, with the engine's weights and KV format; None without
    decode steps or without a KV cache (``nocache`` recomputes instead of reading K/V)."""
    if run["decode_tokens_per_s"] is None or engine.config.kv_mode == "nocache":
        return None
    return decode_step_bytes(lm, run["mean_decode_batch"], run["mean_decode_context"],
                             weight_bytes=engine_weight_bytes(lm, engine.model),
                             kv_dtype=kv_dtype_of(engine.model.dtype, engine.config.kv_dtype))


def engine_ledger(lm: Any, run: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`~.ledger.ledger_row` of a :func:`timed_engine_run` result at its decode tokens/s (None
    where it has no ``decode_step_bytes``); measures the copy bandwidth on first use."""
    if run["decode_step_bytes"] is None:
        return None
    return ledger_row(run["decode_tokens_per_s"], run["mean_decode_batch"], run["decode_step_bytes"],
                      copy_bandwidth(lm.device))


def engine_config(
    max_num_seqs: int = 16,
    max_model_len: int = 2048,
    policy: str = "continuous",
    prefix_cache: str = "none",
    chunk_tokens: int | None = None,
    kv_mode: str = "paged",
    block_size: int = 16,
    num_blocks: int | None = None,
    decode_path: str = "auto",
    fuse_projections: bool = True,
    compile_layers: bool = False,
    kv_dtype: str | None = None,
    prepack_weights: bool | None = None,
    weight_quant: str | None = None,
    engine_dtype: str | None = None,
    compiled_decode: bool = False,
) -> EngineConfig:
    """The :class:`EngineConfig` a benchmark's switches name (``prepack_weights`` None: the engine decides)."""
    extra = {"kv_dtype": kv_dtype} if kv_dtype is not None else {}
    return EngineConfig(
        kv_mode=kv_mode,
        block_size=block_size,
        num_blocks=num_blocks,
        policy=policy,
        max_num_seqs=max_num_seqs,
        chunked_prefill=chunk_tokens is not None,
        max_num_batched_tokens=chunk_tokens or 512,
        prefix_cache=prefix_cache,
        max_model_len=max_model_len,
        fuse_projections=fuse_projections,
        compile_layers=compile_layers,
        prepack_weights=prepack_weights,
        weight_quant=weight_quant,
        dtype=engine_dtype,
        compiled_decode=compiled_decode,
        **decode_path_config(decode_path),
        **extra,
    )


def warm_up_engine(lm: Any, config: EngineConfig, seed: int = 1) -> None:
    """One request, then two: batch 1 and batch > 1 are separate shapes to a compiler."""
    for n in (1, 2):
        Engine.from_loaded(lm, config).generate(
            workload(lm, n, 8, seed=seed), SamplingParams(max_tokens=3, ignore_eos=True)
        )


def timed_engine_run(
    lm: Any, config: EngineConfig, prompts: list[list[int]], output_lens: list[int]
) -> tuple[dict[str, Any], list[RequestOutput]]:
    """Every request at t = 0 through a fresh engine (EOS ignored); its summary and outputs."""
    engine = Engine.from_loaded(lm, config)
    runner = engine.decode_runner
    capture_s = runner.capture_all() if runner is not None and runner.use_cuda_graphs else None
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens]
    t0 = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    result = summarize_run(engine, outputs, elapsed)
    result["decode_step_bytes"] = engine_step_bytes(lm, engine, result)
    result["decode_path"] = {
        "batched_decode": config.batched_decode,
        "static_decode": runner is not None,
        "cuda_graphs": bool(runner and runner.use_cuda_graphs),
        "fused_projections": config.fuse_projections,
        "prepacked_weights": engine.prepacked_weights,
        "gemm_plan": engine.gemm_plan.as_dict(),
        "compiled": config.compile_layers,
        "compiled_decode": config.compiled_decode,
        "compiled_decode_setup_s": engine.compile_s,  # this engine's; the compile itself ran in the warm-up
        "static_steps": runner.steps if runner else 0,
        "graphs_captured": len(runner.graphs) if runner else 0,
    }
    if capture_s is not None:
        result["graph_capture_s"] = capture_s
    return result, outputs


def run_engine_benchmark(
    lm: Any,
    requests: int = 16,
    concurrency: int = 16,
    prompt_len: int = 64,
    output_len: int = 32,
    policy: str = "continuous",
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
    kv_dtype: str | None = None,
    workload_kind: str = "uniform",
    prepack_weights: bool | None = None,
    weight_quant: str | None = None,
    engine_dtype: str | None = None,
    compiled_decode: bool = False,
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
        kv_dtype: the KV cache's storage (``None``: the model's dtype; ``int8``, ``fp8``).
        prepack_weights: GEMMs on oneDNN-prepacked weights (``None``: on a CPU when possible).
        compiled_decode: one-token steps through :mod:`~infer_lab.engine.cpu.cpu_decode` (CPU).
        workload_kind: ``uniform`` or ``mixed`` (seeded prompt and output lengths; see
            :func:`~infer_lab.bench.baselines.make_workload`).
    Returns:
        :func:`summarize_run` fields plus ``config``; ``graph_capture_s`` when CUDA graphs are
        captured (before the clock starts, as a server does at start-up).
    """
    from .baselines import make_workload

    for name, value in (
        ("requests", requests),
        ("concurrency", concurrency),
        ("prompt_len", prompt_len),
        ("output_len", output_len),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    wl = make_workload(lm, workload_kind, requests, prompt_len, output_len, seed, shared_prefix_len)
    lens = output_lens or wl.output_lens
    if len(lens) != requests:
        raise ValueError("output_lens needs one entry per request")
    longest = max(len(p) for p in wl.prompts)
    config = engine_config(concurrency, longest + max(lens) + 1, policy, prefix_cache, chunk_tokens,
                           kv_mode, block_size, num_blocks, decode_path, fuse_projections,
                           compile_layers, kv_dtype, prepack_weights, weight_quant, engine_dtype,
                           compiled_decode)
    if warmup:
        warm_up_engine(lm, config, seed + 1)
    result, _ = timed_engine_run(lm, config, wl.prompts, lens)
    result["decode_path"]["requested"] = decode_path
    result["ledger"] = engine_ledger(lm, result)
    result["config"] = {
        "requests": requests,
        "concurrency": concurrency,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "workload": wl.describe(),
        "policy": policy,
        "prefix_cache": prefix_cache,
        "chunk_tokens": chunk_tokens,
        "kv_mode": kv_mode,
        "kv_dtype": config.kv_dtype if hasattr(config, "kv_dtype") else None,
        "weight_quant": weight_quant,
        "engine_dtype": engine_dtype,
        "compiled_decode": compiled_decode,
        "block_size": block_size,
        "shared_prefix_len": shared_prefix_len,
    }
    return result


UNCOMPILED = "engine-uncompiled"  # the engine's own contender when compiled_decode is on


def compare_with_hf(
    lm: Any,
    workload_kind: str = "uniform",
    requests: int = 16,
    concurrency: int = 16,
    prompt_len: int = 128,
    output_len: int = 64,
    rounds: int = 3,
    seed: int = 0,
    contenders: tuple[str, ...] | None = None,
    **engine_switches: Any,
) -> dict[str, Any]:
    """The engine against HF sequential, HF padded batch and HF continuous batching, interleaved.

    Every contender runs the same requests (same prompts, same output lengths, EOS ignored,
    greedy). Each contender is warmed up once, then ``rounds`` rounds run every contender in
    turn (the order rotates), so a slow patch of the machine hits all of them. Reported
    throughput is the median over rounds; ``identical_to_*`` says whether the engine's tokens
    equal that contender's, request by request. With ``compiled_decode`` in ``engine_switches``
    the same engine without it is one more contender (``engine-uncompiled``), and for one user
    on the uniform workload so is transformers compiled (``hf-compiled``: compiled against compiled).
    """
    from .baselines import default_contenders, make_workload, run_contender

    names = ("engine", *(contenders or default_contenders(lm)))
    one_user_compiled = engine_switches.get("compiled_decode") and concurrency == 1 and workload_kind == "uniform"
    if contenders is None and one_user_compiled:
        names += ("hf-compiled",)
    wl = make_workload(lm, workload_kind, requests, prompt_len, output_len, seed)
    longest = max(len(p) for p in wl.prompts)
    config = engine_config(concurrency, longest + max(wl.output_lens) + 1, **engine_switches)
    # With compiled_decode the same engine without it runs too, interleaved: what the compile buys.
    uncompiled = replace(config, compiled_decode=False) if config.compiled_decode else None
    if uncompiled is not None:
        names += (UNCOMPILED,)
        warm_up_engine(lm, uncompiled, seed + 1)
    small = make_workload(lm, workload_kind, 2, 8, 3, seed + 1)
    warm_up_engine(lm, config, seed + 1)
    for name in names[1:]:
        if name == "hf-compiled":  # compiles its graphs for the workload's own shapes, off the clock
            run_contender(name, lm, replace(wl, prompts=wl.prompts[:1], output_lens=wl.output_lens[:1]),
                          concurrency)
        elif name != UNCOMPILED:
            run_contender(name, lm, small, concurrency)
    tokens_per_s: dict[str, list[float]] = {n: [] for n in names}
    engine_decode: list[float] = []  # the engine's decode tokens/s per round (the ledger's speed)
    outputs: dict[str, list[list[int]]] = {}
    engine_result: dict[str, Any] = {}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if name == "engine":
                engine_result, outs = timed_engine_run(lm, config, wl.prompts, wl.output_lens)
                tokens_per_s[name].append(engine_result["output_tokens_per_s"])
                engine_decode.append(engine_result["decode_tokens_per_s"])
                outputs[name] = [o.token_ids for o in outs]
            elif name == UNCOMPILED:
                other, outs = timed_engine_run(lm, uncompiled, wl.prompts, wl.output_lens)
                tokens_per_s[name].append(other["output_tokens_per_s"])
                outputs[name] = [o.token_ids for o in outs]
            else:
                run = run_contender(name, lm, wl, concurrency)
                tokens_per_s[name].append(run.tokens_per_s)
                outputs[name] = run.outputs
    median = {n: statistics.median(v) for n, v in tokens_per_s.items()}
    result = dict(engine_result)
    result["output_tokens_per_s"] = median["engine"]
    result["rounds"] = rounds
    result["tokens_per_s_by_round"] = tokens_per_s
    if result["decode_tokens_per_s"] is not None:  # the ledger at the median, as the tok/s beside it
        result["decode_tokens_per_s_by_round"] = engine_decode
        result["decode_tokens_per_s"] = statistics.median(engine_decode)
    result["ledger"] = engine_ledger(lm, result)
    result["workload"] = wl.describe()
    result["threads"] = torch.get_num_threads()
    if workload_kind == "uniform":  # the bound assumes equal lengths: say how close the engine got
        from ..analysis.compare import dtype_name, shape_of
        from ..analysis.roofline import measured_roof
        from ..hardware import measure_ceilings

        roof = measured_roof(measure_ceilings(lm.device, quick=False))
        bounds = roofline_bounds(shape_of(lm), roof, requests, concurrency, prompt_len, output_len,
                                 dtype_name(lm))
        result.update(bounds)
        result["fraction_of_roofline_bound"] = (
            median["engine"] / bounds["roofline_bound"]["output_tokens_per_s"])
    for name in names[1:]:
        key = name.replace("-", "_")
        result[f"baseline_{key}_tokens_per_s"] = median[name]
        result[f"speedup_vs_{key}"] = median["engine"] / median[name]
        result[f"identical_to_{key}"] = outputs["engine"] == outputs[name]
    return result


def roofline_bounds(shape: Any, roof: Any, requests: int, concurrency: int, prompt_len: int,
                    output_len: int, dtype: str) -> dict[str, dict[str, Any]]:
    """Three throughput bounds (:func:`~.predicted.throughput_bound`) for a uniform workload.

    ``roofline_bound``: the workload actually run, ``concurrency`` requests at a time;
    ``roofline_bound_batch_1``: one request at a time; ``roofline_bound_batch_n``: all
    ``requests`` in one batch. A fraction of the first one is what the engine reached.
    """
    from .predicted import throughput_bound

    def bound(c: int) -> dict[str, Any]:
        return throughput_bound(shape, roof, requests, prompt_len, output_len, dtype, concurrency=c)

    run = bound(concurrency)
    one = run if concurrency == 1 else bound(1)
    everyone = run if concurrency >= requests else bound(requests)
    return {"roofline_bound": run, "roofline_bound_batch_1": one, "roofline_bound_batch_n": everyone}


def benchmark_with_metadata(lm: Any, compare_hf: bool = False, **kwargs: Any) -> dict[str, Any]:
    """:func:`run_engine_benchmark`, or with ``compare_hf`` :func:`compare_with_hf`; plus the environment."""
    if compare_hf:
        keys = ("workload_kind", "requests", "concurrency", "prompt_len", "output_len", "rounds", "seed")
        args = {k: kwargs.pop(k) for k in keys if k in kwargs}
        for unused in ("shared_prefix_len", "output_lens", "warmup"):
            kwargs.pop(unused, None)
        result = compare_with_hf(lm, **args, **kwargs)
    else:
        kwargs.pop("rounds", None)
        result = run_engine_benchmark(lm, **kwargs)
    result["threads"] = torch.get_num_threads()
    if result.get("ledger") is not None:
        result["copy_bandwidth"] = copy_bandwidth(lm.device).as_dict()
    result["environment"] = env_metadata(lm)
    return result
