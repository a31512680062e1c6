"""Stage 8 · Tensor parallelism on two processes: split each layer over the ranks, then run it.

Tensor parallelism (Megatron-LM's split) cuts every decoder layer's matmuls across
``world_size`` ranks, one process each. The unit of attention that can move to a rank on its
own is a *KV group*: one KV head and the query heads that read it. The library's plan
(:func:`infer_lab.parallel.shard.plan_shards`) hands each rank a contiguous run of whole KV
groups and of MLP columns, larger runs first: SmolLM2's 3 KV heads go 2 + 1 on 2 ranks (query
heads 0-5 and 6-8), 1 + 1 + 1 on 3. You get each rank's ranges; you write the rest:

* **column-parallel** (output rows split): q|k|v and gate|up. A rank computes only its own
  heads and its own MLP columns; nothing is exchanged inside attention.
* **row-parallel** (input columns split): o and down. A rank's output is a *partial sum* of
  the full ``hidden`` vector; ``comm.all_reduce`` adds the ranks' partial sums. That is the only
  communication: two all-reduces per layer, each of ``tokens x hidden`` values.
* **replicated**: the RMSNorm weights (and the embedding and LM head, which the runtime keeps).

Write ``shard_layer`` first (it cuts one layer's weights for one rank), then
``tp_decoder_layer`` (one rank's layer). Dtypes: the engine's model is float32 here; your
slices keep the weights' dtype, and your layer returns ``h`` in ``h``'s dtype and shape.

Check it: ``infer-lab check engine tp``. Your split is compared with the library's on several
models and rank counts (SmolLM2 on 2 and 3 ranks, a hidden model shape with a q/k/v bias, a
random shape); your layer runs on ranks simulated by threads, then in the library's
tensor-parallel runtime on **2 real processes** (gloo) over SmolLM2 and the hidden model, every
token compared with transformers' greedy output, with 2 all-reduces per layer in every step.
The library's versions: ``src/infer_lab/parallel/shard.py::shard_layer`` and
``src/infer_lab/parallel/layers.py::tp_decoder_layer``. Tensor parallelism is not part of the
single-process serving engine, so ``infer-lab serve --engine mine`` does not use this file.
"""

import torch  # noqa: F401  (for shard_layer)
import torch.nn.functional as F  # noqa: F401  (for tp_decoder_layer)

from infer_lab.engine.layers import LayerWeights, attention_inputs, rms_norm  # noqa: F401


def shard_layer(w: LayerWeights, plan, share) -> LayerWeights:
    """One decoder layer's weights for one tensor-parallel rank.

    ``w`` is the full layer as the engine stores it (``torch.nn.functional.linear`` layout,
    ``(out_features, in_features)``):

    - ``qkv_proj`` stacks the rows of q (``plan.heads x plan.head_dim``), then k, then v
      (``plan.kv_heads x plan.head_dim`` each); ``qkv_bias`` (a vector, or ``None`` for a
      model without one) stacks the same way;
    - ``o_proj`` is ``(plan.hidden, plan.heads x plan.head_dim)``;
    - ``gate_up_proj`` stacks the rows of gate, then up (``plan.intermediate`` each);
    - ``down_proj`` is ``(plan.hidden, plan.intermediate)``;
    - ``input_norm`` and ``post_attention_norm`` are RMSNorm weights ``(plan.hidden,)``.

    ``plan`` is the whole split (:class:`~infer_lab.parallel.shard.ShardPlan`: every size, and
    ``plan.world_size``); ``share`` what this rank owns, as ``[start, end)`` ranges:
    ``share.q_heads``, ``share.kv_heads`` (whole KV groups: its query heads and the KV heads they
    read) and ``share.mlp`` (its intermediate columns); ``share.rank`` is its number.

    Split q|k|v (and its bias) and gate|up by output rows so that this rank computes only its
    own heads and MLP columns, stacked in the same order (q, k, v; gate, up); split o and down
    by input columns so that each rank's output is a partial sum of the full ``hidden`` output.
    Keep the norms whole. Returns a ``LayerWeights`` with the same fields, in ``w``'s dtype.
    """
    raise NotImplementedError


def tp_decoder_layer(h, w, attend, cos, sin, shard, comm):
    """One decoder layer on one rank; every rank runs it at once, on the same ``h``.

    ``h`` is the full residual stream ``(tokens, hidden)``, the same on every rank; ``w`` this
    rank's weights (your ``shard_layer``). ``attention_inputs(h, w.input_norm, w.qkv_proj,
    w.qkv_bias, cos, sin, eps, heads, kv_heads, head_dim)`` gives this rank's q, k, v
    ``(tokens, heads, head_dim)`` for its own head counts (``shard.share.n_heads``,
    ``shard.share.n_kv_heads``; ``shard.shape`` has ``rms_norm_eps`` and ``head_dim``), and
    ``attend(q, k, v)`` the attention output of those heads (it also writes k and v into this
    rank's KV cache): ``(tokens, heads x head_dim)`` in a prefill step, ``(tokens, heads,
    head_dim)`` in a decode step, so flatten it from dim 1. Then o, the post-attention RMSNorm, the
    SiLU-gated MLP and down, each sublayer's output added to the residual ``h``, as in the
    unsplit layer.

    ``comm.all_reduce(t)`` sums ``t`` over the ranks (in place; it also returns ``t``); every
    rank must make the same calls, in the same order, on tensors of one shape, or the processes
    wait for each other forever. ``comm.rank`` and ``comm.world_size`` say where you are. Place
    the all-reduces where a rank holds a partial sum. Returns the new ``h`` ``(tokens, hidden)``:
    the same on every rank, and equal to the unsplit layer's output.
    """
    raise NotImplementedError
