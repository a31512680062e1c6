"""Part 5 of chapter 07: beyond KV caches, constant-state architectures and DSA's sparse reads (analytic)."""

from __future__ import annotations

from ...attention.kv_sizing import (
    DSA_TOP_K,
    SparseRead,
    StateSize,
    constant_state_models,
    dsa_read_per_step,
)
from ...units import fmt_bytes
from ..tables import Column, people_table
from .scenario import DEFAULT_CONTEXT

DSA_TOP_K_RANGE = (256, 16384, 256)  # the top-k control of part 5 (tokens): min, max, step


def dsa_reads(context: int = DEFAULT_CONTEXT, model: str = "mistral-7b", top_k: int = DSA_TOP_K) -> list[SparseRead]:
    """A DSA decode step's reads at ``context`` and at twice it (Mistral-7B's widths by default), the main
    attention reading the KV of ``top_k`` tokens."""
    return [dsa_read_per_step(model, c, top_k) for c in (context, 2 * context)]


def dsa_text(reads: list[SparseRead]) -> str:
    """Whether a DSA decode step's reads grow with the context, from :func:`dsa_reads`, with the assumption."""
    a, b = reads[0], reads[-1]
    grows = b.bytes_read > a.bytes_read
    return (f"**DSA per decode step:** the indexer reads one {a.indexer_key_dim}-value key of "
            f"{a.indexer_bytes_per_element} B per value for every cached token in each of {a.layers} layers, "
            f"{fmt_bytes(a.indexer_bytes_per_token)} per token, and the main attention reads the KV of at most "
            f"{a.top_k:,} tokens. At {a.context:,} tokens a step reads {fmt_bytes(a.bytes_read)} "
            f"({fmt_bytes(a.top_k_kv_bytes)} of top-k KV, {fmt_bytes(a.indexer_bytes)} of indexer keys); at "
            f"{b.context:,}, {fmt_bytes(b.bytes_read)}: "
            + (f"the reads **{'grow' if grows else 'do not grow'}** with the context"
               + (f", {b.bytes_read / a.bytes_read:.2f}× for 2× the tokens" if grows else "")
               + (" (the top-k part is capped; the indexer part is not)." if grows and b.top_k_kv_bytes ==
                  a.top_k_kv_bytes else ".")))


STATE_COLUMNS = [
    Column("architecture", "architecture", "text"), Column("state_bytes_per_user", "state per user", "bytes"),
    Column("grows_with_context", "grows with context", "bool"),
    Column("bytes_read_per_step", "read per step", "bytes", missing="— (all of it)"),
    Column("read_grows_with_context", "read grows with context", "bool", missing="— (as the state)"),
]


def state_table(rows: list[StateSize] | None = None, context: int = DEFAULT_CONTEXT, top_k: int = DSA_TOP_K):
    return people_table(rows if rows is not None else constant_state_models(context=context, dsa_top_k=top_k),
                        STATE_COLUMNS)
