"""Foundations for the deck: the autoregressive loop and where one decode step's FLOPs are."""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis import memory
from ...analysis.memory import ModelLike, as_shape
from ...analysis.params import param_counts
from ...analysis.roofline import decode_ops
from ...catalog import list_models
from ...figures import finish, subplots
from ...units import human
from ..chapter import chapter_number
from ..tables import Column, people_table
from .kv import attention_line


@dataclass(frozen=True)
class LoopStage:
    """One stage of generating a token: what it does and its size for the chosen model."""

    stage: str
    what: str
    size: str


@dataclass(frozen=True)
class FlopShare:
    """FLOPs of one decode step at ``context`` for one sequence, by where they are spent."""

    model: str
    context: int
    layers_flops: float  # projections, attention and MLP of all decoder layers
    attention_flops: float  # the part of layers_flops that is scores + weighted sum over the cache
    embedding_flops: float  # a table lookup: no multiply-adds
    head_flops: float  # the LM head's logits
    embedding_params: int
    head_params: int  # 0 when tied to the embeddings (the head still costs FLOPs)
    layer_params: int

    @property
    def total_flops(self) -> float:
        return self.layers_flops + self.embedding_flops + self.head_flops

    @property
    def layers_share(self) -> float:
        return self.layers_flops / self.total_flops

    @property
    def head_share(self) -> float:
        return self.head_flops / self.total_flops


def loop_stages(model: ModelLike = "mistral-7b", kv_dtype: str = "bf16") -> list[LoopStage]:
    """The autoregressive loop for ``model``: tokenize, embed, N layers, LM head, sample, feed back."""
    shape = as_shape(model)
    kv_layer = memory.kv_bytes_per_token_per_layer(shape, kv_dtype)
    return [
        LoopStage("tokenize", "text → token ids", f"a vocabulary of {shape.vocab:,} tokens"),
        LoopStage("embed", "each id picks one row of the embedding table (a lookup, no matmul)",
                  f"{shape.vocab:,} × {shape.hidden:,} table; a vector of {shape.hidden:,} per token"),
        LoopStage(f"{shape.layers} layers", "each: norm → attention (Q, K, V projections; K and V appended to the "
                  "cache) → norm → MLP", f"{attention_line(shape)}; KV {kv_layer:,} B per token per layer "
                  f"({kv_dtype})"),
        LoopStage("LM head", "the last vector → one logit per vocabulary entry",
                  f"{shape.hidden:,} × {shape.vocab:,} matmul"),
        LoopStage("sample", "pick the next token from the logits (greedy, or temperature / top-p)",
                  "one token per sequence per step"),
        LoopStage("feed back", "the new token goes back to 'embed'; the prompt was one prefill pass, every "
                  "further token is one decode step", "until end-of-sequence or the length limit"),
    ]


def flop_share(model: ModelLike = "mistral-7b", context: int = 4096) -> FlopShare:
    """Where one decode step's FLOPs are (one sequence, ``context`` tokens), from the roofline's op count."""
    shape = as_shape(model)
    ops = decode_ops(shape, 1, context)
    head = sum(o.flops for o in ops if o.name == "LM head")
    attention = sum(o.flops for o in ops if o.name.startswith("attention"))
    counts = param_counts(shape)
    return FlopShare(shape.name, context, sum(o.flops for o in ops) - head, attention, 0.0, head,
                     counts.embeddings, counts.lm_head, counts.active - counts.embeddings - counts.lm_head)


def flop_share_rows(context: int = 4096, models: list[str] | None = None) -> list[FlopShare]:
    """:func:`flop_share` for every catalogued model (or ``models``)."""
    return [flop_share(m, context) for m in models or list_models()]


def attention_crossover_context(model: ModelLike = "mistral-7b") -> int:
    """The context (tokens) from which attention over the cache takes at least half of a decode
    step's layer FLOPs (its cost grows with context; the projections and MLP do not)."""
    lo, hi = 1, 2**24
    while lo < hi:
        mid = (lo + hi) // 2
        share = flop_share(model, mid)
        if share.attention_flops >= share.layers_flops / 2:
            hi = mid
        else:
            lo = mid + 1
    return lo


def attention_claim_text(model: ModelLike = "mistral-7b", context: int = 4096) -> str:
    """The talk's "attention is the most compute-intensive layer", against the FLOP count (analytic)."""
    share = flop_share(model, context)
    cross = attention_crossover_context(model)
    limit = memory.context_limit(model)
    where = (f"only beyond {cross:,} tokens of context" if cross <= limit
             else f"only beyond {cross:,} tokens, past the {limit:,} positions it can read")
    return (
        f"The talk calls attention the most compute-intensive layer. By FLOPs, for {share.model} at {context:,} "
        f"tokens it is {share.attention_flops / share.layers_flops:.1%} of the layer FLOPs of a decode step; it "
        f"overtakes the projections and MLP together {where}, because it is the only part whose work grows with the "
        "context. What makes attention expensive at ordinary contexts is memory, not FLOPs: each step reads the "
        f"whole KV cache (chapter {chapter_number('prefill_decode_roofline')}), and prefill's attention is quadratic "
        "in the prompt."
    )


def loop_text(model: ModelLike = "mistral-7b", context: int = 4096) -> str:
    """The loop in words with the FLOP split for ``model`` (markdown)."""
    share = flop_share(model, context)
    head = ("tied to the embedding table, so no extra weights, but its matmul still runs every step"
            if not share.head_params else f"{share.head_params:,} parameters of its own")
    return (
        f"Generating one token of **{share.model}** at {context:,} tokens of context takes "
        f"{human(share.total_flops / 1e9, 3)} GFLOP. **{share.layers_share:.1%}** of them are in the decoder layers "
        f"({share.attention_flops / share.layers_flops:.1%} of those in attention over the cache), "
        f"{share.head_share:.1%} in the LM head ({head}), and none in the embedding, which is a lookup. "
        "Every one of these steps re-reads every weight, and the loop runs once per generated token. "
        + attention_claim_text(model, context)
    )


def loop_table(model: ModelLike = "mistral-7b"):
    return people_table(loop_stages(model), [Column("stage", "stage", "text"), Column("what", "what happens", "text"),
                                             Column("size", "for this model", "text")])


def flop_share_table(rows: list[FlopShare]):
    return people_table(rows, [
        Column("model", "model", "text"), Column("total_flops", "GFLOP per token", scale=1e-9),
        Column("layers_share", "in the layers", "pct"), Column("head_share", "in the LM head", "pct"),
        Column("embedding_flops", "in the embedding (FLOP)", "int"),
    ])


def flop_share_figure(rows: list[FlopShare]):
    """Stacked bars: share of a decode step's FLOPs in the layers (attention, the rest) and the LM head."""
    fig, ax = subplots(figsize=(7, 3.6))
    names = [r.model for r in rows]
    att = [100 * r.attention_flops / r.total_flops for r in rows]
    rest = [100 * (r.layers_flops - r.attention_flops) / r.total_flops for r in rows]
    head = [100 * r.head_share for r in rows]
    ax.barh(names, rest, label="layers: projections and MLP", color="tab:blue")
    ax.barh(names, att, left=rest, label="layers: attention over the cache", color="tab:cyan")
    ax.barh(names, head, left=[a + b for a, b in zip(rest, att, strict=True)], label="LM head", color="tab:orange")
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of one decode step's FLOPs (the embedding is a lookup: 0)")
    ax.set_title(f"Where the FLOPs of one token are, at {rows[0].context:,} tokens of context: analytic, no hardware",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    ax.grid(alpha=0.3, axis="x")
    finish(fig)
    return fig
