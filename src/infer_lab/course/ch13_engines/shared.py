"""What both measured parts share: the load the clients measured, the model served, the latency columns."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...models import EMBEDDED_NAME, load_model
from ..tables import Column


@dataclass(frozen=True)
class ServedLoad:
    """What the clients measured at one load level (pooled over repeats): ms, and rates per second.

    The field names are :mod:`infer_lab.loadgen`'s, so a list of these is a loadgen ``pooled``
    table (see :func:`as_loadgen_results`).
    """

    point: str
    load: float
    concurrency: int
    completed: int
    failed: int
    output_tokens_per_s: float | None
    request_throughput_per_s: float | None
    tokens_per_s_per_user: float | None  # 1000 / TPOT p50
    goodput_per_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p90: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p90: float | None
    itl_ms_p99: float | None
    tpot_ms_p50: float | None
    tpot_ms_p90: float | None
    tpot_ms_p99: float | None
    e2e_ms_p50: float | None
    e2e_ms_p90: float | None
    e2e_ms_p99: float | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ServedLoad:
        return cls(**{f.name: row.get(f.name) for f in dataclasses.fields(cls)})


_EMBEDDED: dict[str, Any] = {}  # the fallback model, loaded once per device


def servable_model(lm: Any) -> tuple[Any, str]:
    """The model to serve and, when it is not ``lm``, a sentence saying why.

    The server speaks text (chat and completions with a tokenizer). A model without one (random
    weights of a vocabulary no tokenizer here matches, which is a GPU's default) is replaced by
    the embedded SmolLM2-135M on the same device: the engines are compared on the same workload,
    and the absolute numbers are the small model's.
    """
    if lm.tokenizer is not None:
        return lm, ""

    key = str(lm.device)
    if key not in _EMBEDDED:
        _EMBEDDED[key] = load_model(EMBEDDED_NAME, device=lm.device)
    served = _EMBEDDED[key]
    return served, (f"**Served instead of {lm.name}:** {served.describe()}. {lm.name} has random weights and no "
                    "tokenizer, and the server takes text, so this part serves the embedded model: the variants "
                    "are compared on the same workload, and the absolute numbers are the small model's. Pick a "
                    "pretrained model to serve it instead.")


_LATENCY = [
    Column("ttft_ms_p50", "TTFT p50 (ms)"), Column("ttft_ms_p99", "TTFT p99 (ms)"),
    Column("itl_ms_p50", "ITL p50 (ms)"), Column("itl_ms_p99", "ITL p99 (ms)"),
    Column("tpot_ms_p50", "TPOT p50 (ms)"), Column("e2e_ms_p50", "E2E p50 (ms)"),
]
