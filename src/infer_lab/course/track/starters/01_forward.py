"""Stage 1 · The forward pass: a Llama-family decoder on real weights, and greedy decoding with a KV cache.

The engine calls one function of yours for every step: ``forward(model, token_ids, positions,
attend, rows)``. Its input is a *flat batch*: the new tokens of every request in the step, one
after the other (a 7-token chunk of one prompt, then one decoding token of each of three other
requests...), each with its own position. Everything in a decoder layer is per token except
attention, so your forward pass never needs to know where one request ends: it hands q, k and v
to ``attend``, which stores K/V in the engine's KV cache and attends each request's queries to
that request's own context.

One layer, for a flat batch ``h (T, hidden)``::

    x = rms_norm(h, input_norm)
    q | k | v = x @ qkv_proj.T (+ qkv_bias)       # q: heads * head_dim wide, k and v: kv_heads * head_dim
    q, k = apply_rope(q, positions), apply_rope(k, positions)
    h = h + attend(layer, q, k, v) @ o_proj.T
    x = rms_norm(h, post_attention_norm)
    gate | up = x @ gate_up_proj.T
    h = h + (silu(gate) * up) @ down_proj.T

then ``rms_norm(h, final_norm)`` and the LM head. Write the pieces first (``rms_norm``,
``apply_rope``, ``attention``), then ``forward``, then ``generate``: greedy decoding with a KV
cache of your own, which runs ``forward`` with an ``attend`` you write.

Two models check it: the embedded SmolLM2-135M, and a hidden model of another shape whose
layers have a q/k/v bias and whose LM head is not the embedding matrix. Read every size from
``model.shape``; add the bias when ``layer.qkv_bias`` is not None; multiply by ``model.lm_head``.

Dtypes: the weights are float32 (``model.embed.dtype``); ``model.inv_freq`` is float32 whatever
the weights are, and RoPE's angles are computed in float32. ``attend`` takes q, k, v in any float
dtype (the engine stores K/V in the model's dtype) and returns its output in q's dtype.
``forward`` returns float32 logits. Computing in float64 inside your functions is fine.

Check it: ``infer-lab check engine forward``. Your forward pass then runs inside the real engine,
with paged KV and chunked prefill, on hidden prompts, every token compared with transformers.
The library's version: ``forward_tokens`` in ``src/infer_lab/engine/model.py`` (its layer in
``src/infer_lab/engine/layers.py``).
"""

import torch
import torch.nn.functional as F  # noqa: F401  (F.linear, F.silu)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight``, the mean over the last dimension (each token's own values).

    ``x (T, hidden)``, ``weight (hidden,)``; returns ``(T, hidden)`` in x's dtype. transformers
    takes the mean in float32 whatever x's dtype is.
    """
    raise NotImplementedError


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: turn each pair of x's last dimension by its token's angle.

    ``x (T, heads, head_dim)``, ``positions (T,)`` int64 (any order, not necessarily from 0),
    ``inv_freq (head_dim/2,)`` float32. Pair ``i`` is ``(x[..., i], x[..., i + head_dim/2])``
    (transformers' "rotate half" convention, not neighbouring values), turned by the angle
    ``positions[t] * inv_freq[i]`` (in radians). Returns ``(T, heads, head_dim)`` in x's dtype.
    """
    raise NotImplementedError


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention of ``n`` queries over a context of ``ctx >= n`` positions.

    ``q (n, heads, d)``, ``k, v (ctx, kv_heads, d)``; ``heads`` is a multiple of ``kv_heads`` and
    consecutive query heads share a KV head (heads 0, 1, 2 read KV head 0 when there are 3 per
    group). The n queries are the LAST n positions of the context: query i sees positions
    ``0 .. ctx - n + i``. ``softmax(q k^T * scale) v``; returns ``(n, heads, d)``.
    """
    raise NotImplementedError


def forward(model, token_ids: torch.Tensor, positions: torch.Tensor, attend, rows: list[int]) -> torch.Tensor:
    """The decoder over a flat batch of ``T`` tokens; logits of the rows in ``rows``.

    Args:
        model: the weights. ``model.shape`` has ``heads``, ``kv_heads``, ``head_dim``,
            ``hidden``, ``layers``, ``vocab``, ``rms_norm_eps``; ``model.embed (vocab, hidden)``;
            ``model.layers[i]`` has ``input_norm``, ``qkv_proj`` (the q, k and v rows stacked:
            ``(heads*d + 2*kv_heads*d, hidden)``), ``qkv_bias`` (stacked the same way, or None),
            ``o_proj``, ``post_attention_norm``, ``gate_up_proj`` (gate rows, then up rows),
            ``down_proj``; ``model.final_norm``; ``model.lm_head (vocab, hidden)``;
            ``model.inv_freq``. Every matrix is ``(out, in)``: ``F.linear(x, w, b)`` is x @ w.T + b.
        token_ids, positions: ``(T,)`` int64: each token and its position in its own request.
        attend: ``attend(layer, q, k, v)`` with q ``(T, heads, d)`` and k, v ``(T, kv_heads, d)``
            after RoPE: stores K/V and returns each token's attention output ``(T, heads, d)``.
            Call it once per layer, with the layer's index.
        rows: which of the T rows need logits (the last token of each request, usually).
    Returns:
        float32 logits ``(len(rows), vocab)``.
    """
    raise NotImplementedError


def generate(model, prompt_ids: list[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
    """Greedy decoding with your forward pass and a KV cache of your own; the new token ids.

    Keep each layer's K and V of every position so far (tensors that grow by one row per
    token): the first ``forward`` call takes the whole prompt, every later one only the newest
    token at its position, and your ``attend`` appends the new K/V to the layer's cache and
    runs ``attention`` over all of it (scale ``head_dim ** -0.5``). Take the argmax of the last
    row's logits each time. Stop after ``max_new_tokens`` tokens, or after ``eos_token_id``
    (kept in the list) when it is not None.
    """
    raise NotImplementedError
