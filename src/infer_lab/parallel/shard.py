"""How a decoder's weights are split across tensor-parallel ranks.

**The rule.** The unit of attention that can move to a rank on its own is a *KV group*: one
KV head and the query heads that read it (grouped-query attention shares each K/V among
``heads / kv_heads`` query heads). The KV heads are cut into ``world_size`` contiguous runs as
evenly as possible, the larger runs first, and each rank takes its KV heads' query heads with
them. So no K/V is ever needed on two ranks, and no rank talks to another inside attention.

SmolLM2-135M has 9 query heads in 3 groups of 3. On 2 ranks that is 2 + 1 KV heads, so 6 + 3
query heads: rank 0 does two thirds of the attention work and rank 1 waits for it at the
all-reduce (:attr:`ShardPlan.largest_share` measures the imbalance). More ranks than KV heads
would need KV heads copied onto several ranks (what vLLM does); this implementation refuses
that with a clear error instead. The MLP's intermediate columns split the same way (1536 on 2
ranks: 768 + 768).

**What each rank holds.**

- column-parallel (output features split): the q rows of its heads, the k and v rows of its KV
  heads (stacked q|k|v, as the engine stores them) and its rows of gate and of up (stacked
  gate|up);
- row-parallel (input features split): the columns of o for its heads and the columns of down
  for its MLP slice; each produces a partial sum of the full ``hidden`` output;
- replicated: the embedding, the LM head, every RMSNorm weight. Each rank looks tokens up and
  computes the full logits itself, so the only communication is the two all-reduces per layer.
  A vocabulary-parallel LM head would split its matmul too, at the price of one more
  collective per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..engine.layers import LayerWeights
from ..shape import ModelShape


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, end)`` ranges covering ``range(n)``; sizes differ by at
    most one, the larger ones first (9 over 2: (0, 5), (5, 9))."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


@dataclass(frozen=True)
class RankShare:
    """What one rank owns: ``[start, end)`` ranges of KV heads, query heads and MLP columns."""

    rank: int
    world_size: int
    kv_heads: tuple[int, int]
    q_heads: tuple[int, int]
    mlp: tuple[int, int]

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def n_heads(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def n_mlp(self) -> int:
        return self.mlp[1] - self.mlp[0]


@dataclass(frozen=True)
class ShardPlan:
    """The split of one model over ``world_size`` ranks (see the module docstring for the rule)."""

    model: str
    world_size: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    shares: tuple[RankShare, ...]

    def split_params_per_layer(self, share: RankShare) -> int:
        """Parameters of one layer's split matrices on ``share``'s rank (q, k, v, o, gate, up, down)."""
        d, h = self.head_dim, self.hidden
        attention = (2 * share.n_heads + 2 * share.n_kv_heads) * d * h  # q and o, k and v
        return attention + 3 * share.n_mlp * h

    @property
    def largest_share(self) -> float:
        """The busiest rank's share of the split work (1 / world_size when it divides evenly)."""
        total = sum(self.split_params_per_layer(s) for s in self.shares)
        return max(self.split_params_per_layer(s) for s in self.shares) / total

    @property
    def busiest_work_share(self) -> float:
        """The busiest rank's share of a decode step's matmul weights, LM head included.

        Every rank runs the whole (replicated) LM head, so this is the fraction of the
        one-rank step's weight reads the slowest rank still does: the compute a TP step cannot
        divide. For SmolLM2-135M on 2 ranks the LM head is a fifth of the weights.
        """
        head = self.vocab * self.hidden
        total = self.layers * sum(self.split_params_per_layer(s) for s in self.shares) + head
        busiest = self.layers * max(self.split_params_per_layer(s) for s in self.shares) + head
        return busiest / total

    def describe(self) -> str:
        """``'rank 0: KV heads 0-1, query heads 0-5, MLP columns 0-767; rank 1: KV head 2, ...'``."""

        def span(what: str, r: tuple[int, int]) -> str:
            return f"{what} {r[0]}" if r[1] - r[0] == 1 else f"{what}s {r[0]}-{r[1] - 1}"

        return "; ".join(
            f"rank {s.rank}: {span('KV head', s.kv_heads)}, {span('query head', s.q_heads)}, "
            f"{span('MLP column', s.mlp)}"
            for s in self.shares
        )


