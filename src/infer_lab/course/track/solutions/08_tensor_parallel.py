"""Stage 8 · Tensor parallelism on two processes: a reference solution."""

import torch
import torch.nn.functional as F

from infer_lab.engine.layers import LayerWeights, attention_inputs, rms_norm


def shard_layer(w: LayerWeights, plan, share) -> LayerWeights:
    """q|k|v and gate|up by output rows (column-parallel), o and down by input columns (row-parallel)."""
    d = plan.head_dim
    (q0, q1), (kv0, kv1), (m0, m1) = share.q_heads, share.kv_heads, share.mlp
    k_start = plan.heads * d  # the k rows follow every q row
    v_start = (plan.heads + plan.kv_heads) * d  # the v rows follow every k row
    up_start = plan.intermediate  # the up rows follow every gate row

    def qkv_rows(t):  # this rank's query heads, and the K and V heads they read
        if t is None:
            return None
        return torch.cat([t[q0 * d:q1 * d], t[k_start + kv0 * d:k_start + kv1 * d],
                          t[v_start + kv0 * d:v_start + kv1 * d]])

    return LayerWeights(
        input_norm=w.input_norm,  # replicated: every rank normalizes the full h
        qkv_proj=qkv_rows(w.qkv_proj),
        qkv_bias=qkv_rows(w.qkv_bias),
        o_proj=w.o_proj[:, q0 * d:q1 * d],  # the input features of this rank's heads
        post_attention_norm=w.post_attention_norm,
        gate_up_proj=torch.cat([w.gate_up_proj[m0:m1], w.gate_up_proj[up_start + m0:up_start + m1]]),
        down_proj=w.down_proj[:, m0:m1],  # the input features of this rank's MLP columns
    )


def tp_decoder_layer(h, w, attend, cos, sin, shard, comm):
    """Local attention on this rank's heads, then two partial sums, each all-reduced before the residual."""
    shape, share = shard.shape, shard.share
    eps = shape.rms_norm_eps
    q, k, v = attention_inputs(h, w.input_norm, w.qkv_proj, w.qkv_bias, cos, sin, eps,
                               share.n_heads, share.n_kv_heads, shape.head_dim)
    attn = attend(q, k, v).flatten(1)  # (tokens, this rank's heads x head_dim): no communication
    h = h + comm.all_reduce(F.linear(attn, w.o_proj))  # the ranks' partial sums, added, then the residual
    x = rms_norm(h, w.post_attention_norm, eps)
    gate, up = F.linear(x, w.gate_up_proj).chunk(2, dim=-1)
    return h + comm.all_reduce(F.linear(F.silu(gate) * up, w.down_proj))
