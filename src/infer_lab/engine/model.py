"""A Llama-family decoder written out by hand: RMSNorm, RoPE, grouped-query attention, SwiGLU.

It runs a *flattened* batch: the new tokens of every sequence in one step are concatenated
into a single ``(T,)`` vector with their own positions, so a prefill chunk of one request and
the decode tokens of fifteen others share every matrix multiply and no token is ever padded.
Only attention needs to know where one sequence ends and the next begins; it reads each
sequence's past K/V from a cache (contiguous or paged, see :mod:`kv_cache`) through
:class:`AttentionMetadata`.

Attention has two paths:

* **per sequence** (the readable reference): each sequence gathers its own context and calls
  SDPA with its own causal mask. Prefill chunks always go this way.
* **batched decode**: every sequence that brings exactly one new token this step is attended
  in one call. Its context slots form a ``(B, L)`` matrix (a paged block table expanded to
  slots, padded to the longest context) and a length mask hides the padding: one gather and one
  SDPA per layer, whatever the batch size.

:meth:`EngineModel.decode_step` is the same decode in fixed shapes with tensor-only inputs, so
:mod:`graph_runner` can capture it in a CUDA graph.

The arithmetic follows transformers' ``LlamaForCausalLM`` step by step (RMSNorm in fp32, the
same RoPE formula, SDPA with grouped-query heads) so greedy outputs match token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ModelShape:
    """The numbers that define a Llama-family decoder (read from a transformers config)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    eos_token_id: int | None = None

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelShape:
        """Shape of a transformers ``LlamaConfig``/``MistralConfig``/``Qwen2Config``."""
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        eos = getattr(config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(theta),
            max_position_embeddings=config.max_position_embeddings,
            eos_token_id=eos,
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes of K and V for one token across all layers: 2 * layers * kv_heads * head_dim * itemsize."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize


def rope_inverse_frequencies(
    head_dim: int, theta: float, device: torch.device | None = None
) -> torch.Tensor:
    """RoPE's per-pair rotation speeds: ``theta ** (-2i / head_dim)`` for i in [0, head_dim/2), fp32."""
    return 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim)
    )


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``(T, head_dim)`` for integer positions ``(T,)`` (angles computed in fp32)."""
    freqs = positions[:, None].float() * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension: the 90-degree turn RoPE mixes in."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(T, heads, head_dim)`` by each token's position angle."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, with the statistics in fp32 whatever the input dtype."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class KVStore(Protocol):
    """What attention needs from a KV cache: per layer, a flat ``(num_slots, kv_heads, head_dim)`` store."""

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def context_kv(
        self, layer: int, seq_index: int, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class AttentionMetadata:
    """Where each sequence's tokens sit in the flattened batch and in the KV cache, for one step.

    Attributes:
        query_lens: new tokens per sequence this step (prefill chunk length, or 1 when decoding).
        context_lens: tokens of K/V each sequence attends to after this step's writes
            (cached tokens + new tokens).
        slot_mapping: ``(T,)`` int64 cache slot for every new token (where its K/V is written);
            ``None`` when there is no cache (the no-cache mode recomputes everything).
        block_tables: per sequence, the physical block ids holding its tokens in order (paged mode);
            in contiguous mode each sequence's first slot is in ``region_starts`` instead.
        region_starts: first slot of each sequence's contiguous reservation (contiguous mode).
        context_slots: paged mode: per sequence, the slot of each of its context tokens, in order
            (derived from the block table once per step, so each layer does one gather).
        sample_indices: rows of the flattened batch whose logits are wanted (a sequence's last
            new token, when that token completes its context).
        decode_seqs: indices of the sequences attended by the batched decode path (one new
            token each); empty when the path is off or no sequence qualifies.
        decode_rows: ``(B,)`` their rows in the flattened batch.
        decode_slots: ``(B, L)`` slot of each of their context positions, padded to the longest
            context ``L`` with a valid slot (masked out by ``decode_context_lens``).
        decode_context_lens: ``(B,)`` their context lengths (tokens).
    """

    query_lens: list[int]
    context_lens: list[int]
    slot_mapping: torch.Tensor | None = None
    block_tables: list[list[int]] | None = None
    region_starts: list[int] | None = None
    context_slots: list[torch.Tensor | None] | None = None
    sample_indices: list[int] = field(default_factory=list)
    decode_seqs: list[int] = field(default_factory=list)
    decode_rows: torch.Tensor | None = None
    decode_slots: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    # Set by EngineModel.fuse_projections: one GEMM reads q|k|v, one reads gate|up.
    qkv_proj: torch.Tensor | None = None
    qkv_bias: torch.Tensor | None = None
    gate_up_proj: torch.Tensor | None = None


class EngineModel:
    """A Llama-family decoder over flattened ragged batches, reading K/V through a :class:`KVStore`.

    Build it from a transformers model with :meth:`from_hf`; the tensors are shared, not copied.
    """

    def __init__(
        self,
        shape: ModelShape,
        embed: torch.Tensor,
        layers: list[LayerWeights],
        final_norm: torch.Tensor,
        lm_head: torch.Tensor,
        inv_freq: torch.Tensor | None = None,
    ):
        self.shape = shape
        self.embed = embed
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.dtype = embed.dtype
        self.device = embed.device
        self.inv_freq = (
            inv_freq
            if inv_freq is not None
            else rope_inverse_frequencies(shape.head_dim, shape.rope_theta, self.device)
        ).float()
        self.scale = shape.head_dim**-0.5
        # Per layer, the transformers Linear modules the projections came from (see from_hf).
        self._sources: list[dict[str, Any]] = []
        self.fused = False  # read q|k|v and gate|up through the fused tensors (fuse_projections)
        self._decode_layer_fns = (self._before_kv_write, self._after_kv_write)
        self.compiled = False

    @classmethod
    def from_hf(cls, hf_model: Any) -> EngineModel:
        """Wrap the weights of a transformers ``*ForCausalLM`` (Llama, Mistral, Qwen2, SmolLM2).

        Tied embeddings work: ``lm_head`` then is the embedding matrix itself. A model whose RoPE
        uses a scaling rule (``rope_type`` other than ``"default"``) keeps transformers' own
        inverse frequencies so the positions match exactly.
        """
        cfg = hf_model.config
        shape = ModelShape.from_hf_config(cfg)
        rope_type = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
        if (
            getattr(cfg, "sliding_window", None)
            and getattr(cfg, "use_sliding_window", True)
            and cfg.sliding_window < shape.max_position_embeddings
        ):
            raise NotImplementedError(
                f"sliding-window attention ({cfg.sliding_window}) is not implemented here"
            )
        decoder = hf_model.model
        inv_freq = decoder.rotary_emb.inv_freq.detach() if rope_type != "default" else None
        layers = []
        for block in decoder.layers:
            attn, mlp = block.self_attn, block.mlp
            layers.append(
                LayerWeights(
                    input_norm=block.input_layernorm.weight.detach(),
                    q_proj=attn.q_proj.weight.detach(),
                    k_proj=attn.k_proj.weight.detach(),
                    v_proj=attn.v_proj.weight.detach(),
                    o_proj=attn.o_proj.weight.detach(),
                    post_attention_norm=block.post_attention_layernorm.weight.detach(),
                    gate_proj=mlp.gate_proj.weight.detach(),
                    up_proj=mlp.up_proj.weight.detach(),
                    down_proj=mlp.down_proj.weight.detach(),
                    q_bias=_bias(attn.q_proj),
                    k_bias=_bias(attn.k_proj),
                    v_bias=_bias(attn.v_proj),
                )
            )
        model = cls(
            shape,
            decoder.embed_tokens.weight.detach(),
            layers,
            decoder.norm.weight.detach(),
            hf_model.lm_head.weight.detach(),
            inv_freq=inv_freq,
        )
        model._sources = [
            {
                name: getattr(block.self_attn if name[0] in "qkv" else block.mlp, name)
                for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
            }
            for block in decoder.layers
        ]
        return model

    def fuse_projections(self) -> EngineModel:
        """Concatenate q|k|v and gate|up so each layer runs 2 input GEMMs instead of 5.

        At batch 1 a GEMV streams its weight matrix once; a 4096x1024 k or v projection is too
        small to reach full memory bandwidth, the fused 4096x6144 one is not. The separate
        weights become views into the fused tensors, so no memory is added; the transformers
        model the weights came from keeps working (its parameters are re-pointed as well, when
        the model was built with :meth:`from_hf`). Setting ``fused = False`` afterwards goes
        back to the separate GEMMs (the views stay valid). Returns ``self``.
        """
        self.fused = True
        for index, w in enumerate(self.layers):
            if w.qkv_proj is not None:
                continue
            w.qkv_proj = torch.cat((w.q_proj, w.k_proj, w.v_proj))
            if w.q_bias is not None:
                w.qkv_bias = torch.cat((w.q_bias, w.k_bias, w.v_bias))
            w.gate_up_proj = torch.cat((w.gate_proj, w.up_proj))
            nq, nk = w.q_proj.shape[0], w.k_proj.shape[0]
            ni = w.gate_proj.shape[0]
            views = {
                "q_proj": w.qkv_proj[:nq],
                "k_proj": w.qkv_proj[nq : nq + nk],
                "v_proj": w.qkv_proj[nq + nk :],
                "gate_proj": w.gate_up_proj[:ni],
                "up_proj": w.gate_up_proj[ni:],
            }
            for name, view in views.items():
                setattr(w, name, view)
                source = self._sources[index].get(name) if self._sources else None
                if source is not None:  # the transformers Linear now reads the fused storage
                    source.weight.data = view
        return self

    def _qkv(self, x: torch.Tensor, w: LayerWeights):
        s = self.shape
        if self.fused:
            q, k, v = F.linear(x, w.qkv_proj, w.qkv_bias).split(
                (
                    s.num_heads * s.head_dim,
                    s.num_kv_heads * s.head_dim,
                    s.num_kv_heads * s.head_dim,
                ),
                dim=-1,
            )
        else:
            q, k, v = (
                F.linear(x, w.q_proj, w.q_bias),
                F.linear(x, w.k_proj, w.k_bias),
                F.linear(x, w.v_proj, w.v_bias),
            )
        return (
            q.reshape(-1, s.num_heads, s.head_dim),
            k.reshape(-1, s.num_kv_heads, s.head_dim),
            v.reshape(-1, s.num_kv_heads, s.head_dim),
        )

    def _mlp(self, x: torch.Tensor, w: LayerWeights) -> torch.Tensor:
        if self.fused:
            gate, up = F.linear(x, w.gate_up_proj).chunk(2, dim=-1)
        else:
            gate, up = F.linear(x, w.gate_proj), F.linear(x, w.up_proj)
        return F.linear(F.silu(gate) * up, w.down_proj)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVStore | None,
    ) -> torch.Tensor:
        """Logits ``(len(meta.sample_indices), vocab)`` (fp32) for the rows named in ``meta.sample_indices``.

        ``input_ids`` and ``positions`` are ``(T,)``: the new tokens of all sequences, concatenated.
        With ``kv=None`` each sequence's new tokens must be its whole context (no-cache mode).
        """
        s = self.shape
        h = self.embed[input_ids]
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        for layer_index, w in enumerate(self.layers):
            q, k, v = self._before_kv_write(h, w, cos, sin)
            h = self._finish_layer(h, self._attention(layer_index, q, k, v, meta, kv), w)
        rows = h[meta.sample_indices]
        return F.linear(rms_norm(rows, self.final_norm, s.rms_norm_eps), self.lm_head).float()

    __call__ = forward

    def _attention(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVStore | None,
    ) -> torch.Tensor:
        """Write this step's K/V into the cache, then attend each sequence's queries to its own context."""
        if kv is not None:
            k_store, v_store = kv.layer_kv(layer)
            k_store[meta.slot_mapping] = k
            v_store[meta.slot_mapping] = v
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
        if meta.decode_seqs:
            rows = meta.decode_rows
            o = decode_attention(
                q[rows], k_store, v_store, meta.decode_slots, meta.decode_context_lens, self.scale
            )
            out[rows] = o.reshape(len(meta.decode_seqs), -1)
        batched = set(meta.decode_seqs)
        start = 0
        for i, n_new in enumerate(meta.query_lens):
            if i in batched:
                start += n_new
                continue
            q_i = q[start : start + n_new].transpose(0, 1).unsqueeze(0)  # (1, heads, n_new, d)
            if kv is None:
                k_i, v_i = k[start : start + n_new], v[start : start + n_new]
            else:
                k_i, v_i = kv.context_kv(layer, i, meta)
            k_i = k_i.transpose(0, 1).unsqueeze(0)
            v_i = v_i.transpose(0, 1).unsqueeze(0)
            o = causal_attention(q_i, k_i, v_i, self.scale)
            out[start : start + n_new] = o[0].transpose(0, 1).reshape(n_new, -1)
            start += n_new
        return out

    def _before_kv_write(self, h, w, cos, sin):
        q, k, v = self._qkv(rms_norm(h, w.input_norm, self.shape.rms_norm_eps), w)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _after_kv_write(self, h, w, q, k_store, v_store, slots, context_lens):
        attn = decode_attention(q, k_store, v_store, slots, context_lens, self.scale)
        return self._finish_layer(h, attn.flatten(1), w)

    def _finish_layer(self, h, attn, w):
        """Output projection and residual, then the SwiGLU MLP and its residual."""
        h = h + F.linear(attn, w.o_proj)
        return h + self._mlp(rms_norm(h, w.post_attention_norm, self.shape.rms_norm_eps), w)

    def compile_decode(self) -> EngineModel:
        """Let torch.compile fuse the small ops of each decode layer (norms, RoPE, SiLU, masking).

        A decode layer in eager mode is ~40 kernels, most of them tiny elementwise ops that
        each read and write the activations once; at batch 1 their fixed cost adds up to about
        as much as streaming the weights. Inductor fuses them into a few kernels. The KV write
        stays outside the compiled functions (an in-place scatter into the cache), so the two
        halves are pure functions of their inputs; both are compiled with dynamic shapes, so
        one compilation serves every layer, batch bucket and context bucket. Fuses the
        projections first (the compiled halves read the fused weights). Returns ``self``.
        """
        if not self.fused:
            self.fuse_projections()
        s = self.shape
        split = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim)
        eps, scale, heads, kv_heads, d = (
            s.rms_norm_eps,
            self.scale,
            s.num_heads,
            s.num_kv_heads,
            s.head_dim,
        )

        def before(h, norm, qkv, qkv_bias, cos, sin):
            q, k, v = F.linear(rms_norm(h, norm, eps), qkv, qkv_bias).split(split, dim=-1)
            q = apply_rope(q.reshape(-1, heads, d), cos, sin)
            return q, apply_rope(k.reshape(-1, kv_heads, d), cos, sin), v.reshape(-1, kv_heads, d)

        def after(h, q, k_store, v_store, slots, context_lens, o_proj, norm, gate_up, down):
            attn = decode_attention(q, k_store, v_store, slots, context_lens, scale)
            h = h + F.linear(attn.flatten(1), o_proj)
            gate, up = F.linear(rms_norm(h, norm, eps), gate_up).chunk(2, dim=-1)
            return h + F.linear(F.silu(gate) * up, down)

        # Weights go in as tensors (not the LayerWeights object) so no layer triggers a recompile.
        before_c = torch.compile(before, dynamic=True)
        after_c = torch.compile(after, dynamic=True)
        self._decode_layer_fns = (
            lambda h, w, cos, sin: before_c(h, w.input_norm, w.qkv_proj, w.qkv_bias, cos, sin),
            lambda h, w, q, ks, vs, slots, lens: after_c(
                h,
                q,
                ks,
                vs,
                slots,
                lens,
                w.o_proj,
                w.post_attention_norm,
                w.gate_up_proj,
                w.down_proj,
            ),
        )
        self.compiled = True
        return self

    @torch.inference_mode()
    def decode_step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        kv: KVStore,
        block_size: int,
    ) -> torch.Tensor:
        """One decode token for each of ``B`` sequences, in fixed shapes: logits ``(B, vocab)`` fp32.

        Every input is a tensor of a fixed shape (``(B,)``, or ``(B, max_blocks)`` for the block
        tables) and nothing here reads a value back to the host, so the whole step can be
        captured in a CUDA graph and replayed with new values in the same buffers. Attention
        reads ``max_blocks * block_size`` context slots per sequence and masks past
        ``context_lens``; padding rows point at a scratch block.
        """
        s = self.shape
        slots = block_table_slots(block_tables, block_size)  # (B, L)
        h = self.embed[input_ids]
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        before, after = self._decode_layer_fns
        for layer_index, w in enumerate(self.layers):
            q, k, v = before(h, w, cos, sin)
            k_store, v_store = kv.layer_kv(layer_index)
            k_store[slot_mapping] = k
            v_store[slot_mapping] = v
            h = after(h, w, q, k_store, v_store, slots, context_lens)
        return F.linear(rms_norm(h, self.final_norm, s.rms_norm_eps), self.lm_head).float()

    def kv_bytes_per_token(self) -> int:
        """Bytes of K/V one token occupies in the cache (all layers, K and V)."""
        return self.shape.kv_bytes_per_token(self.dtype)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention of ``q (1, heads, n, d)`` over ``k, v (1, kv_heads, ctx, d)``, ctx >= n.

    The n queries are the last n positions of the context: query i sees keys 0 .. ctx - n + i.
    Grouped-query heads are shared by SDPA (``enable_gqa``) rather than copied.
    """
    n, ctx = q.shape[2], k.shape[2]
    if n == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    if n == ctx:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    offset = ctx - n
    allowed = torch.arange(ctx, device=q.device)[None, :] <= (
        torch.arange(n, device=q.device)[:, None] + offset
    )
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)


