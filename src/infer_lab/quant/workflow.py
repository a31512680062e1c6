"""Measure quantization methods on the same axes: exact weight bytes, decode speed, quality.

Used by ``infer-lab quantize``, the tour step and notebook 05. Quality is perplexity on the
shipped evaluation text and top-1 next-token agreement with the unquantized model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..models import LoadedModel


def _prompts(lm: LoadedModel, tokens_each: int) -> list[torch.Tensor]:
    from ..evaluation import heldout_prompts

    if lm.tokenizer is None:
        return [lm.random_ids(1, tokens_each, seed=s) for s in range(4)]
    return heldout_prompts(lm.tokenizer, tokens_each)


def decode_tokens_per_s(
    lm: LoadedModel, new_tokens: int = 16, repeats: int = 3, prompt_len: int = 32
) -> float:
    """Median single-sequence decode rate (1 / median inter-token latency), after one warm-up."""
    from ..harness import measure_generation, summarize

    ids = lm.random_ids(1, prompt_len)
    rows = measure_generation(lm, ids, max(new_tokens, 2), warmup=1, repeats=repeats)
    return 1e3 / summarize([r["itl_ms_p50"] for r in rows]).p50


def compare_methods(
    lm: LoadedModel,
    methods: list[str],
    evaluate: bool = True,
    eval_tokens: int = 1024,
    eval_window: int = 256,
    eval_file: str | None = None,
    new_tokens: int = 16,
    repeats: int = 3,
    prompt_tokens: int = 64,
    measure_speed: bool = True,
    layer_stats: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Baseline plus one row per method: ``weight_bytes``, ``decode_tokens_per_s``, ``top1_agreement``,
    ``perplexity`` (with ``evaluate``) and the per-layer error summary; ``layers`` holds every
    layer's error statistics per method (``layer_stats=False`` skips them, saving a dequantization).

    ``eval_tokens`` of the evaluation text are scored in windows of ``eval_window`` tokens.
    """
    from ..evaluation import eval_token_ids, next_token_predictions, perplexity, top1_agreement
    from ..harness import env_metadata
    from .model import model_weight_bytes, quantize_lm

    log = log or (lambda _msg: None)
    if evaluate and lm.tokenizer is None:
        raise ValueError(
            f"{lm.name} has random weights and no tokenizer: perplexity needs real weights "
            "(drop --eval, or use the embedded smollm2-135m)"
        )
    prompts = _prompts(lm, prompt_tokens)
    reference = next_token_predictions(lm.model, prompts)
    ids = eval_token_ids(lm.tokenizer, eval_tokens, eval_file) if evaluate else None
    baseline: dict[str, Any] = {
        "method": str(lm.dtype).replace("torch.", ""),
        "weight_bytes": model_weight_bytes(lm.model),
        "top1_agreement": 1.0,
    }
    if measure_speed:
        log("timing the unquantized decode")
        baseline["decode_tokens_per_s"] = decode_tokens_per_s(lm, new_tokens, repeats)
    if ids is not None:
        log(f"perplexity of the unquantized model on {ids.numel()} tokens")
        ppl = perplexity(lm.model, ids, window=eval_window)
        baseline.update(perplexity=ppl.perplexity, eval_scored_tokens=ppl.scored_tokens)
    rows = []
    layers: dict[str, list[dict[str, Any]]] = {}
    for method in methods:
        log(f"quantizing with {method}")
        kwargs = {} if method.startswith("bnb-") else {"error_stats_per_layer": layer_stats}
        qlm, report = quantize_lm(lm, method, **kwargs)
        row: dict[str, Any] = {
            "method": report.method,
            "weight_bytes": report.weight_bytes,
            "compression": report.weight_bytes_unquantized / report.weight_bytes,
            "top1_agreement": top1_agreement(reference, next_token_predictions(qlm.model, prompts)),
        }
        if report.layers and "rel_fro" in report.layers[0]:
            layers[report.method] = report.layers
            errors = [layer["rel_fro"] for layer in report.layers]
            row.update(
                layer_rel_error_mean=sum(errors) / len(errors), layer_rel_error_max=max(errors)
            )
        if measure_speed:
            row["decode_tokens_per_s"] = decode_tokens_per_s(qlm, new_tokens, repeats)
        if ids is not None:
            ppl = perplexity(qlm.model, ids, window=eval_window)
            row.update(
                perplexity=ppl.perplexity,
                eval_scored_tokens=ppl.scored_tokens,
                perplexity_change=ppl.perplexity / baseline["perplexity"] - 1,
            )
        rows.append(row)
        del qlm, report
    return {
        "baseline": baseline,
        "methods": rows,
        "layers": layers,
        "environment": env_metadata(lm),
    }


def weight_read_explanation(
    out_features: int, in_features: int, times_s: dict[str, float], bandwidth_Bps: float
) -> list[dict[str, Any]]:
    """Why a quantized linear can be slower at batch 1: bytes it must read vs the time it took.

    At batch 1 a linear layer is a matrix-vector product: its floor is reading the weight once,
    ``bytes / bandwidth``. ``times_s`` maps a format (``bf16``, ``int8``, ``nf4``) to a measured
    time; the row shows the floor, the measured time and the bandwidth achieved. A format that
    reads half the bytes but achieves a tenth of the bandwidth is limited by its extra work
    (activation quantization, outlier split, dequantization, several kernel launches), not by memory.
    """
    bits = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "nf4": 4, "int4": 4}
    rows = []
    for fmt, seconds in times_s.items():
        if fmt not in bits:
            raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(bits)}")
        nbytes = out_features * in_features * bits[fmt] // 8
        floor = nbytes / bandwidth_Bps
        rows.append(
            {
                "format": fmt,
                "weight_bytes": nbytes,
                "memory_floor_s": floor,
                "measured_s": seconds,
                "achieved_Bps": nbytes / seconds,
                "measured_over_floor": seconds / floor,
            }
        )
    return rows
