"""The shape of a decoder model, read from its HF ``config.json``: the one ``ModelShape``.

The analysis (parameter counts, memory equation, roofline) and the engine (tensor shapes of the
KV cache, RMSNorm epsilon, RoPE base) read the same dataclass. Everything here is arithmetic on
the config: no weights, no torch.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .catalog import load_model_config

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_TYPES = (*LLAMA_LIKE, "deepseek_v3", "gpt_oss")


def load_config(model: str | os.PathLike | dict[str, Any]) -> dict[str, Any]:
    """A config dict from a catalog name, a ``config.json`` path or a dict (returned as is)."""
    if isinstance(model, dict):
        return model

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
    ``eos_token_id`` is the first end-of-sequence id when the config lists several.
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
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_type: str = "default"
    max_position_embeddings: int = 4096
    eos_token_id: int | None = None

    @property
    def attention_kind(self) -> str:
        """``'MLA'``, ``'MHA'`` (kv_heads == heads), ``'MQA'`` (one KV head) or ``'GQA'``."""
        if self.mla:
            return "MLA"
        if self.kv_heads == self.heads:
            return "MHA"
        return "MQA" if self.kv_heads == 1 else "GQA"

    @classmethod
    def from_hf_config(cls, config: Any, name: str | None = None) -> ModelShape:
        """The shape of a live transformers config object (``model.config``)."""
        cfg = config.to_dict()
        if name:
            cfg.setdefault("_infer_lab", {})["name"] = name
        return model_shape(cfg)

    def with_layers(self, layers: int) -> ModelShape:
        """The same shape with only the first ``layers`` decoder layers (a self-speculative draft)."""
        return replace(self, layers=layers, layer_windows=self.layer_windows[:layers])

    @property
    def has_sliding_window(self) -> bool:
        return any(w is not None for w in self.layer_windows)

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
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
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
        rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-5),
        rope_theta=float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0),
        rope_type=str(rope.get("rope_type") or rope.get("type") or "default"),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        eos_token_id=_first_id(cfg.get("eos_token_id")),
    )


def _first_id(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)
