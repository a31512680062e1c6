"""A model's parameter count by component, from its :class:`~infer_lab.shape.ModelShape`.

Everything here is arithmetic on the config: no weights, no torch. The counts are exact for the
catalogued families (Llama, Mistral, Qwen2, DeepSeek-V3, gpt-oss); the tests compare them with a
meta-device build of the transformers model.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

# The shape lives in one place; these names are re-exported for the analysis package.
from ..shape import (  # noqa: F401
    LLAMA_LIKE,
    SUPPORTED_TYPES,
    MLAShape,
    ModelShape,
    MoEShape,
    load_config,
    model_shape,
)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by component. ``active`` counts what one token uses (MoE: only its experts)."""

    embeddings: int
    attention: int
    mlp_dense: int
    experts: int  # all routed experts of all MoE layers
    experts_active: int  # the routed experts one token uses
    shared_experts: int
    routers: int
    norms: int
    lm_head: int  # 0 when tied to the embeddings

    @property
    def total(self) -> int:
        """Every parameter, tied embeddings counted once (what ``sum(p.numel())`` gives)."""
        return (
            self.embeddings
            + self.attention
            + self.mlp_dense
            + self.experts
            + self.shared_experts
            + self.routers
            + self.norms
            + self.lm_head
        )

    @property
    def active(self) -> int:
        """Parameters one token touches: the total with only its routed experts."""
        return self.total - self.experts + self.experts_active

    @property
    def matmul(self) -> int:
        """Parameters in the per-token matmuls of the decoder layers (total, not active)."""
        return self.attention + self.mlp_dense + self.experts + self.shared_experts + self.routers

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        d.update(total=self.total, active=self.active)
        return d


def attention_params_per_layer(shape: ModelShape) -> int:
    """Weights and biases of one attention block (q/k/v/o or the MLA projections), plus sinks/norms in it."""
    h = shape.hidden
    if shape.mla:
        m = shape.mla
        qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * shape.heads * qk_head
            q += m.q_lora_rank if shape.o_bias else 0  # q_a_proj bias follows attention_bias
        else:
            q = h * shape.heads * qk_head
        kv = (
            h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        )  # down-projection + its norm
        kv += (m.kv_lora_rank + m.qk_rope_head_dim) if shape.o_bias else 0
        kv += m.kv_lora_rank * shape.heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = shape.heads * m.v_head_dim * h + (h if shape.o_bias else 0)
        return q + kv + o
    q_out = shape.heads * shape.head_dim
    kv_out = shape.kv_heads * shape.head_dim
    n = h * q_out + 2 * h * kv_out + q_out * h
    if shape.qkv_bias:
        n += q_out + 2 * kv_out
    if shape.o_bias:
        n += h
    if shape.qk_norm:
        n += 2 * shape.head_dim
    if shape.attention_sinks:
        n += shape.heads
    return n


def gated_mlp_params(hidden: int, intermediate: int, bias: bool = False) -> int:
    """gate, up and down projections of a SwiGLU MLP."""
    return 3 * hidden * intermediate + ((2 * intermediate + hidden) if bias else 0)


def param_counts(model: str | os.PathLike | dict[str, Any] | ModelShape) -> ParamCounts:
    """Exact parameter counts by component for a model name, config path, config dict or shape."""
    shape = model if isinstance(model, ModelShape) else model_shape(model)
    h = shape.hidden
    n_moe = sum(shape.is_moe_layer(i) for i in range(shape.layers))
    n_dense = shape.layers - n_moe
    experts = experts_active = shared = routers = 0
    if shape.moe:
        e = shape.moe
        per_expert = gated_mlp_params(h, e.expert_intermediate, e.expert_bias)
        experts = n_moe * e.n_experts * per_expert
        experts_active = n_moe * e.active_experts * per_expert
        shared = (
            n_moe * gated_mlp_params(h, e.expert_intermediate * e.n_shared_experts)
            if e.n_shared_experts
            else 0
        )
        routers = n_moe * (e.n_experts * h + (e.n_experts if e.router_bias else 0))
    return ParamCounts(
        embeddings=shape.vocab * h,
        attention=shape.layers * attention_params_per_layer(shape),
        mlp_dense=n_dense * gated_mlp_params(h, shape.intermediate, shape.mlp_bias),
        experts=experts,
        experts_active=experts_active,
        shared_experts=shared,
        routers=routers,
        norms=(2 * shape.layers + 1) * h,
        lm_head=0 if shape.tied_embeddings else shape.vocab * h,
    )
