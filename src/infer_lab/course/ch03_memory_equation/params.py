"""Where the parameters are, and what the weights weigh in each storage format."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from ...analysis import memory
from ...analysis.memory import ModelLike, as_shape
from ...analysis.params import param_counts
from ..tables import Column, people_table

# The planner's defaults, read from the functions that apply them (one source for the words and the numbers).
KEPT_DTYPE: str = inspect.signature(memory.weight_bytes).parameters["keep_dtype"].default


@dataclass(frozen=True)
class ParamRow:
    component: str
    parameters: int


@dataclass(frozen=True)
class WeightFormatRow:
    """The weights of one model in one storage format; the KV per token does not change with it."""

    dtype: str
    bits_per_weight: float  # matmul weights, scales included
    scales: str
    weight_bytes: int
    kv_bytes_per_token_bf16: int


def param_rows(model: ModelLike) -> list[ParamRow]:
    """Parameters by component (exact: tests compare them with a meta-device build)."""
    counts = param_counts(as_shape(model)).as_dict()
    return [ParamRow(k, v) for k, v in counts.items()]


def weight_format_rows(model: ModelLike) -> list[WeightFormatRow]:
    """The model's weights in every format; the KV cache (bf16) is the same in each."""
    shape = as_shape(model)
    kv = memory.kv_bytes_per_token(shape, "bf16")
    return [WeightFormatRow(name, fmt.bits_per_element, fmt.note or "none (plain floats)", memory.weight_bytes(shape, name).total, kv)
            for name, fmt in memory.WEIGHT_FORMATS.items()]


def kept_dtype_text(keep_dtype: str = KEPT_DTYPE) -> str:
    """What a quantized format leaves unquantized (:func:`infer_lab.analysis.memory.weight_bytes`)."""
    return (f"the embeddings, the LM head and the norms stay in {keep_dtype} (a released quantized checkpoint can "
            "keep more, as its config's `modules_to_not_convert` lists)")


PARAM_COLUMNS = [Column("component", "component", "text"), Column("parameters", "parameters", "int")]
WEIGHT_FORMAT_COLUMNS = [
    Column("dtype", "weight dtype", "text"), Column("bits_per_weight", "bits per weight (matmuls)"),
    Column("scales", "scales", "text"), Column("weight_bytes", "weights", "bytes"),
    Column("kv_bytes_per_token_bf16", "KV per token, bf16 KV (B)", "int"),
]


def params_table(rows: list[ParamRow]):
    return people_table(rows, PARAM_COLUMNS)


def weight_formats_table(rows: list[WeightFormatRow]):
    return people_table(rows, WEIGHT_FORMAT_COLUMNS)