def plan_shards(shape: ModelShape, world_size: int) -> ShardPlan:
    """Split ``shape`` over ``world_size`` ranks by whole KV groups; a clear error when it cannot."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if shape.mla is not None or shape.moe is not None:
        raise ValueError(f"{shape.name}: tensor parallelism here covers dense Llama-family models only")
    if shape.heads % shape.kv_heads:
        raise ValueError(f"{shape.name}: {shape.heads} query heads do not form groups over {shape.kv_heads} KV heads")
    if world_size > shape.kv_heads:
        raise ValueError(
            f"{shape.name} has {shape.kv_heads} KV heads, so at most {shape.kv_heads} ranks: this "
            f"implementation splits whole KV groups and does not copy a KV head onto several ranks "
            f"(world_size {world_size} asked)"
        )
    group = shape.heads // shape.kv_heads
    kv = split_evenly(shape.kv_heads, world_size)
    mlp = split_evenly(shape.intermediate, world_size)
    shares = tuple(
        RankShare(r, world_size, kv[r], (kv[r][0] * group, kv[r][1] * group), mlp[r])
        for r in range(world_size)
    )
    return ShardPlan(shape.name, world_size, shape.heads, shape.kv_heads, shape.head_dim, shape.hidden,
                     shape.intermediate, shape.layers, shape.vocab, shares)


def _rows(t: torch.Tensor | None, start: int, end: int) -> torch.Tensor | None:
    return None if t is None else t[start:end]


def shard_layer(w: LayerWeights, plan: ShardPlan, share: RankShare) -> LayerWeights:
    """One layer's weights for ``share``'s rank (copies of its slices; norms shared, not copied)."""
    if share.world_size == 1:
        return w
    d, heads, kv_heads, inter = plan.head_dim, plan.heads, plan.kv_heads, plan.intermediate
    (qa, qb), (ka, kb), (ia, ib) = share.q_heads, share.kv_heads, share.mlp
    k0, v0 = heads * d, (heads + kv_heads) * d  # where the k rows and the v rows start

    def qkv_rows(t):
        parts = [_rows(t, qa * d, qb * d), _rows(t, k0 + ka * d, k0 + kb * d), _rows(t, v0 + ka * d, v0 + kb * d)]
        return None if t is None else torch.cat(parts).contiguous()

    return LayerWeights(
        input_norm=w.input_norm,
        qkv_proj=qkv_rows(w.qkv_proj),
        qkv_bias=qkv_rows(w.qkv_bias),
        o_proj=w.o_proj[:, qa * d : qb * d].contiguous(),
        post_attention_norm=w.post_attention_norm,
        gate_up_proj=torch.cat([w.gate_up_proj[ia:ib], w.gate_up_proj[inter + ia : inter + ib]]).contiguous(),
        down_proj=w.down_proj[:, ia:ib].contiguous(),
    )


@dataclass
class ModelShard:
    """Everything one rank holds: its share, its layer slices and the replicated tensors."""

    shape: ModelShape
    plan: ShardPlan
    share: RankShare
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    inv_freq: torch.Tensor

    def to(self, device: torch.device | str) -> ModelShard:
        """The same shard with every tensor on ``device`` (tied embeddings stay tied)."""
        moved: dict[int, torch.Tensor] = {}

        def mv(t):
            if t is None:
                return None
            if id(t) not in moved:
                moved[id(t)] = t.to(device)
            return moved[id(t)]

        layers = [LayerWeights(*(mv(getattr(w, f)) for f in LayerWeights.__dataclass_fields__)) for w in self.layers]
        return ModelShard(self.shape, self.plan, self.share, mv(self.embed), layers, mv(self.final_norm),
                          mv(self.lm_head), mv(self.inv_freq))

    def param_counts(self) -> tuple[int, int]:
        """(parameters of this rank's split matrices, parameters every rank holds in full).

        Over all ranks, the split counts plus the replicated count once are the model's own
        parameter count (the tied LM head counted once, as transformers counts it).
        """
        split = replicated = 0
        for w in self.layers:
            split += sum(t.numel() for t in (w.qkv_proj, w.qkv_bias, w.o_proj, w.gate_up_proj, w.down_proj)
                         if t is not None)
            replicated += w.input_norm.numel() + w.post_attention_norm.numel()
        replicated += self.embed.numel() + self.final_norm.numel()
        if self.lm_head.data_ptr() != self.embed.data_ptr():
            replicated += self.lm_head.numel()
        return split, replicated


def shard_model(model, world_size: int, split: Callable[[LayerWeights, ShardPlan, RankShare], LayerWeights]
                = shard_layer) -> list[ModelShard]:
    """The ``world_size`` shards of an :class:`infer_lab.engine.EngineModel` (same weights, split).

    ``split(w, plan, share)`` cuts one layer for one rank: :func:`shard_layer` by default (a plug
    point: stage 8 of the course's build track passes a learner's own).
    """
    plan = plan_shards(model.shape, world_size)
    return [
        ModelShard(model.shape, plan, share, model.embed, [split(w, plan, share) for w in model.layers],
                   model.final_norm, model.lm_head, model.inv_freq)
        for share in plan.shares
    ]