def block_table_slots(block_tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block ids ``(B, blocks)`` -> the slot of every position ``(B, blocks * block_size)``.

    Position ``p`` of a sequence lives in slot ``block_tables[p // block_size] * block_size +
    p % block_size``: the paged equivalent of a virtual-to-physical address translation.
    """
    offsets = torch.arange(block_size, device=block_tables.device)
    return (block_tables[:, :, None] * block_size + offsets).flatten(1)


def decode_attention(
    q: torch.Tensor,
    k_store: torch.Tensor,
    v_store: torch.Tensor,
    context_slots: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence against its cached context, for ``B`` sequences in one call.

    Args:
        q: ``(B, heads, head_dim)``: each sequence's newest token (its K/V already in the store).
        k_store, v_store: ``(num_slots, kv_heads, head_dim)``: one layer of the cache.
        context_slots: ``(B, L)`` int64: the slot of context position j of sequence b; entries
            at ``j >= context_lens[b]`` may be any valid slot, written or not (they are masked
            and never read).
        context_lens: ``(B,)`` int64, each >= 1.
        scale: softmax scale, ``head_dim ** -0.5``.
    Returns:
        ``(B, heads, head_dim)``.

    The gather copies the context once (PagedAttention kernels read blocks in place instead;
    here the copy keeps the idea visible and lets SDPA do the arithmetic).
    """
    batch, heads, d = q.shape
    kv_heads = k_store.shape[1]
    length = context_slots.shape[1]
    visible = torch.arange(length, device=q.device)[None, :] < context_lens[:, None]
    # Masked positions must still hold finite numbers: a never-written slot may contain NaN,
    # and 0 * NaN is NaN. Point them at the sequence's first slot, which always holds a token.
    context_slots = torch.where(visible, context_slots, context_slots[:, :1])
    k = k_store[context_slots].transpose(1, 2)  # (B, kv_heads, L, d)
    v = v_store[context_slots].transpose(1, 2)
    # Grouped-query decode: the heads sharing one KV head become that head's "query rows", so
    # every K/V is read once for its whole group and no kernel needs to know about GQA.
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, d)
    out = F.scaled_dot_product_attention(
        grouped, k, v, attn_mask=visible[:, None, None, :], scale=scale
    )
    return out.reshape(batch, heads, d)


def _bias(linear: Any) -> torch.Tensor | None:
    return linear.bias.detach() if getattr(linear, "bias", None) is not None else None
