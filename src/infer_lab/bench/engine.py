"""Benchmarks of the engine: throughput, TTFT/ITL percentiles and KV use for one configuration.

These are measurements, never timed tests: warm-up first, every request timed from its arrival,
percentiles instead of single numbers. On a GPU every step ends with a synchronization
(``logits.cpu()`` inside sampling), so wall-clock times are honest.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import fields, replace
from typing import Any

import torch

from ..analysis.compare import dtype_name, shape_of
from ..analysis.roofline import measured_roof
from ..engine import Engine, EngineConfig, RequestOutput, SamplingParams
from ..hardware import measure_ceilings
from ..harness import env_metadata
from .baselines import default_contenders, make_workload, run_contender
from .engine_run import (
    Contender,
    DecodeSteps,
    EngineBenchmark,
    EngineRun,
    decode_steps,
    summarize_run,
)
from .ledger import copy_bandwidth, decode_step_bytes, engine_weight_bytes, kv_dtype_of, ledger_row
from .predicted import throughput_bound

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


def engine_step_bytes(lm: Any, engine: Engine, decode: DecodeSteps) -> int | None:
    """Bytes (:func:`~.ledger.decode_step_bytes`) of a mean pure decode step, at its mean batch and
    context, with the engine's weights and KV format; None without a KV cache (``nocache``
    recomputes instead of reading K/V)."""
    if engine.config.kv_mode == "nocache":
        return None
    return decode_step_bytes(lm, decode.mean_batch, decode.mean_context,
                             weight_bytes=engine_weight_bytes(lm, engine.model),
                             kv_dtype=kv_dtype_of(engine.model.dtype, engine.config.kv_dtype))


def engine_ledger(lm: Any, decode: DecodeSteps | None, tokens_per_s: float | None = None) -> dict[str, Any] | None:
    """:func:`~.ledger.ledger_row` of a run's decode steps at ``tokens_per_s`` (default: theirs); None
    without decode steps or their bytes. Measures the copy bandwidth on first use."""
    if decode is None or decode.step_bytes is None:
        return None
    return ledger_row(tokens_per_s or decode.tokens_per_s, decode.mean_batch, decode.step_bytes,
                      copy_bandwidth(lm.device))


def engine_config(max_model_len: int, decode_path: str = "auto", **switches: Any) -> EngineConfig:
    """The :class:`EngineConfig` of a benchmark: ``switches`` are its own fields, by their own names
    (``max_num_seqs``, ``chunked_prefill``, ``max_num_batched_tokens``, ``dtype``...), and
    ``decode_path`` names a preset of its decode switches (:data:`DECODE_PATHS`)."""
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(switches) - known)
    if unknown:
        raise ValueError(f"not an EngineConfig field: {', '.join(unknown)} (fields: {', '.join(sorted(known))})")
    return EngineConfig(max_model_len=max_model_len, **{**switches, **decode_path_config(decode_path)})


def warm_up_engine(lm: Any, config: EngineConfig, seed: int = 1) -> None:
    """One request, then two: batch 1 and batch > 1 are separate shapes to a compiler."""
    for n in (1, 2):
        Engine.from_loaded(lm, config).generate(
            workload(lm, n, 8, seed=seed), SamplingParams(max_tokens=3, ignore_eos=True)
        )


def timed_engine_run(
    lm: Any, config: EngineConfig, prompts: list[list[int]], output_lens: list[int],
    requested_path: str = "auto",
) -> tuple[EngineRun, list[RequestOutput]]:
    """Every request at t = 0 through a fresh engine (EOS ignored); its typed result and outputs.

    CUDA graphs are captured before the clock starts, as a server does at start-up."""
    engine = Engine.from_loaded(lm, config)
    runner = engine.decode_runner
    capture_s = runner.capture_all() if runner is not None and runner.use_cuda_graphs else None
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens]
    t0 = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    decode = decode_steps(engine, outputs)
    if decode is not None:
        decode = replace(decode, step_bytes=engine_step_bytes(lm, engine, decode))
    run = summarize_run(engine, outputs, elapsed, decode=decode, requested_path=requested_path,
                        graph_capture_s=capture_s)
    return run, outputs


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def run_engine_benchmark(
    lm: Any,
    requests: int = 16,
    prompt_len: int = 64,
    output_len: int = 32,
    *,
    shared_prefix_len: int = 0,
    output_lens: list[int] | None = None,
    seed: int = 0,
    warmup: bool = True,
    workload_kind: str = "uniform",
    decode_path: str = "auto",
    **switches: Any,
) -> EngineBenchmark:
    """Run ``requests`` random-prompt requests (EOS ignored) through a fresh engine; all arrive at t=0.

    Args:
        prompt_len, output_len: tokens per request (``output_lens`` overrides per request).
        workload_kind: ``uniform`` or ``mixed`` (seeded prompt and output lengths; see
            :func:`~infer_lab.bench.baselines.make_workload`).
        decode_path: ``auto``, ``per-sequence``, ``batched``, ``static`` or ``cuda-graphs``
            (see :data:`DECODE_PATHS`).
        switches: :class:`~infer_lab.engine.EngineConfig` fields by their own names, e.g.
            ``max_num_seqs`` (batch slots, default 16), ``policy``, ``prefix_cache``,
            ``chunked_prefill`` with ``max_num_batched_tokens``, ``kv_mode``, ``kv_dtype``,
            ``block_size``, ``fuse_projections``, ``prepack_weights``, ``compile_layers``,
            ``compiled_decode``, ``weight_quant``, ``dtype``. ``max_model_len`` is the longest
            request's.
    """
    _check_counts(requests=requests, prompt_len=prompt_len, output_len=output_len,
                  max_num_seqs=switches.get("max_num_seqs", 1))
    wl = make_workload(lm, workload_kind, requests, prompt_len, output_len, seed, shared_prefix_len)
    lens = output_lens or wl.output_lens
    if len(lens) != requests:
        raise ValueError("output_lens needs one entry per request")
    config = engine_config(max(len(p) for p in wl.prompts) + max(lens) + 1, decode_path, **switches)
    if warmup:
        warm_up_engine(lm, config, seed + 1)
    run, _ = timed_engine_run(lm, config, wl.prompts, lens, decode_path)
    return EngineBenchmark(
        run=run, config=config,
        workload={"kind": wl.describe(), "requests": requests, "prompt_len": prompt_len, "output_len": output_len,
                  "shared_prefix_len": shared_prefix_len, "seed": seed},
        output_tokens_per_s=run.output_tokens_per_s,
        decode_tokens_per_s=run.decode.tokens_per_s if run.decode else None,
        ledger=engine_ledger(lm, run.decode), engine_tokens_per_s_by_round=[run.output_tokens_per_s])


UNCOMPILED = "engine-uncompiled"  # the engine's own contender when compiled_decode is on

CONTENDER_LABELS = {  # each contender's name for people
    "hf-sequential": "HF generate, one at a time",
    "hf-padded": "HF padded batch",
    "hf-continuous": "HF continuous batching",
    "hf-padded-prepacked": "HF padded batch, prepacked GEMMs (not an HF feature)",
    "hf-compiled": "HF generate, static cache + torch.compile, one at a time",
    UNCOMPILED: "our engine without --compiled-decode",
}




def compare_with_hf(
    lm: Any,
    workload_kind: str = "uniform",
    requests: int = 16,
    prompt_len: int = 128,
    output_len: int = 64,
    rounds: int = 3,
    seed: int = 0,
    contenders: tuple[str, ...] | None = None,
    decode_path: str = "auto",
    **switches: Any,
) -> EngineBenchmark:
    """The engine against HF sequential, HF padded batch and HF continuous batching, interleaved.

    Every contender runs the same requests (same prompts, same output lengths, EOS ignored,
    greedy) with the engine's ``max_num_seqs`` as its batch. Each contender is warmed up once,
    then ``rounds`` rounds run every contender in turn (the order rotates), so a slow patch of
    the machine hits all of them. Reported throughput is the median over rounds; each
    :class:`Contender` says whether the engine's tokens equal its own, request by request. With
    ``compiled_decode`` in ``switches`` the same engine without it is one more contender
    (``engine-uncompiled``), and for one user on the uniform workload so is transformers
    compiled (``hf-compiled``: compiled against compiled). ``switches`` are
    :class:`~infer_lab.engine.EngineConfig` fields, as in :func:`run_engine_benchmark`.
    """
    _check_counts(requests=requests, prompt_len=prompt_len, output_len=output_len, rounds=rounds)
    wl = make_workload(lm, workload_kind, requests, prompt_len, output_len, seed)
    config = engine_config(max(len(p) for p in wl.prompts) + max(wl.output_lens) + 1, decode_path, **switches)
    slots = config.max_num_seqs
    names = ("engine", *(contenders or default_contenders(lm)))
    if contenders is None and config.compiled_decode and slots == 1 and workload_kind == "uniform":
        names += ("hf-compiled",)
    # With compiled_decode the same engine without it runs too, interleaved: what the compile buys.
    uncompiled = replace(config, compiled_decode=False) if config.compiled_decode else None
    if uncompiled is not None:
        names += (UNCOMPILED,)
        warm_up_engine(lm, uncompiled, seed + 1)
    small = make_workload(lm, workload_kind, 2, 8, 3, seed + 1)
    warm_up_engine(lm, config, seed + 1)
    for name in names[1:]:
        if name == "hf-compiled":  # compiles its graphs for the workload's own shapes, off the clock
            run_contender(name, lm, replace(wl, prompts=wl.prompts[:1], output_lens=wl.output_lens[:1]), slots)
        elif name != UNCOMPILED:
            run_contender(name, lm, small, slots)
    tokens_per_s: dict[str, list[float]] = {n: [] for n in names}
    engine_decode: list[float] = []  # the engine's decode tokens/s per round (the ledger's speed)
    outputs: dict[str, list[list[int]]] = {}
    engine_run: EngineRun | None = None
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if name in ("engine", UNCOMPILED):
                run, outs = timed_engine_run(lm, config if name == "engine" else uncompiled, wl.prompts,
                                             wl.output_lens, decode_path)
                tokens_per_s[name].append(run.output_tokens_per_s)
                if name == "engine":
                    engine_run = run
                    if run.decode is not None:
                        engine_decode.append(run.decode.tokens_per_s)
                outputs[name] = [o.token_ids for o in outs]
            else:
                contender_run = run_contender(name, lm, wl, slots)
                tokens_per_s[name].append(contender_run.tokens_per_s)
                outputs[name] = contender_run.outputs
    assert engine_run is not None  # rounds >= 1
    decode_median = statistics.median(engine_decode) if engine_decode else None
    roofline = None
    if workload_kind == "uniform":  # the bound assumes equal lengths: say how close the engine got
        roof = measured_roof(measure_ceilings(lm.device, quick=False))
        roofline = roofline_bounds(shape_of(lm), roof, requests, slots, prompt_len, output_len, dtype_name(lm))
    return EngineBenchmark(
        run=engine_run, config=config,
        workload={"kind": wl.describe(), "requests": requests, "prompt_len": prompt_len, "output_len": output_len,
                  "shared_prefix_len": 0, "seed": seed},
        output_tokens_per_s=statistics.median(tokens_per_s["engine"]), decode_tokens_per_s=decode_median,
        ledger=engine_ledger(lm, engine_run.decode, decode_median),  # the ledger at the median, as the tok/s beside it
        rounds=rounds, engine_tokens_per_s_by_round=tokens_per_s["engine"], decode_tokens_per_s_by_round=engine_decode,
        contenders=[Contender(n, tokens_per_s[n], outputs["engine"] == outputs[n]) for n in names[1:]],
        roofline=roofline)


def roofline_bounds(shape: Any, roof: Any, requests: int, max_num_seqs: int, prompt_len: int,
                    output_len: int, dtype: str) -> dict[str, dict[str, Any]]:
    """Three throughput bounds (:func:`~.predicted.throughput_bound`) for a uniform workload.

    ``roofline_bound``: the workload actually run, ``max_num_seqs`` requests at a time;
    ``roofline_bound_batch_1``: one request at a time; ``roofline_bound_batch_n``: all
    ``requests`` in one batch. A fraction of the first one is what the engine reached.
    """
    def bound(c: int) -> dict[str, Any]:
        return throughput_bound(shape, roof, requests, prompt_len, output_len, dtype, max_num_seqs=c)

    run = bound(max_num_seqs)
    one = run if max_num_seqs == 1 else bound(1)
    everyone = run if max_num_seqs >= requests else bound(requests)
    return {"roofline_bound": run, "roofline_bound_batch_1": one, "roofline_bound_batch_n": everyone}


def benchmark_with_metadata(lm: Any, compare_hf: bool = False, rounds: int = 3, **kwargs: Any) -> EngineBenchmark:
    """:func:`run_engine_benchmark`, or with ``compare_hf`` :func:`compare_with_hf` over ``rounds``;
    plus the threads, the copy bandwidth (when there is a ledger) and the environment."""
    if compare_hf:
        unused = sorted({"shared_prefix_len", "output_lens", "warmup"} & set(kwargs))
        if unused:
            raise ValueError(f"--compare-hf runs its own workloads: {', '.join(unused)} not supported")
        result = compare_with_hf(lm, rounds=rounds, **kwargs)
    else:
        result = run_engine_benchmark(lm, **kwargs)
    return replace(result, threads=torch.get_num_threads(), environment=env_metadata(lm),
                   copy_bandwidth=copy_bandwidth(lm.device).as_dict() if result.ledger is not None else None)
