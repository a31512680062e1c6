"""Part 7 of chapter 07: decode time vs KV heads, the roofline prediction (analytic)."""

from __future__ import annotations

from ...attention.kv_sizing import PredictedDecode, decode_time_vs_kv_heads
from ..tables import Column, people_table
from .scenario import DEFAULT_CONTEXT


def decode_prediction(gpu: str = "H200", context: int = DEFAULT_CONTEXT) -> list[PredictedDecode]:
    return decode_time_vs_kv_heads("mistral-7b", gpu, context=context)


PREDICTED_COLUMNS = [
    Column("kv_heads", "KV heads", "int"), Column("context", "context (tokens)", "int"),
    Column("kv_read_bytes", "KV read per step", "bytes"), Column("bytes", "all bytes per step", "bytes"),
    Column("step_s", "step (ms)", scale=1e3), Column("tokens_per_s", "tokens/s"),
]


def prediction_table(rows: list[PredictedDecode]):
    return people_table(rows, PREDICTED_COLUMNS)
