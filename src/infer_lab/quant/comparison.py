"""Measure quantization methods on the same axes: exact weight bytes, decode speed, quality.

Used by ``infer-lab quantize``, chapter 06 and the GPU checks. Quality is perplexity on the
shipped evaluation text and top-1 next-token agreement with the unquantized model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..evaluation import (
    eval_token_ids,
    heldout_prompts,
    next_token_predictions,
    perplexity,
    top1_agreement,
)
from ..harness import env_metadata, measure_generation, summarize
from ..models import LoadedModel
from .kernels import kernel_linears
from .quantize_model import quantize_lm
from .stored_bytes import model_weight_bytes

REFERENCE_KERNEL = "dequantize + F.linear (the reference)"


def _prompts(lm: LoadedModel, tokens_each: int) -> list[torch.Tensor]:
    if lm.tokenizer is None:
        return [lm.random_ids(1, tokens_each, seed=s) for s in range(4)]
    return heldout_prompts(lm.tokenizer, tokens_each)


def decode_tokens_per_s(
    lm: LoadedModel, new_tokens: int = 16, repeats: int = 3, prompt_len: int = 32, warmup: int = 1
) -> float:
    """Median single-sequence decode rate (1 / median inter-token latency), after ``warmup`` runs.

    ``warmup=0`` is honest only when the model has just run at least once (the quality passes
    of :func:`compare_methods` run first).
    """
    ids = lm.random_ids(1, prompt_len)
    rows = measure_generation(lm, ids, max(new_tokens, 2), warmup=warmup, repeats=repeats)
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
    speed_warmup: int = 1,
) -> dict[str, Any]:
    """Baseline plus one row per method: ``weight_bytes``, ``decode_tokens_per_s`` (and the
    ``decode_kernel`` that ran it), ``top1_agreement``,
    ``perplexity`` (with ``evaluate``) and the per-layer error summary; ``layers`` holds every
    layer's error statistics per method (``layer_stats=False`` skips them, saving a dequantization).

    ``eval_tokens`` of the evaluation text are scored in windows of ``eval_window`` tokens.
    Each model's decode is timed after its quality passes, with ``speed_warmup`` more warm-ups.
    """
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
    if ids is not None:
        log(f"perplexity of the unquantized model on {ids.numel()} tokens")
        ppl = perplexity(lm.model, ids, window=eval_window)
        baseline.update(perplexity=ppl.perplexity, eval_scored_tokens=ppl.scored_tokens)
    if measure_speed:
        log("timing the unquantized decode")
        baseline["decode_tokens_per_s"] = decode_tokens_per_s(lm, new_tokens, repeats, warmup=speed_warmup)
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
        if ids is not None:
            ppl = perplexity(qlm.model, ids, window=eval_window)
            row.update(
                perplexity=ppl.perplexity,
                eval_scored_tokens=ppl.scored_tokens,
                perplexity_change=ppl.perplexity / baseline["perplexity"] - 1,
            )
        if measure_speed:
            # Timed through PyTorch's fused kernel where one takes these codes (int8, int4, Q4_1
            # on a CPU): the reference dequantizes the whole matrix every call and would time that.
            with kernel_linears(qlm.model) as used:
                # the quality passes ran the reference, not the kernel: warm the kernel up too
                warm = max(speed_warmup, 1) if used else speed_warmup
                row["decode_tokens_per_s"] = decode_tokens_per_s(qlm, new_tokens, repeats, warmup=warm)
            row["decode_kernel"] = used[0] if used else REFERENCE_KERNEL
        rows.append(row)
        del qlm, report
    return {
        "baseline": baseline,
        "methods": rows,
        "layers": layers,
        "environment": env_metadata(lm),
    }
