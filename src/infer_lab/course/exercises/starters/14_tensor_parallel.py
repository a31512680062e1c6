"""Chapter 14 · Tensor parallelism: exercises.

Fill in each function, then run `infer-lab check 14`. Bandwidths are bytes/s in one
direction, latencies seconds.

The last two functions are the build exercise: your split of a layer and your decoder layer
run inside the chapter's tensor-parallel runtime, on 2 processes (`infer-lab check 14 --only
tp_engine`). You may use the imports below.
"""

import torch  # noqa: F401  (for shard_layer)
import torch.nn.functional as F  # noqa: F401  (for tp_decoder_layer)

from infer_lab.engine.layers import LayerWeights, attention_inputs, rms_norm  # noqa: F401


def ring_allreduce_s(n_ranks: int, message_bytes: int, bus_bandwidth_Bps: float, hop_latency_s: float,
                     base_latency_s: float) -> float:
    """Seconds for a ring all-reduce of ``message_bytes`` held by each of ``n_ranks`` GPUs.

    The ring reduce-scatters, then all-gathers: N-1 steps each, and in every step each rank
    sends 1/N of the message to its neighbour (``bus_bandwidth_Bps``) and pays one hop's
    latency. The collective also costs ``base_latency_s`` to launch. One rank: 0 s.
    """
    raise NotImplementedError


def tp_decode_allreduces(layers: int, hidden: int, batch: int, bytes_per_value: int) -> tuple[int, int]:
    """Predict the all-reduces of one tensor-parallel decode step of ``batch`` sequences.

    Each layer's attention output and MLP output are partial sums across the ranks, to be
    added up before the next step of the layer; each is one vector of ``hidden`` values per
    token.

    Returns:
        ``(count, bytes of each)``.
    """
    raise NotImplementedError


def kv_copies(kv_heads: int, tp: int, mla: bool) -> float:
    """Predict how many copies of the model's KV cache a TP group of ``tp`` GPUs holds in all.

    Ranks split the KV heads: each rank holds the heads its query heads need, and a KV head
    cannot be split (ranks may hold different numbers of heads, as the chapter's TP engine
    splits SmolLM2's 3 KV heads 2 + 1 on 2 ranks). With more ranks than KV heads, each rank
    holds one head (vLLM's way; the chapter's engine refuses). An MLA model caches one latent
    per token that every head needs. 1.0 means no duplication.
    """
    raise NotImplementedError


def shard_layer(w: LayerWeights, plan, share) -> LayerWeights:
    """One decoder layer's weights for one tensor-parallel rank.

    ``w`` is the full layer, as the engine stores it (``torch.nn.functional.linear`` layout:
    ``(out_features, in_features)``):

    - ``qkv_proj`` stacks the rows of q (``plan.heads x plan.head_dim``), then k, then v
      (``plan.kv_heads x plan.head_dim`` each); ``qkv_bias`` (or None) stacks the same way;
    - ``o_proj`` is ``(hidden, heads x head_dim)``;
    - ``gate_up_proj`` stacks the rows of gate, then up (``plan.intermediate`` each);
    - ``down_proj`` is ``(hidden, intermediate)``;
    - ``input_norm`` and ``post_attention_norm`` are RMSNorm weights.

    ``share`` says what this rank owns, as ``[start, end)`` ranges: ``share.q_heads``,
    ``share.kv_heads`` (whole KV groups: its query heads and the KV heads they read) and
    ``share.mlp`` (its intermediate columns). Split q/k/v and gate/up so that this rank computes
    only its own heads and MLP columns, and o and down so that each rank's output is a partial
    sum of the full ``hidden`` output. Return a ``LayerWeights`` with the same fields.
    """
    raise NotImplementedError


def tp_decoder_layer(h, w, attend, cos, sin, shard, comm):
    """One decoder layer on one rank; every rank runs it at once on the same ``h``.

    ``h`` is the full residual stream ``(tokens, hidden)``, the same on every rank; ``w`` this
    rank's weights (your ``shard_layer``). ``attention_inputs(h, w.input_norm, w.qkv_proj,
    w.qkv_bias, cos, sin, eps, heads, kv_heads, head_dim)`` gives this rank's q, k, v
    ``(tokens, heads, head_dim)`` for its head counts (``shard.share.n_heads``,
    ``shard.share.n_kv_heads``; ``shard.shape`` has ``rms_norm_eps`` and ``head_dim``), and
    ``attend(q, k, v)`` the attention output of those heads. Then o, the post-attention RMSNorm,
    the SiLU-gated MLP and down, each sublayer added to ``h`` (the residual).

    ``comm.all_reduce(t)`` sums ``t`` over the ranks (in place) and returns it; it is the only
    communication. Place it where a rank holds a partial sum. Returns the new ``h``: the same
    on every rank, and equal to the unsplit layer's output.
    """
    raise NotImplementedError
