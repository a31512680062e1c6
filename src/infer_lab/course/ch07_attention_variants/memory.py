"""Part 2 of chapter 07: KV memory per variant on real shapes, and max users per GPU (analytic)."""

from __future__ import annotations

from ...analysis import memory as kv_memory
from ...attention.kv_sizing import (
    WEIGHT_SPARE,
    VariantMemory,
    mla_ratio_explained,
    variant_memory_table,
)
from ...figures import finish, subplots
from ...units import fmt_bytes
from ..tables import Column, people_table
from .scenario import DEFAULT_CONTEXT, DEFAULT_GPU


def memory_rows(gpu: str = DEFAULT_GPU, context: int = DEFAULT_CONTEXT) -> list[VariantMemory]:
    return variant_memory_table(gpu=gpu, context=context)


def deployment_text(rows: list[VariantMemory]) -> str:
    """The weights and GPU count each model's rows assume, from the rows (one clause per model)."""
    parts = []
    for model in dict.fromkeys(r.model for r in rows):
        r = next(x for x in rows if x.model == model)
        weights = kv_memory.weight_bytes(model, r.weight_dtype).total
        parts.append(f"{model}, {r.weight_dtype} weights of {fmt_bytes(weights)}, on {r.n_gpus} {r.gpu}")
    return ("Each model runs in the precision its released checkpoint ships in, on the fewest GPUs that hold those "
            f"weights with {WEIGHT_SPARE:.0%} to spare, rounded up to a power of two, as tensor- and pipeline-parallel "
            "layouts split a model: " + "; ".join(parts) + ".")


def memory_text(rows: list[VariantMemory]) -> str:
    by = {(r.model, r.variant): r for r in rows}
    mistral = [r for r in rows if r.model == "mistral-7b"]
    mha, own = mistral[0], next(r for r in mistral if r.variant.startswith("GQA"))
    mla = by.get(("deepseek-v3", "MLA"))
    text = (f"Mistral-7B's GQA ({own.variant}) caches {own.mha_over_variant:.0f}× less than its MHA shape: "
            f"{fmt_bytes(own.kv_bytes_per_user)} instead of {fmt_bytes(mha.kv_bytes_per_user)} per user at "
            f"{own.context:,} tokens, so {own.max_users:,} users fit on {own.n_gpus} {own.gpu} instead of "
            f"{mha.max_users:,}.")
    if mla:
        k192 = mla_ratio_explained()["same_shape_k192"]
        text += (f" DeepSeek-V3's MLA caches {mla.mha_over_variant:.0f}× less than its MHA row, which gives K the "
                 f"value head dim ({k192.v_head_dim}); with its real K of {k192.k_head_dim} the MHA would cache "
                 f"{(k192.k_head_dim + k192.v_head_dim) / (2 * k192.v_head_dim):.2f}× more, and the ratio is "
                 f"{k192.ratio:.0f}×.")
    return deployment_text(rows) + "\n\n" + text


MEMORY_COLUMNS = [
    Column("model", "model", "text"), Column("variant", "variant", "text"),
    Column("kv_bytes_per_token", "KV per token, all layers", "bytes"),
    Column("kv_bytes_per_user", "KV per user", "bytes"), Column("mha_over_variant", "MHA / variant", "ratio"),
    Column("weight_dtype", "weights", "text"), Column("n_gpus", "GPUs (hold the weights)", "int"),
    Column("max_users", "max users", "int"),
]


def memory_table(rows: list[VariantMemory]):
    return people_table(rows, MEMORY_COLUMNS)


def kv_figure(rows: list[VariantMemory], title: str):
    """Horizontal bars of KV bytes per token (all layers, log scale) per model and variant."""
    labels = [f"{r.model} · {r.variant}" for r in rows]
    fig, ax = subplots(figsize=(7, 0.3 * len(rows) + 1.2))
    ax.barh(labels, [r.kv_bytes_per_token for r in rows], color="#55a868")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("KV bytes per token, all layers, bf16 (log)")
    if any(r.variant == "MLA" for r in rows):
        k = next(iter(mla_ratio_explained().values()))
        ax.set_xlabel(ax.get_xlabel() + f"\nMLA models' MHA and MQA rows give K the value head dim ({k.v_head_dim})")
    ax.set_title(title, fontsize=9)
    finish(fig)
    return fig
