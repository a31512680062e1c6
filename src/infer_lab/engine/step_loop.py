"""The step loop: one engine step is schedule -> forward -> sample -> postprocess -> free.

Three functions make a request's life, and they are the interface the course's build track asks a
learner to write (stage 5):

* :func:`step`: schedule the next step, run one forward pass over it, sample, append the new
  tokens, and finish the requests that reached a stop;
* :func:`finish`: a request leaves: out of the scheduler, its KV blocks back (its finished text
  offered to the prefix cache), its status and reason set;
* :func:`stop_reason`: whether a new token ends its request (EOS, a stop id, ``max_tokens``, the
  context limit).

They only change the state of requests (:class:`~.sequence.Sequence`): tokens, ``num_computed``,
status. The engine around them (:mod:`.engine`) holds the lock, times every token, streams it to
its callback, keeps the speculative proposer in step with each request and logs the step, by
looking at what changed. So none of that is repeated here.

``engine`` is the :class:`~.engine.Engine`; a step uses its ``scheduler``, ``kv``, ``sampler``,
``execute(batch)`` (the forward pass), ``propose(batch)`` (speculative guesses, when on),
``eos_token_id`` and ``max_model_len``.
"""

from __future__ import annotations

from typing import Any

import torch

from .scheduler import SchedulerOutput
from .sequence import Sequence, SequenceStatus


def stop_reason(seq: Sequence, token: int, eos_token_id: int | None, max_model_len: int) -> str | None:
    """Why ``seq`` ends now that ``token`` was appended to it, or None when it goes on.

    ``"stop"``: EOS (unless ``ignore_eos``) or one of its stop ids; ``"length"``: ``max_tokens`` new
    tokens, or the context is full (``max_model_len`` tokens).
    """
    p = seq.params
    if (token == eos_token_id and not p.ignore_eos) or token in p.stop_token_ids:
        return "stop"
    if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None


def finish(engine: Any, seq: Sequence, reason: str, error: str | None = None) -> None:
    """``seq`` leaves the engine: ``reason`` is ``stop``, ``length``, ``cancelled`` or ``error``."""
    engine.scheduler.remove(seq)
    # A finished text's K/V can serve a later request's prefix; a cancelled or failed one's is not kept.
    engine.kv.free(seq, cache_prefix=reason in ("stop", "length"))
    seq.status = SequenceStatus.FINISHED
    seq.finish_reason, seq.error = reason, error
    seq.num_computed = 0


def step(engine: Any) -> SchedulerOutput:
    """One step for every scheduled request; returns what was scheduled.

    After the forward pass each scheduled request has its new tokens' K/V in the cache
    (``num_computed`` moves on). A request whose chunk reaches its last token gets logits: one
    row, or ``1 + k`` rows when it carries ``k`` speculative guesses.
    """
    batch = engine.scheduler.schedule()  # who runs, how many tokens each; their KV blocks are allocated
    if not batch.scheduled:
        return batch
    engine.propose(batch)  # speculative decoding only: guesses join the decoding requests
    try:
        logits = engine.execute(batch)  # one forward pass over every scheduled token
    except Exception as exc:  # a failing pass fails this step's requests, not the engine
        for item in batch.scheduled:
            finish(engine, item.seq, "error", f"engine step failed: {type(exc).__name__}: {exc}")
        return batch

    # A NaN or an Inf anywhere in a row makes its sum non-finite: one pass, one device-to-host copy for all rows.
    finite = torch.isfinite(logits.sum(dim=-1)).tolist()
    sampling, rows, at = [], [], 0  # requests that sample one token, and each one's logits row
    for item in batch.scheduled:
        seq = item.seq
        if engine.kv.stores_kv:
            seq.num_computed = item.start + item.num_real_tokens
        if not item.completes_context:
            continue  # a prompt chunk: its K/V is cached, no token yet
        n = 1 + len(item.drafts)
        if not all(finite[at : at + n]):
            finish(engine, seq, "error", "the model produced NaN/Inf logits")
        elif item.drafts:
            try:
                tokens, kept = engine.sampler.verify(item.drafts, item.draft_probs, logits[at : at + n],
                                                     seq.params, seq.generator)
            except Exception as exc:  # one request's sampling fault must not fail its neighbours
                finish(engine, seq, "error", f"sampling failed: {type(exc).__name__}: {exc}")
            else:
                seq.num_computed += kept  # the kept guesses' K/V is valid
                engine.kv.truncate(seq, seq.num_computed)  # the rejected guesses' blocks go back
                _append(engine, seq, tokens)
        else:
            sampling.append(seq)
            rows.append(at)
        at += n
    for seq, token in _sample(engine, sampling, logits[rows]) if sampling else ():
        _append(engine, seq, [token])
    return batch


def _sample(engine: Any, seqs: list[Sequence], logits: torch.Tensor) -> list[tuple[Sequence, int]]:
    """One token per request, all rows in one call; if that call fails, request by request, so a
    request whose sampling fails finishes with the error and the others go on."""
    try:
        tokens = engine.sampler.sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        return list(zip(seqs, tokens, strict=True))
    except Exception:
        pass
    out = []
    for i, seq in enumerate(seqs):
        try:
            out.append((seq, engine.sampler.sample(logits[i : i + 1], [seq.params], [seq.generator])[0]))
        except Exception as exc:
            finish(engine, seq, "error", f"sampling failed: {type(exc).__name__}: {exc}")
    return out


def _append(engine: Any, seq: Sequence, tokens: list[int]) -> None:
    """Postprocess: the first token ends the prefill; append tokens up to the first stop."""
    if not seq.prefill_done:
        seq.prefill_done = True
        engine.kv.cache_prefix(seq)  # the prompt's K/V can now serve other requests
    for token in tokens:
        seq.output_ids.append(token)
        reason = stop_reason(seq, token, engine.eos_token_id, engine.max_model_len)
        if reason is not None:
            finish(engine, seq, reason)
            return
