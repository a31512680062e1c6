"""Every catalogued model side by side: KV per token and per user, parameters and weights."""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis import memory
from ...analysis.memory import as_shape
from ...analysis.params import param_counts
from ...catalog import list_models
from ..tables import Column, people_table


@dataclass(frozen=True)
class ModelMemoryRow:
    """One catalogued model: its KV per token and per user at ``context``, and its weights."""

    model: str
    attention: str
    layers: int
    kv_dtype: str
    context: int
    kv_bytes_per_token: int
    kv_bytes_per_user: int
    params_total: int
    params_active: int
    weight_dtype: str
    weight_bytes: int


def model_rows(context: int = 4096, kv_dtype: str = "bf16", weight_dtype: str = "bf16",
               models: list[str] | None = None) -> list[ModelMemoryRow]:
    """Every catalogued model (or ``models``) at the same context and dtypes."""
    rows = []
    for name in models or list_models():
        r = memory.kv_report(name, context=context, kv_dtype=kv_dtype)
        w = memory.weight_bytes(name, weight_dtype)
        rows.append(ModelMemoryRow(name, r.attention, r.layers, kv_dtype, context, r.kv_bytes_per_token,
                                   r.kv_bytes_per_user, w.params.total, w.params.active, weight_dtype, w.total))
    return rows


def models_notes(rows: list[ModelMemoryRow]) -> str:
    """What the model table's columns hide: sliding-window layers (KV per user below KV per token x
    context) and what "active parameters" of a mixture of experts counts (markdown, '' if nothing)."""
    notes = []
    for r in rows:
        full = r.kv_bytes_per_token * r.context
        if r.kv_bytes_per_user < full:
            rep = memory.kv_report(r.model, context=r.context, kv_dtype=r.kv_dtype)
            notes.append(f"- **{r.model}**: KV per user is {r.kv_bytes_per_user / full:.0%} of KV per token × "
                         f"{r.context:,} tokens, because {rep.sliding_window_layers} of its {r.layers} layers use a "
                         "sliding window and stop caching at the window; KV per token counts every layer.")
        if r.params_active < r.params_total:
            counts = param_counts(as_shape(r.model))
            notes.append(f"- **{r.model}**: its {r.params_active / 1e9:.2f} B active parameters count the embedding "
                         f"table ({counts.embeddings / 1e9:.2f} B) as if every row were used. A token reads one row "
                         f"of it, so without it the active count is {(r.params_active - counts.embeddings) / 1e9:.2f} B, "
                         "and model cards differ on whether they count it.")
    return "\n".join(notes)


MODEL_COLUMNS = [
    Column("model", "model", "text"), Column("attention", "attention", "text"), Column("layers", "layers", "int"),
    Column("kv_bytes_per_token", "KV per token (B)", "int"), Column("kv_bytes_per_user", "KV per user", "bytes"),
    Column("params_total", "parameters", "int"), Column("params_active", "active parameters", "int"),
    Column("weight_bytes", "weights", "bytes"),
]


def models_table(rows: list[ModelMemoryRow]):
    return people_table(rows, MODEL_COLUMNS)
