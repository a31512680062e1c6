"""Part 1 before the run (``tp``): the rule that splits heads and MLP over the ranks, the replicated vocabulary, the layer's code, the all-reduces predicted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis.collectives import TPComm, tp_allreduces
from ...analysis.memory import as_shape
from ...parallel.layers import tp_decoder_layer
from ...parallel.shard import plan_shards
from ..library_code import code_block
from ..tables import Column, people_table


@dataclass(frozen=True)
class SplitRow:
    """What one rank holds at one world size (the rule of :mod:`infer_lab.parallel.shard`)."""

    world_size: int
    rank: int
    kv_heads: str
    query_heads: str
    mlp_columns: str
    split_params: int
    busiest_work_share: float


def split_rows(model: str = "smollm2-135m") -> tuple[list[SplitRow], str]:
    """Every world size the rule allows for ``model``, rank by rank, and why the next one fails."""
    shape = as_shape(model)
    rows = []
    for ws in range(1, shape.kv_heads + 1):
        plan = plan_shards(shape, ws)
        for sh in plan.shares:
            rows.append(SplitRow(ws, sh.rank, f"{sh.kv_heads[0]}..{sh.kv_heads[1] - 1}",
                                 f"{sh.q_heads[0]}..{sh.q_heads[1] - 1}", f"{sh.mlp[0]}..{sh.mlp[1] - 1}",
                                 plan.layers * plan.split_params_per_layer(sh), plan.busiest_work_share))
    try:
        plan_shards(shape, shape.kv_heads + 1)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    return rows, refused


def split_text(model: str = "smollm2-135m", world_size: int = 2) -> str:
    """The rule applied to ``model`` at ``world_size``, in words, every number from the shape."""
    shape = as_shape(model)
    plan = plan_shards(shape, world_size)

    def each(attr: str) -> str:
        return " + ".join(str(getattr(sh, attr)) for sh in plan.shares)

    return (
        f"{model} has {shape.heads} query heads sharing {shape.kv_heads} KV heads (groups of "
        f"{shape.heads // shape.kv_heads}) and {shape.intermediate:,} MLP columns. The rule splits whole KV groups, "
        f"as evenly as possible: on {world_size} ranks that is {each('n_kv_heads')} KV heads, so "
        f"{each('n_heads')} query heads, and {each('n_mlp')} MLP columns."
    )


# Production engines shard the vocabulary too, which costs two more collectives per step: vLLM's
# VocabParallelEmbedding all-reduces the embedding lookup, and its ParallelLMHead computes a slice of the
# logits that LogitsProcessor gathers (vllm/model_executor/layers/vocab_parallel_embedding.py and
# logits_processor.py; the first read at vLLM commit 00db011). Megatron-LM's VocabParallelEmbedding
# (megatron/core/tensor_parallel/layers.py) all-reduces its lookup the same way.
VOCAB_PARALLEL_COLLECTIVES = 2


def collectives_per_step(layers: int, vocab_parallel: bool) -> int:
    """Collectives one tensor-parallel decode step makes: 2 all-reduces per layer (after o_proj and
    down_proj), plus :data:`VOCAB_PARALLEL_COLLECTIVES` when the embedding and LM head are sharded by
    vocabulary (``vocab_parallel``) rather than replicated, as in this course's engine."""
    return 2 * layers + (VOCAB_PARALLEL_COLLECTIVES if vocab_parallel else 0)


def replicated_vocab_text(model: str = "smollm2-135m") -> str:
    """Why this engine's TP step makes no message besides the layers' all-reduces, and the two more a
    production engine makes because it shards the vocabulary; the counts from ``model``'s shape."""
    layers = as_shape(model).layers
    ours, theirs = collectives_per_step(layers, False), collectives_per_step(layers, True)
    return (f"The embedding, the LM head and the norms are **replicated** in this engine: every rank computes the "
            f"full logits and picks the same greedy token, so a step of {model} makes its {ours} all-reduces "
            f"(2 x {layers} layers) and no other message. Production engines shard the vocabulary as well, to "
            "keep one copy of the embedding and LM head across the ranks: vLLM's `VocabParallelEmbedding` adds "
            "an all-reduce after the embedding lookup (Megatron-LM's layer of that name does too) and its "
            "`ParallelLMHead` computes a slice of the logits that are then gathered, so a vLLM step of this "
            f"model makes {theirs} collectives (2 x {layers} + {VOCAB_PARALLEL_COLLECTIVES}).")


SPLIT_COLUMNS = [
    Column("world_size", "world size", "int"), Column("rank", "rank", "int"), Column("kv_heads", "KV heads", "text"),
    Column("query_heads", "query heads", "text"), Column("mlp_columns", "MLP columns", "text"),
    Column("split_params", "split parameters", "int"), Column("busiest_work_share", "busiest rank's work", "pct"),
]


def split_table(model: str = "smollm2-135m"):
    return people_table(split_rows(model)[0], SPLIT_COLUMNS)


def layer_code() -> str:
    """The tensor-parallel decoder layer, the library's real code (its docstring left out: the
    words around it on the page say the same), as a markdown code block."""
    return code_block(tp_decoder_layer)


def model_shape_of(model: Any) -> Any:
    """The shape of ``model``: a catalog name or shape as it is; a loaded model by its catalog entry,
    or by its own config when the catalog does not know it."""
    if not hasattr(model, "model"):
        return as_shape(model)
    try:
        return as_shape(model.name)
    except (KeyError, ValueError, FileNotFoundError):
        return as_shape(model.model.config.to_dict())


def allreduce_prediction(model: Any, world_size: int, batch: int) -> TPComm:
    """What analysis predicts for one decode step of ``batch`` sequences before anything runs:
    2 x layers all-reduces of batch x hidden fp32 values (the cost on the catalog's NVLink 4)."""
    return tp_allreduces(model_shape_of(model), world_size, batch, "nvlink4-nvswitch", act_dtype="fp32")


def prediction_text(model: Any, world_size: int, batch: int) -> str:
    """The prediction in words, every number from :func:`allreduce_prediction`."""
    p = allreduce_prediction(model, world_size, batch)
    shape = model_shape_of(model)
    return (f"**Predict first** (`analysis.collectives.tp_allreduces`): a decode step of {batch} sequences on "
            f"{world_size} ranks makes **2 x {shape.layers} layers = {p.count} all-reduces**, each of "
            f"{batch} tokens x {shape.hidden} x 4 B = **{p.message_bytes:,} B**, {p.total_bytes:,} B per step, "
            "whatever the world size. World size 1 makes none. On two H100s joined by NVLink 4 (catalog) one "
            f"such all-reduce would take {p.each.total_s * 1e6:,.0f} µs, almost all of it latency.")
