"""The tensor-parallel decoder layer, and the sharded model that runs it on one rank.

One layer on one rank, with ``h`` the full residual stream ``(T, hidden)`` (the same on every
rank)::

    q, k, v = rope(norm(h) @ Wqkv_r)          column-parallel: this rank's heads only
    a       = attention(q, k, v)              local: this rank's KV heads, no communication
    h       = h + all_reduce(a @ Wo_r)        row-parallel: a partial sum; all-reduce no. 1
    g, u    = norm(h) @ Wgate_r, norm(h) @ Wup_r    column-parallel: this rank's MLP columns
    h       = h + all_reduce((silu(g) * u) @ Wdown_r)   row-parallel; all-reduce no. 2

Each all-reduce moves ``T x hidden`` activations, whatever the world size: 2 x layers of them
per step. The pieces are the engine's own (:mod:`infer_lab.engine.layers`): the first half is
:func:`~infer_lab.engine.layers.attention_inputs` called with the rank's head counts; only the
second half differs, because the residual may be added only after the partial sums are.

After each all-reduce every rank holds the same ``h``, bit for bit, so each computes the same
logits and picks the same greedy token with no further message (the runtime checks that the
ranks agree).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..engine.layers import (
    LayerWeights,
    attention_inputs,
    causal_attention,
    decode_attention,
    rms_norm,
    rope_cos_sin,
)
from .cache import SequenceKVCache
from .comm import Communicator
from .shard import ModelShard

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def tp_decoder_layer(
    h: torch.Tensor,
    w: LayerWeights,
    attend: Attend,
    cos: torch.Tensor,
    sin: torch.Tensor,
    shard: ModelShard,
    comm: Communicator,
) -> torch.Tensor:
    """One decoder layer on one rank over a flat batch ``h (T, hidden)``: two all-reduces."""
    shape, share = shard.shape, shard.share
    eps = shape.rms_norm_eps
    q, k, v = attention_inputs(h, w.input_norm, w.qkv_proj, w.qkv_bias, cos, sin, eps,
                               share.n_heads, share.n_kv_heads, shape.head_dim)
    attn = attend(q, k, v).flatten(1)  # (T, local heads x head_dim)
    h = h + comm.all_reduce(F.linear(attn, w.o_proj))
    x = rms_norm(h, w.post_attention_norm, eps)
    gate, up = F.linear(x, w.gate_up_proj).chunk(2, dim=-1)
    return h + comm.all_reduce(F.linear(F.silu(gate) * up, w.down_proj))


class TPModel:
    """The decoder on one rank: replicated embedding and LM head, split layers, local KV cache.

    :attr:`layer_fn` is the layer every step runs, :func:`tp_decoder_layer` by default. It is a
    plug point: stage 8 of the course's build track sets it on a rank's model (``model.layer_fn = f``,
    through ``TPGroup(layer=f)``) to run a learner's layer in the worker processes.
    """

    layer_fn = staticmethod(tp_decoder_layer)

    def __init__(self, shard: ModelShard, comm: Communicator):
        if comm.world_size != shard.share.world_size or comm.rank != shard.share.rank:
            raise ValueError(f"the shard is for rank {shard.share.rank} of {shard.share.world_size}, "
                             f"the communicator is rank {comm.rank} of {comm.world_size}")
        self.shard, self.comm = shard, comm
        self.shape = shard.shape
        self.dtype, self.device = shard.embed.dtype, shard.embed.device
        self.scale = self.shape.head_dim**-0.5

    def new_cache(self, n_seqs: int, max_len: int) -> SequenceKVCache:
        return SequenceKVCache(self.shape.layers, n_seqs, max_len, self.shard.share.n_kv_heads,
                               self.shape.head_dim, self.dtype, self.device)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_cos_sin(positions, self.shard.inv_freq, self.dtype)
        return cos[:, None, :], sin[:, None, :]

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, attend_for) -> torch.Tensor:
        h = self.shard.embed[ids]
        cos, sin = self._rope(positions)
        for index, w in enumerate(self.shard.layers):
            h = self.layer_fn(h, w, attend_for(index), cos, sin, self.shard, self.comm)
        return h

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        x = rms_norm(h, self.shard.final_norm, self.shape.rms_norm_eps)
        return F.linear(x, self.shard.lm_head).float()

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], seqs: list[int], cache: SequenceKVCache) -> torch.Tensor:
        """Every prompt in one flat batch (sequence ``seqs[i]`` gets ``prompts[i]``); the logits
        ``(len(prompts), vocab)`` of each prompt's last position."""
        lens = [len(p) for p in prompts]
        ids = torch.tensor([t for p in prompts for t in p], device=self.device)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lens])
        slots = torch.cat([cache.slots(s, 0, n) for s, n in zip(seqs, lens, strict=True)])
        bounds = [0, *torch.tensor(lens).cumsum(0).tolist()]

        def attend_for(layer: int):
            k_store, v_store = cache.layer_kv(layer)

            def attend(q, k, v):
                k_store[slots], v_store[slots] = k, v
                out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype, device=q.device)
                for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                    qi, ki, vi = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
                    out[a:b] = causal_attention(qi, ki, vi, self.scale)[0].transpose(0, 1).flatten(1)
                return out

            return attend

        h = self._layers(ids, positions, attend_for)
        return self._logits(h[torch.tensor(bounds[1:], device=self.device) - 1])

    @torch.inference_mode()
    def decode(self, tokens: list[int], seqs: list[int], lengths: list[int], cache: SequenceKVCache) -> torch.Tensor:
        """One new token per sequence: ``tokens[i]`` goes to position ``lengths[i]`` of
        sequence ``seqs[i]``; returns the logits ``(len(tokens), vocab)``."""
        ids = torch.tensor(tokens, device=self.device)
        positions = torch.tensor(lengths, device=self.device)
        slot_of = torch.tensor([s * cache.max_len + n for s, n in zip(seqs, lengths, strict=True)],
                               device=self.device)
        context = cache.context_slots(seqs, max(lengths) + 1)
        context_lens = positions + 1

        def attend_for(layer: int):
            k_store, v_store = cache.layer_kv(layer)

            def attend(q, k, v):
                k_store[slot_of], v_store[slot_of] = k, v
                return decode_attention(q, k_store, v_store, context, context_lens, self.scale)

            return attend

        return self._logits(self._layers(ids, positions, attend_for))
