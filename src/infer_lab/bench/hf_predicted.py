"""Predicted vs measured for HF transformers on this machine: the memory equation and the roofline
against the harness (the engine's counterpart is :mod:`infer_lab.bench.predicted`).

The prediction uses the ceilings measured here (copy bandwidth, matmul FLOP/s), not a datasheet,
so the gap that remains is the software's: kernel-launch and Python overhead per op, GEMV
efficiency far below the large-matmul peak, and the attention implementation. The analytic side
(rows, their reading) is :mod:`infer_lab.analysis.compare`, which measures nothing.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.compare import comparison_row, dtype_name, shape_of
from ..analysis.memory import kv_bytes, weight_bytes
from ..analysis.roofline import Roof, measured_roof, predict_decode, predict_prefill
from ..hardware import measure_ceilings
from ..harness import env_metadata, measure_generation, summarize
from ..units import require_positive


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
    require_positive("new_tokens", new_tokens)
    require_positive("repeats", repeats)
    if new_tokens < 2:
        raise ValueError("new_tokens must be >= 2 so that decode steps are timed")
    shape = shape_of(lm)
    dtype = dtype_name(lm)
    roof = roof or measured_roof(measure_ceilings(lm.device, quick=quick))
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype, logits="all")
    common = {"model": lm.name, "dtype": dtype, "device": roof.name}
    rows = [comparison_row("weight bytes", "B", weight_bytes(shape, dtype).total, lm.weight_bytes, **common)]

    for n in prompt_lengths:
        require_positive("prompt length", n)
        measured = measure_generation(
            lm, lm.random_ids(1, n), new_tokens=1, warmup=1, repeats=repeats
        )
        ttft_ms = summarize([r["ttft_ms"] for r in measured]).p50
        pred = predict_prefill(shape, roof, 1, n, **kw)
        rows.append(
            comparison_row(
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
                comparison_row(
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
                comparison_row(
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


def results_payload(rows: list[dict[str, Any]], lm: Any, roof: Roof) -> dict[str, Any]:
    """A JSON-ready record of a comparison, with where it was measured (for ``infer_lab/results``)."""
    return {
        "kind": "predicted_vs_measured",
        "environment": env_metadata(lm),
        "roof": roof.as_dict(),
        "rows": rows,
    }


def save_results(rows: list[dict[str, Any]], lm: Any, roof: Roof, folder: Any) -> Any:
    """Write :func:`results_payload` as ``predicted_vs_measured-<device>-<date>.json`` in ``folder``; return the path."""
    payload = results_payload(rows, lm, roof)
    device = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(payload["environment"]["device_name"]))
    path = Path(folder) / f"predicted_vs_measured-{device}-{datetime.date.today().isoformat()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return path
