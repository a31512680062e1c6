"""The engine's model: a Llama-family decoder over a flat, ragged batch of tokens.

The new tokens of every sequence in one step are concatenated into a single ``(T,)`` vector
with their own positions, so a prefill chunk of one request and the decode tokens of fifteen
others share every matrix multiply and no token is ever padded. Only attention needs to know
where one sequence ends and the next begins; it reads each sequence's past K/V from a cache
(contiguous or paged, see :mod:`kv_cache`) through :class:`~.kv_cache.AttentionMetadata`.

Attention has two paths inside :meth:`EngineModel.forward`:

* **per sequence** (the readable reference): each sequence gathers its own context and calls
  SDPA with its own causal mask. Prefill chunks always go this way.
* **batched decode**: every sequence that brings exactly one new token this step is attended
  in one call (:func:`~.layers.decode_attention`).

:meth:`EngineModel.decode_step` is the same decode in fixed shapes with tensor-only inputs, so
:mod:`graph_runner` can capture it in a CUDA graph. Both run the one decoder layer of
:mod:`layers`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from ..quant import kernels
from ..quant.formats import quantize_int8_absmax
from ..shape import ModelShape
from .cpu import prepack
from .kv_cache import AttentionMetadata, block_table_slots
from .layers import (
    LayerFunctions,
    LayerWeights,
    causal_attention,
    context_mask,
    decoder_layer,
    grouped_decode_attention,
    rms_norm,
    rope_cos_sin,
    rope_inverse_frequencies,
    span_decode_attention,
)


class KVStore(Protocol):
    """What attention needs from a KV cache: write new tokens' K/V, read any slots back."""

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def context_kv(
        self, layer: int, seq_index: int, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class FusedProjections:
    """What :func:`fuse_projections` leaves on a transformers model: fused tensors per layer."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor


def fuse_projections(hf_model: Any) -> list[FusedProjections]:
    """Stack q|k|v and gate|up of every layer of a transformers Llama-family model, once.

    The separate weights of the transformers model become views into the stacked tensors, so
    no memory is added and the transformers model keeps working on the same numbers. Calling
    it again returns the tensors made the first time (they are kept on the attention and MLP
    modules). :func:`infer_lab.models.load_model` calls it when a model is loaded.
    """
    fused = []
    for block in hf_model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        done = getattr(attn, "infer_lab_fused", None)
        if done is not None and _still_views(attn, mlp, done):
            fused.append(done)
            continue
        # Never fused, or the model was cast, moved or given new weights since (``model.to``
        # replaces each weight with a copy): stack what the modules hold now.
        qkv = torch.cat([attn.q_proj.weight.detach(), attn.k_proj.weight.detach(), attn.v_proj.weight.detach()])
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([attn.q_proj.bias.detach(), attn.k_proj.bias.detach(), attn.v_proj.bias.detach()])
        gate_up = torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])
        nq, nk = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
        ni = mlp.gate_proj.weight.shape[0]
        views = {
            attn.q_proj: (qkv[:nq], None if bias is None else bias[:nq]),
            attn.k_proj: (qkv[nq : nq + nk], None if bias is None else bias[nq : nq + nk]),
            attn.v_proj: (qkv[nq + nk :], None if bias is None else bias[nq + nk :]),
            mlp.gate_proj: (gate_up[:ni], None),
            mlp.up_proj: (gate_up[ni:], None),
        }
        for linear, (weight, b) in views.items():
            linear.weight.data = weight
            if b is not None:
                linear.bias.data = b
        done = FusedProjections(qkv, bias, gate_up)
        attn.infer_lab_fused = done
        fused.append(done)
    return fused


def _still_views(attn: Any, mlp: Any, done: FusedProjections) -> bool:
    """True while q, k, v (and their biases), gate and up are still the rows of ``done``'s stacks."""

    def rows_of(stack: torch.Tensor | None, parts: list[torch.Tensor | None]) -> bool:
        if stack is None or any(p is None for p in parts):  # no bias: none may have appeared
            return stack is None and all(p is None for p in parts)
        at = 0
        for part in parts:
            if (part.dtype, part.device) != (stack.dtype, stack.device) or part.data_ptr() != stack[at:].data_ptr():
                return False
            at += part.shape[0]
        return at == stack.shape[0]

    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    return (rows_of(done.qkv, [p.weight for p in projections])
            and rows_of(done.qkv_bias, [p.bias for p in projections])
            and rows_of(done.gate_up, [mlp.gate_proj.weight, mlp.up_proj.weight]))


# transformers model -> (its weights' key, the EngineModel over them); weak, so a model can go.
_FROM_HF: weakref.WeakKeyDictionary[Any, tuple[tuple[tuple[int, int], ...], EngineModel]] = (
    weakref.WeakKeyDictionary()
)


def _weights_key(hf_model: Any) -> tuple[tuple[int, int], ...]:
    """Where every parameter lives and how often it was changed in place: equal keys, equal weights."""
    return tuple((p.data_ptr(), p._version) for p in hf_model.parameters())


class EngineModel:
    """A Llama-family decoder over flat ragged batches, reading K/V through a :class:`KVStore`.

    Build it from a transformers model with :meth:`from_hf`; the tensors are shared, not copied.
    :meth:`first_layers` gives the same model cut short (a self-speculative draft);
    :meth:`prepacked` the same model with its GEMM weights in oneDNN's layout (CPU).
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
        if len(layers) != shape.layers:
            raise ValueError(f"the shape has {shape.layers} layers but {len(layers)} were given")
        self.shape = shape
        self.embed = embed
        self.layers = layers
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.dtype = embed.dtype
        self.device = embed.device
        if inv_freq is None:
            inv_freq = rope_inverse_frequencies(shape.head_dim, shape.rope_theta, self.device)
        self.inv_freq = inv_freq.float()
        self.scale = shape.head_dim**-0.5
        self.plain: EngineModel = self  # the same model with plain weights (itself unless prepacked)
        self._packed: tuple[tuple[int, ...], EngineModel] | None = None
        self.quant_method: str | None = None  # "int8", "int4"...: GEMM weights for a fused kernel
        self.unquantized: EngineModel | None = None  # a quantized model: the float model it was made from
        self._quantized: dict[str, tuple[Any, EngineModel]] = {}

    @classmethod
    def from_hf(cls, hf_model: Any) -> EngineModel:
        """Wrap the weights of a transformers ``*ForCausalLM`` (Llama, Mistral, Qwen2, SmolLM2).

        Tied embeddings work: ``lm_head`` then is the embedding matrix itself. A model whose RoPE
        uses a scaling rule keeps transformers' own inverse frequencies so positions match.
        """
        cached = _FROM_HF.get(hf_model)
        if cached is not None and cached[0] == _weights_key(hf_model):
            return cached[1]  # the same weights as last time: keep its prepacked twin too
        shape = ModelShape.from_hf_config(hf_model.config)
        if shape.has_sliding_window and any(
            w is not None and w < shape.max_position_embeddings for w in shape.layer_windows
        ):
            raise NotImplementedError("sliding-window attention is not implemented in this engine")
        decoder = hf_model.model
        inv_freq = decoder.rotary_emb.inv_freq.detach() if shape.rope_type != "default" else None
        fused = fuse_projections(hf_model)
        layers = [
            LayerWeights(
                input_norm=block.input_layernorm.weight.detach(),
                qkv_proj=f.qkv,
                qkv_bias=f.qkv_bias,
                o_proj=block.self_attn.o_proj.weight.detach(),
                post_attention_norm=block.post_attention_layernorm.weight.detach(),
                gate_up_proj=f.gate_up,
                down_proj=block.mlp.down_proj.weight.detach(),
            )
            for block, f in zip(decoder.layers, fused, strict=True)
        ]
        model = cls(
            shape,
            decoder.embed_tokens.weight.detach(),
            layers,
            decoder.norm.weight.detach(),
            hf_model.lm_head.weight.detach(),
            inv_freq=inv_freq,
        )
        _FROM_HF[hf_model] = (_weights_key(hf_model), model)
        return model

    @property
    def is_prepacked(self) -> bool:
        return self.plain is not self

    def gemm_weights(self) -> list[torch.Tensor]:
        """The weights every step multiplies by: four per layer (q|k|v, o, gate|up, down), the LM head."""
        per_layer = [t for w in self.layers for t in (w.qkv_proj, w.o_proj, w.gate_up_proj, w.down_proj)]
        return [*per_layer, self.lm_head]

    def gemm_weight_bytes(self) -> int:
        """Bytes of :meth:`gemm_weights` (what a prepacked copy adds)."""
        return sum(t.numel() * t.element_size() for t in self.plain.gemm_weights())

    def prepacked(self) -> EngineModel:
        """The same model with its GEMM weights reordered for oneDNN (:mod:`.cpu.prepack`); CPU only.

        Made once and kept while the plain weights are unchanged, so building many engines over
        one model packs once. Norms, embeddings and RoPE tables stay shared with this model.
        """
        if self.is_prepacked:
            return self
        if self.quant_method is not None:
            raise ValueError(f"quantized weights ({self.quant_method}) are not prepacked")
        key = tuple(t._version for t in self.gemm_weights())
        if self._packed is not None and self._packed[0] == key:
            return self._packed[1]
        layers = [
            replace(w, qkv_proj=prepack.prepack(w.qkv_proj), o_proj=prepack.prepack(w.o_proj),
                    gate_up_proj=prepack.prepack(w.gate_up_proj), down_proj=prepack.prepack(w.down_proj))
            for w in self.layers
        ]
        packed = EngineModel(self.shape, self.embed, layers, self.final_norm,
                             prepack.prepack(self.lm_head), inv_freq=self.inv_freq)
        packed.plain = self
        self._packed = (key, packed)
        return packed

    def cast(self, dtype: torch.dtype) -> EngineModel:
        """The same model with every weight in ``dtype`` (e.g. bf16 from fp32): a copy, made once.

        RoPE's frequencies stay fp32 and RMSNorm keeps its statistics in fp32 whatever the dtype.
        Kept while the source weights are unchanged, like :meth:`prepacked`.
        """
        source = self.plain
        if self.quant_method is not None:
            raise ValueError(f"a quantized model ({self.quant_method}) cannot change dtype")
        if dtype == source.dtype:
            return source
        key = (dtype, tuple(t._version for t in source.gemm_weights()))
        cached = source._quantized.get(str(dtype))
        if cached is not None and cached[0] == key:
            return cached[1]

        def c(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dtype)

        layers = [LayerWeights(c(w.input_norm), c(w.qkv_proj), c(w.qkv_bias), c(w.o_proj),
                               c(w.post_attention_norm), c(w.gate_up_proj), c(w.down_proj))
                  for w in source.layers]
        embed = c(source.embed)
        head = embed if source.lm_head is source.embed else c(source.lm_head)  # tied stays tied
        model = EngineModel(source.shape, embed, layers, c(source.final_norm), head, inv_freq=source.inv_freq)
        source._quantized[str(dtype)] = (key, model)
        return model

    def quantized(
        self,
        method: str,
        int8_quantizer: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] = quantize_int8_absmax,
    ) -> EngineModel:
        """The same model with its GEMM weights (LM head included) quantized for a fused CPU kernel.

        ``method``: ``int8`` (per output row) or ``int4`` / ``int4-gN`` (groups of N inputs,
        default 32; the LM head stays int8), multiplied by PyTorch's weight-only kernels
        (:mod:`infer_lab.quant.kernels`).
        Made once per method and kept while the float weights are unchanged; norms, embeddings
        and RoPE stay shared, in the model's dtype.

        ``int8_quantizer`` (a plug point: chapter 06's build exercise passes a learner's) makes
        every int8 weight's codes and per-row scales, ``weight (out, in) -> (int8 codes, scales
        (out, 1))``; the default is the library's :func:`~infer_lab.quant.formats.quantize_int8_absmax`.
        Only the default's models are kept: another quantizer's model is made anew on every call
        and kept nowhere, so it never stands in for the library's.
        """
        source = self.plain
        if self.quant_method is not None:
            raise ValueError(f"this model is already quantized ({self.quant_method})")
        if self.device.type != "cpu":
            raise ValueError(f"quantized weights use PyTorch's CPU kernels; this model is on {self.device}")
        kernels.parse_method(method)  # refuse a bad name before any work
        why = kernels.refusal(method)  # the kernels probed on this machine
        if why is not None:
            raise ValueError(f"weight_quant={method!r} cannot run here: {why}. Leave weight_quant at None "
                             "to run the model's own weights")
        own = int8_quantizer is quantize_int8_absmax
        key = (method, tuple(t._version for t in source.gemm_weights()))
        cached = source._quantized.get(method)
        if own and cached is not None and cached[0] == key:
            return cached[1]

        def q(t: torch.Tensor) -> Any:
            return kernels.quantize_weight(t, method, int8_quantizer)

        layers = [replace(w, qkv_proj=q(w.qkv_proj), o_proj=q(w.o_proj), gate_up_proj=q(w.gate_up_proj),
                          down_proj=q(w.down_proj)) for w in source.layers]
        # The LM head maps onto the whole vocabulary, where a coarse 4-bit step flips the top
        # token far more often than inside a layer: 4-bit methods keep it at int8.
        head = kernels.quantize_weight(source.lm_head, "int8" if method.startswith("int4") else method,
                                       int8_quantizer)
        model = EngineModel(source.shape, source.embed, layers, source.final_norm, head, inv_freq=source.inv_freq)
        model.quant_method, model.unquantized = method, source
        if own:
            source._quantized[method] = (key, model)
        return model

    def gemm_weight_bytes_stored(self) -> int:
        """Bytes this model's GEMM weights take as stored (codes and scales when quantized)."""
        return sum(t.numel() * t.element_size() if isinstance(t, torch.Tensor) and not t.is_mkldnn
                   else getattr(t, "nbytes", 0) for t in self.gemm_weights())

    def first_layers(self, n: int) -> EngineModel:
        """The same model cut after ``n`` layers, with the same final norm and LM head.

        Nothing is copied: this is the self-speculative draft, the target's own early layers.
        """
        if not 1 <= n <= self.shape.layers:
            raise ValueError(f"n must be in 1..{self.shape.layers}, got {n}")
        cut = EngineModel(self.shape.with_layers(n), self.embed, self.layers[:n], self.final_norm,
                          self.lm_head, inv_freq=self.inv_freq)
        if self.is_prepacked:
            cut.plain = self.plain.first_layers(n)
        cut.quant_method = self.quant_method
        return cut

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        return cos[:, None, :], sin[:, None, :]  # broadcast over heads

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return prepack.linear(rms_norm(h, self.final_norm, self.shape.rms_norm_eps), self.lm_head).float()

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVStore | None,
        fns: LayerFunctions = LayerFunctions(),
    ) -> torch.Tensor:
        """Logits ``(len(meta.sample_indices), vocab)`` (fp32) for the rows in ``meta.sample_indices``.

        ``input_ids`` and ``positions`` are ``(T,)``: the new tokens of all sequences, concatenated.
        With ``kv=None`` each sequence's new tokens must be its whole context (no-cache mode).
        """
        h = self.embed[input_ids]
        cos, sin = self._rope(positions)
        span = None
        if kv is not None and meta.decode_seqs == [0] and len(meta.query_lens) == 1:
            find = getattr(kv, "context_span", None)  # one decoding sequence: is its context one run?
            span = find(meta, 0) if find is not None else None
        for index, w in enumerate(self.layers):

            def attend(q, k, v, index=index):
                return self._attention(index, q, k, v, meta, kv, span)

            h = decoder_layer(h, w, attend, cos, sin, self.shape, fns)
        h = h[meta.sample_indices]
        if fns.logits is not None:
            return fns.logits(h, self.final_norm, self.lm_head, self.shape.rms_norm_eps)
        return self._logits(h)

    __call__ = forward

    def _attention(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        kv: KVStore | None,
        span: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Write this step's K/V into the cache, then attend each sequence's queries to its own context.

        ``span``: ``(first slot, tokens)`` when the step is one sequence decoding one token and
        its context sits in consecutive slots: attention then reads K/V in place (no gather).
        """
        if kv is not None:
            kv.write(layer, meta.slot_mapping, k, v)
        if span is not None:
            views = kv.read_span(layer, *span)
            if views is not None:
                return span_decode_attention(q, *views, self.scale)
        if meta.decode_seqs and len(meta.decode_seqs) == len(meta.query_lens):  # decode only: rows 0..B-1
            k_ctx, v_ctx = kv.gather(layer, meta.decode_slots)
            o = grouped_decode_attention(q, k_ctx, v_ctx, meta.decode_visible, self.scale)
            return o.reshape(len(meta.decode_seqs), -1)
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
        if meta.decode_seqs:
            rows = meta.decode_rows
            k_ctx, v_ctx = kv.gather(layer, meta.decode_slots)
            o = grouped_decode_attention(q[rows], k_ctx, v_ctx, meta.decode_visible, self.scale)
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
        fns: LayerFunctions = LayerFunctions(),
    ) -> torch.Tensor:
        """One decode token for each of ``B`` sequences, in fixed shapes: logits ``(B, vocab)`` fp32.

        Every input is a tensor of a fixed shape (``(B,)``, or ``(B, max_blocks)`` for the block
        tables) and nothing here reads a value back to the host, so the whole step can be
        captured in a CUDA graph and replayed with new values in the same buffers. Attention
        reads ``max_blocks * block_size`` context slots per sequence and masks past
        ``context_lens``; padding rows point at a scratch block.
        """
        slots, visible = context_mask(block_table_slots(block_tables, block_size), context_lens)
        h = self.embed[input_ids]
        cos, sin = self._rope(positions)
        for index, w in enumerate(self.layers):

            def attend(q, k, v, index=index):
                kv.write(index, slot_mapping, k, v)
                k_ctx, v_ctx = kv.gather(index, slots)
                return grouped_decode_attention(q, k_ctx, v_ctx, visible, self.scale)

            h = decoder_layer(h, w, attend, cos, sin, self.shape, fns)
        return self._logits(h)

    def kv_bytes_per_token(self) -> int:
        """Bytes of K/V one token occupies in a cache of this model's dtype (all layers, K and V)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.shape.layers * self.shape.kv_heads * self.shape.head_dim * itemsize


Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@torch.inference_mode()
def forward_tokens(model: EngineModel, token_ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                   rows: list[int]) -> torch.Tensor:
    """The decoder over a flat batch of tokens, with attention left to ``attend``.

    The interface of the forward pass the course's build track asks a learner to write (stage 1),
    and the library's own version of it: embedding, then per layer RMSNorm, the q/k/v
    projections (with their bias, if any), RoPE, ``attend``, the output projection and the
    gated MLP, each half added to the residual; then the final RMSNorm and the LM head.

    Args:
        model: the weights (plain, prepacked or quantized: every GEMM goes through ``linear``).
        token_ids, positions: ``(T,)`` int64: the new tokens of every request, concatenated.
        attend: ``attend(layer, q, k, v)`` stores the layer's new K/V ``(T, kv_heads, d)`` and
            returns each token's attention output over its own request's context, ``(T, heads, d)``.
        rows: the rows of the flat batch whose logits are wanted.
    Returns:
        fp32 logits ``(len(rows), vocab)``.
    """
    h = model.embed[token_ids]
    cos, sin = model._rope(positions)
    fns = LayerFunctions()
    for index, w in enumerate(model.layers):
        h = decoder_layer(h, w, functools.partial(attend, index), cos, sin, model.shape, fns)
    return model._logits(h[rows])
