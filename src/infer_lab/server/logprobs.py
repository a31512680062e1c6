"""Log-probabilities of the generated tokens, for ``logprobs`` / ``top_logprobs``.

They are computed after generation by one forward pass of transformers' model over the
prompt and the answer, in the tokenizer's threads (off the event loop): the engine's batched
steps stay as they are, and the numbers are the model's own distribution (before temperature
and top-p, as vLLM reports by default), whatever engine produced the tokens. The cost is one
prefill of prompt + answer per choice, only for the requests that ask.
"""

from __future__ import annotations

from typing import Any

import torch

# (logprob of the generated token, [(token id, logprob) of the k most likely], nats)
TokenScore = tuple[float, list[tuple[int, float]]]


@torch.inference_mode()
def score_tokens(
    model: Any, prompt_ids: list[int], answer_ids: list[int], top_k: int, device: Any = "cpu"
) -> list[TokenScore]:
    """Natural-log probability of each ``answer_ids[i]`` given everything before it, and the
    ``top_k`` most likely tokens at that position (``top_k`` may be 0)."""
    if not answer_ids:
        return []
    ids = torch.tensor([list(prompt_ids) + list(answer_ids)], device=device)
    # The last len(answer) + 1 positions predict the answer's tokens (the very last, nothing).
    logits = model(ids, logits_to_keep=len(answer_ids) + 1).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(answer_ids, device=logprobs.device)[:, None])[:, 0]
    if top_k:
        top_values, top_ids = logprobs.topk(top_k, dim=-1)
        tops = [
            list(zip(row_ids.tolist(), row_values.tolist(), strict=True))
            for row_ids, row_values in zip(top_ids, top_values, strict=True)
        ]
    else:
        tops = [[] for _ in answer_ids]
    return list(zip(chosen.tolist(), tops, strict=True))


def token_text(tokenizer: Any, token_id: int) -> str:
    """A token as text (a token that is part of a character decodes to U+FFFD)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def completion_logprobs(
    tokenizer: Any, answer_ids: list[int], scores: list[TokenScore], top_k: int
) -> dict[str, Any]:
    """The legacy ``/v1/completions`` shape: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = [token_text(tokenizer, t) for t in answer_ids]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [lp for lp, _ in scores],
        "top_logprobs": (
            [{token_text(tokenizer, t): lp for t, lp in top} for _, top in scores]
            if top_k
            else None
        ),
        "text_offset": offsets,
    }


def chat_logprobs(
    tokenizer: Any, answer_ids: list[int], scores: list[TokenScore]
) -> dict[str, Any]:
    """The ``/v1/chat/completions`` shape: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
            for t, (lp, top) in zip(answer_ids, scores, strict=True)
        ]
    }
