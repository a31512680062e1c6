"""Predicted vs measured on this machine: the memory equation and the roofline against the harness.

The prediction uses the ceilings measured here (copy bandwidth, matmul FLOP/s), not a datasheet,
so the gap that remains is the software's: kernel-launch and Python overhead per op, GEMV
efficiency far below the large-matmul peak, and the attention implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..shape import ModelShape, model_shape
from ..units import require_positive
from .memory import kv_bytes, weight_bytes
from .roofline import Roof, measured_roof, predict_decode, predict_prefill

TORCH_DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def shape_of(lm: Any) -> ModelShape:
    """The :class:`ModelShape` of a loaded model, from its live transformers config."""
    cfg = lm.model.config.to_dict()
    cfg.setdefault("_infer_lab", {})["name"] = lm.name
    return model_shape(cfg)


def dtype_name(lm: Any) -> str:
    """``'fp32'``, ``'bf16'`` or ``'fp16'`` for a loaded model's dtype."""
    key = str(lm.dtype)
    if key not in TORCH_DTYPE_NAMES:
        raise ValueError(f"no analytic format for {key}; use fp32, bf16 or fp16")
    return TORCH_DTYPE_NAMES[key]


def _row(
    quantity: str, unit: str, predicted: float, measured: float, **extra: Any
) -> dict[str, Any]:
    row = {
        "quantity": quantity,
        "unit": unit,
        "predicted": predicted,
        "measured": measured,
        "measured_over_predicted": measured / predicted if predicted else None,
    }
    row.update(extra)
    return row


def predicted_vs_measured(
    lm: Any,
    prompt_lengths: Sequence[int] = (8, 32, 128),
    contexts: Sequence[int] = (16, 128),
    batches: Sequence[int] = (1, 4),
    new_tokens: int = 6,
    repeats: int = 1,
    roof: Roof | None = None,
    quick: bool = True,
) -> list[dict[str, Any]]:
    """Tidy rows of predicted vs measured for a loaded model on its own device.

    Quantities: weight bytes (analytic vs the parameters), KV bytes (analytic vs the cache
    tensors after a generation), prefill time per prompt length, decode step time per context
    and batch. Times are p50 in ms; the roof defaults to :func:`measure_ceilings` of the model's
    device. Each row has ``measured_over_predicted``; prediction rows also carry the step's
    FLOPs, bytes and intensity so they can be placed on a roofline.
    """
    from ..hardware import measure_ceilings
    from ..harness import measure_generation, summarize

    require_positive("new_tokens", new_tokens)
    require_positive("repeats", repeats)
    if new_tokens < 2:
        raise ValueError("new_tokens must be >= 2 so that decode steps are timed")
    shape = shape_of(lm)
    dtype = dtype_name(lm)
    roof = roof or measured_roof(measure_ceilings(lm.device, quick=quick))
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype, logits="all")
    common = {"model": lm.name, "dtype": dtype, "device": roof.name}
    rows = [_row("weight bytes", "B", weight_bytes(shape, dtype).total, lm.weight_bytes, **common)]

    for n in prompt_lengths:
        require_positive("prompt length", n)
        measured = measure_generation(
            lm, lm.random_ids(1, n), new_tokens=1, warmup=1, repeats=repeats
        )
        ttft_ms = summarize([r["ttft_ms"] for r in measured]).p50
        pred = predict_prefill(shape, roof, 1, n, **kw)
        rows.append(
            _row(
                "prefill time",
                "ms",
                pred.time_s * 1e3,
                ttft_ms,
                batch=1,
                prompt_len=n,
                context=n,
                flops=pred.flops,
                bytes=pred.bytes,
                intensity=pred.intensity,
                phase="prefill",
                **common,
            )
        )

    for context in contexts:
        for batch in batches:
            require_positive("context", context)
            require_positive("batch", batch)
            measured = measure_generation(
                lm, lm.random_ids(batch, context), new_tokens=new_tokens, warmup=1, repeats=repeats
            )
            itl_ms = float(np.median([r["itl_ms_p50"] for r in measured]))
            # The timed steps attend context+1 .. context+new_tokens-1 tokens; predict the middle one.
            mid = context + new_tokens // 2
            pred = predict_decode(shape, roof, batch, mid, **kw)
            rows.append(
                _row(
                    "decode step time",
                    "ms",
                    pred.time_s * 1e3,
                    itl_ms,
                    batch=batch,
                    context=mid,
                    flops=pred.flops,
                    bytes=pred.bytes,
                    intensity=pred.intensity,
                    phase="decode",
                    **common,
                )
            )
            cached = context + new_tokens - 1  # the last sampled token is never fed back
            rows.append(
                _row(
                    "KV bytes",
                    "B",
                    kv_bytes(shape, cached, batch, dtype),
                    measured[-1]["kv_bytes"],
                    batch=batch,
                    context=cached,
                    **common,
                )
            )
    return rows


