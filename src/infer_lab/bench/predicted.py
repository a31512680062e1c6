"""Predicted vs measured for the engine: the roofline's decode step time next to the engine's own.

The prediction is :func:`infer_lab.analysis.roofline.predict_decode` on the ceilings measured on
this machine (copy bandwidth and matmul FLOP/s), so what remains between the two columns is the
engine's software: Python and per-op overhead, GEMV efficiency, the gather of paged K/V.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ..analysis.compare import dtype_name, shape_of
from ..analysis.roofline import Roof, measured_roof, predict_decode, predict_prefill
from ..engine import Engine, EngineConfig, SamplingParams
from ..hardware import measure_ceilings
from ..units import require_positive

GPU_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_CPU_BATCHES = (1, 2, 4, 8, 16)
CPU_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def default_batches(lm: Any, quick: bool) -> tuple[int, ...]:
    """Batch sizes for the comparison: 1..256 on a GPU, 1..16 (quick) or 1..64 on a CPU."""
    if lm.device.type == "cuda":
        return GPU_BATCHES
    return QUICK_CPU_BATCHES if quick else CPU_BATCHES


def decode_step_predicted_vs_measured(
    lm: Any,
    batches: Sequence[int] | None = None,
    prompt_len: int = 32,
    decode_steps: int = 8,
    roof: Roof | None = None,
    quick: bool = True,
) -> list[dict[str, Any]]:
    """Tidy rows: the analytic decode step time and the engine's measured one, per batch size.

    For each batch ``b`` a fresh engine (paged KV, continuous batching, ``b`` slots) prefills
    ``b`` random prompts of ``prompt_len`` tokens together, then decodes ``decode_steps`` tokens
    each (EOS ignored), after a warm-up run of the same shape. The measured time is the median
    wall time of the steps that decoded all ``b`` sequences and prefilled nothing (the engine
    synchronizes every step when it reads the sampled tokens). The prediction is for ``b``
    sequences at the middle context of those steps, with the model's dtype and only the
    next-token logits (as the engine computes them).

    Args:
        lm: a loaded model (:func:`infer_lab.models.load_model`).
        batches: batch sizes (sequences); default :func:`default_batches`.
        prompt_len: prompt tokens per sequence.
        decode_steps: decode steps timed per batch size (>= 2).
        roof: the ceilings to predict on; default the ceilings measured on ``lm``'s device.
        quick: passed to :func:`infer_lab.hardware.measure_ceilings` when ``roof`` is None.
    Returns:
        One row per batch: ``batch``, ``context`` (tokens), ``predicted_ms``, ``measured_ms``,
        ``measured_over_predicted``, ``predicted_bound``, ``flops``, ``bytes``, ``steps_timed``,
        ``model``, ``dtype``, ``roof``.
    """
    require_positive("prompt_len", prompt_len)
    if decode_steps < 2:
        raise ValueError(f"decode_steps must be >= 2, got {decode_steps}")
    batches = tuple(batches) if batches is not None else default_batches(lm, quick)
    if not batches:
        raise ValueError("batches must name at least one batch size")
    for b in batches:
        require_positive("batch", b)
    if roof is None:
        roof = measured_roof(measure_ceilings(lm.device, quick=quick))
    shape, dtype = shape_of(lm), dtype_name(lm)
    params = SamplingParams(max_tokens=decode_steps + 1, ignore_eos=True)
    rows = []
    for b in batches:
        config = EngineConfig(
            max_num_seqs=b,
            max_model_len=prompt_len + decode_steps + 2,
            max_num_batched_tokens=max(512, b * prompt_len),
        )
        prompts = lm.random_ids(b, prompt_len, seed=b).cpu().tolist()
        Engine.from_loaded(lm, config).generate(prompts, params)  # warm-up at the same shapes
        engine = Engine.from_loaded(lm, config)
        if engine.decode_runner is not None:  # on a GPU: capture the graphs before timing
            engine.decode_runner.capture_all()
        engine.generate(prompts, params)
        decode = [
            r.duration_s
            for r in engine.step_log
            if r.prefill_tokens == 0 and r.decode_tokens == b and not r.failed
        ]
        if not decode:
            raise RuntimeError(f"no pure decode step of batch {b} was recorded")
        # Decode step i (0-based) feeds the token at position prompt_len + i.
        context = prompt_len + 1 + len(decode) // 2
        pred = predict_decode(
            shape,
            roof,
            b,
            context,
            weight_dtype=dtype,
            kv_dtype=dtype,
            act_dtype=dtype,
            logits="last",
        )
        measured_ms = statistics.median(decode) * 1e3
        predicted_ms = pred.time_s * 1e3
        rows.append(
            {
                "batch": b,
                "context": context,
                "predicted_ms": predicted_ms,
                "measured_ms": measured_ms,
                "measured_over_predicted": measured_ms / predicted_ms,
                "predicted_bound": pred.bound,
                "flops": pred.flops,
                "bytes": pred.bytes,
                "steps_timed": len(decode),
                "model": lm.name,
                "dtype": dtype,
                "roof": roof.name,
            }
        )
    return rows


def throughput_bound(
    model: Any,
    roof: Roof,
    requests: int,
    prompt_len: int,
    output_len: int,
    dtype: str = "bf16",
    max_num_seqs: int | None = None,
) -> dict[str, Any]:
    """The most output tokens/s any engine could reach on ``roof`` for one uniform workload.

    ``requests`` prompts of ``prompt_len`` tokens arrive together and each generates
    ``output_len`` tokens, at most ``max_num_seqs`` of them at a time (the engine's batch slots; default: all of them).
    They run in waves of ``min(max_num_seqs, left)`` requests: one prefill of the wave's prompts
    (its last position gives the first token), then ``output_len - 1`` decode steps of the whole
    wave, each at its growing context. With ``max_num_seqs=1`` that is one user at a time, the
    batch-1 bound; with ``max_num_seqs >= requests``, one batch of all. Every op runs exactly at
    the roof (no launch gaps, perfect kernels), so a measured run can only be slower.

    Returns seconds for ``prefill_s``, ``decode_s``, ``total_s`` (all waves together),
    ``output_tokens_per_s``, and ``max_num_seqs`` and ``waves``.
    """
    max_num_seqs = requests if max_num_seqs is None else max_num_seqs
    for name, value in (
        ("requests", requests),
        ("prompt_len", prompt_len),
        ("output_len", output_len),
        ("max_num_seqs", max_num_seqs),
    ):
        require_positive(name, value)
    kw = {"weight_dtype": dtype, "kv_dtype": dtype, "act_dtype": dtype, "logits": "last"}
    waves = [min(max_num_seqs, requests - start) for start in range(0, requests, max_num_seqs)]
    prefill_s = prefill_flops = decode_s = 0.0
    for batch in sorted(set(waves)):  # equal waves cost the same: predict each size once
        count = waves.count(batch)
        prefill = predict_prefill(model, roof, batch, prompt_len, **kw)
        prefill_s += count * prefill.time_s
        prefill_flops += count * prefill.flops
        decode_s += count * sum(
            predict_decode(model, roof, batch, prompt_len + i + 1, **kw).time_s
            for i in range(output_len - 1)
        )
    total = prefill_s + decode_s
    return {
        "requests": requests,
        "max_num_seqs": min(max_num_seqs, requests),
        "waves": len(waves),
        "prompt_len": prompt_len,
        "output_len": output_len,
        "roof": roof.name,
        "prefill_s": prefill_s,
        "prefill_flops": prefill_flops,
        "decode_s": decode_s,
        "total_s": total,
        "output_tokens_per_s": requests * output_len / total,
    }
