"""The shape of a model, read from its HF ``config.json``, and its parameter count by component.

Everything here is arithmetic on the config: no weights, no torch. The counts are exact for the
catalogued families (Llama, Mistral, Qwen2, DeepSeek-V3, gpt-oss); the tests compare them with a
meta-device build of the transformers model.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_TYPES = (*LLAMA_LIKE, "deepseek_v3", "gpt_oss")


def load_config(model: str | os.PathLike | dict[str, Any]) -> dict[str, Any]:
    """A config dict from a catalog name, a ``config.json`` path or a dict (returned as is)."""
    if isinstance(model, dict):
        return model
    from ..catalog import load_model_config

    return load_model_config(model)


def _config_name(cfg: dict[str, Any]) -> str:
    return str(
        cfg.get("_infer_lab", {}).get("name")
        or cfg.get("_name_or_path")
        or cfg.get("model_type", "config")
    )


def _need(cfg: dict[str, Any], key: str) -> Any:
    """A required config field; the error names it and the model."""
    value = cfg.get(key)
    if value is None:
        raise ValueError(
            f"config of {_config_name(cfg)!r} is missing the field {key!r}, which this calculation needs"
        )
    return value


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention (DeepSeek-V2/V3): the cache holds one latent per token per layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True)
class MoEShape:
    """Mixture of experts: ``n_experts`` per MoE layer, ``active_experts`` of them used per token."""

    n_experts: int
    active_experts: int
    expert_intermediate: int
    n_shared_experts: int
    dense_layers: int  # leading layers with a dense MLP instead of experts
    router_bias: bool
    expert_bias: bool


@dataclass(frozen=True)
class ModelShape:
    """Everything the memory and roofline arithmetic needs, parsed from one config.

    ``head_dim`` is the config's ``head_dim`` when present, else ``hidden // heads``.
    ``layer_windows`` holds the sliding-window length of each layer, ``None`` for full attention.
    """

    name: str
    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool = False
    attention_sinks: bool = False
    mla: MLAShape | None = None
    moe: MoEShape | None = None
    layer_windows: tuple[int | None, ...] = field(default=())

    @property
    def attention_kind(self) -> str:
        """``'MLA'``, ``'MHA'`` (kv_heads == heads), ``'MQA'`` (one KV head) or ``'GQA'``."""
        if self.mla:
            return "MLA"
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index >= self.moe.dense_layers

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["attention_kind"] = self.attention_kind
        return d


def _layer_windows(cfg: dict[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types:
        if len(types) != layers:
            raise ValueError(
                f"config field 'layer_types' has {len(types)} entries for {layers} layers"
            )
        return tuple(window if t == "sliding_attention" else None for t in types)
    if not window:
        return (None,) * layers
    if model_type == "qwen2":
        if not cfg.get("use_sliding_window", False):
            return (None,) * layers
        first = cfg.get("max_window_layers", layers)
        return tuple(window if i >= first else None for i in range(layers))
    if model_type == "mistral":
        return (window,) * layers
    return (None,) * layers


def model_shape(model: str | os.PathLike | dict[str, Any]) -> ModelShape:
    """Parse a catalog name, ``config.json`` path or config dict into a :class:`ModelShape`.

    Raises ``ValueError`` naming the missing field when the config lacks one that is needed.
    Unknown ``model_type`` values are read as a Llama-style dense decoder.
    """
    cfg = load_config(model)
    model_type = str(cfg.get("model_type") or "llama")
    hidden = int(_need(cfg, "hidden_size"))
    heads = int(_need(cfg, "num_attention_heads"))
    layers = int(_need(cfg, "num_hidden_layers"))
    vocab = int(_need(cfg, "vocab_size"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ValueError(
                f"hidden_size {hidden} is not divisible by num_attention_heads {heads}: "
                "the config needs an explicit 'head_dim'"
            )
        head_dim = hidden // heads
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MLAShape(
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            qk_rope_head_dim=int(_need(cfg, "qk_rope_head_dim")),
            qk_nope_head_dim=int(_need(cfg, "qk_nope_head_dim")),
            v_head_dim=int(_need(cfg, "v_head_dim")),
            q_lora_rank=cfg.get("q_lora_rank"),
        )
    moe = None
    n_experts = (
        cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    )
    if n_experts:
        moe = MoEShape(
            n_experts=int(n_experts),
            active_experts=int(_need(cfg, "num_experts_per_tok")),
            expert_intermediate=int(
                cfg.get("moe_intermediate_size") or _need(cfg, "intermediate_size")
            ),
            n_shared_experts=int(cfg.get("n_shared_experts") or 0),
            dense_layers=int(cfg.get("first_k_dense_replace") or 0),
            router_bias=model_type == "gpt_oss",
            expert_bias=model_type == "gpt_oss",
        )
    intermediate = int(cfg.get("intermediate_size") or 0)
    if moe is None or moe.dense_layers:
        intermediate = int(_need(cfg, "intermediate_size"))
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelShape(
        name=_config_name(cfg),
        model_type=model_type,
        vocab=vocab,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=int(head_dim),
        intermediate=intermediate,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias or model_type == "qwen2",
        o_bias=attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        attention_sinks=model_type == "gpt_oss",
        mla=mla,
        moe=moe,
        layer_windows=_layer_windows(cfg, model_type, layers),
    )


# ---------------------------------------------------------------------------------------------
# Parameter counts


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