def explain_gaps(rows: list[dict[str, Any]]) -> list[str]:
    """Plain-language reading of the ratios in ``rows`` (computed, not asserted)."""
    out = []
    by = {}
    for r in rows:
        by.setdefault(r["quantity"], []).append(r)
    for q in ("weight bytes", "KV bytes"):
        if q in by:
            worst = max(abs(r["measured_over_predicted"] - 1) for r in by[q])
            out.append(
                f"{q}: analytic and measured agree within {100 * worst:.2f}%"
                + (" (the equation is exact)." if worst < 0.01 else ": check the config parsing.")
            )
    for q, why in (
        (
            "prefill time",
            "small prompts cannot fill the matmul units, and every op pays a fixed "
            "launch/Python cost that the roofline does not count",
        ),
        (
            "decode step time",
            "a decode step is hundreds of small GEMV-shaped ops; each pays a fixed "
            "per-op overhead and reaches a fraction of the copy bandwidth",
        ),
    ):
        if q in by:
            ratios = [r["measured_over_predicted"] for r in by[q]]
            out.append(
                f"{q}: measured is {min(ratios):.1f}x to {max(ratios):.1f}x the roofline prediction; {why}."
            )
    return out


def results_payload(rows: list[dict[str, Any]], lm: Any, roof: Roof) -> dict[str, Any]:
    """A JSON-ready record of a comparison, with where it was measured (for ``assets/results``)."""
    from ..harness import env_metadata

    return {
        "kind": "predicted_vs_measured",
        "environment": env_metadata(lm),
        "roof": roof.as_dict(),
        "rows": rows,
    }


def save_results(rows: list[dict[str, Any]], lm: Any, roof: Roof, folder: Any) -> Any:
    """Write :func:`results_payload` as ``predicted_vs_measured-<device>-<date>.json`` in ``folder``; return the path."""
    import datetime
    import json
    import re
    from pathlib import Path

    payload = results_payload(rows, lm, roof)
    device = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(payload["environment"]["device_name"]))
    path = Path(folder) / f"predicted_vs_measured-{device}-{datetime.date.today().isoformat()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path


def saved_baseline_vs_roofline(saved: dict[str, Any]) -> list[dict[str, Any]]:
    """Predicted vs measured for a saved HF-baseline GPU run (``assets/results/*hf-baseline*.json``).

    The roof is the ceilings measured in that same run (copy bandwidth, bf16 matmul); the
    measurements are the saved TTFT and decode-step times of HF eager transformers. Rows carry
    the ratio, so the gap (kernel launches dominate the eager decode step) is a computed number.
    """
    data = saved["data"]
    roof = Roof(f"{saved['environment']['device_name']} (measured in that run)",
                data["bf16_matmul_TFLOPs"] * 1e12, data["copy_TBps"] * 1e12, "measured")
    model = saved["model"]
    rows = []
    for r in data["ctx_sweep"]:
        pre = predict_prefill(model, roof, 1, r["ctx"])
        dec = predict_decode(model, roof, 1, r["ctx"])
        rows.append(_row("TTFT (prefill)", "ms", pre.time_s * 1e3, r["ttft_ms"], batch=1, context=r["ctx"]))
        rows.append(_row("decode step (ITL)", "ms", dec.time_s * 1e3, r["itl_ms"], batch=1, context=r["ctx"]))
    for r in data["batch_sweep"]:
        dec = predict_decode(model, roof, r["batch"], 512)
        rows.append(_row("decode step (ITL)", "ms", dec.time_s * 1e3, r["step_ms"], batch=r["batch"], context=512))
    return rows
