"""Stage 5 · The step loop: one engine step is schedule -> forward -> sample -> postprocess -> free.

Three functions make a request's life in the engine:

* ``step(engine)``: one step for every scheduled request;
* ``finish(engine, seq, reason, error=None)``: a request leaves (it stopped, was cancelled, or failed);
* ``stop_reason(seq, token, eos_token_id, max_model_len)``: does this new token end its request?

They only change the state of requests (:class:`infer_lab.engine.sequence.Sequence`): their tokens,
``num_computed``, ``prefill_done``, status and finish reason. The engine around them holds the
lock, times each new token and streams it to its client, keeps the speculative proposer in step
and logs the step, by looking at what changed; so none of that is yours to do. It also calls your
``finish`` when a client cancels a request, and when your ``step`` raises it fails that step's
requests (a failing forward pass fails only them): let ``engine.execute`` raise.

What ``step`` uses of the ``engine``:

* ``engine.scheduler.schedule() -> SchedulerOutput``: who runs and how many tokens each; their KV
  blocks are allocated. Each ``item`` of ``batch.scheduled`` computes ``item.num_new_tokens``
  tokens of ``item.seq`` from position ``item.start``: ``item.num_real_tokens`` of its own, then
  ``len(item.drafts)`` speculative guesses. ``item.completes_context`` is True when the chunk
  reaches the request's last token: only then does it get logits (a prompt chunk that stops
  short gets none, and no token).
* ``engine.propose(batch)``: call it before the forward pass; with speculative decoding on it
  gives decoding requests their guesses (``item.drafts``, ``item.draft_probs``); otherwise it
  does nothing.
* ``engine.execute(batch) -> logits``: the forward pass. ``logits`` is a float32 tensor
  ``(rows, vocab)``: one row per item that completes its context, ``1 + len(item.drafts)`` rows
  for an item with guesses, in the order of ``batch.scheduled`` (items that do not complete their
  context have no rows).
* ``engine.sampler.sample(logits, params, generators) -> list[int]``: one token per row
  (``params`` and ``generators``: lists, one per row: ``seq.params``, ``seq.generator``).
  ``engine.sampler.verify(drafts, draft_probs, logits, params, generator) -> (tokens, kept)``:
  for an item with guesses, its ``1 + k`` rows: the tokens to append (the kept guesses, then one
  of the target's own) and how many guesses were kept.
* ``engine.kv``: ``free(seq, cache_prefix=...)`` gives back a request's blocks (offering its
  computed tokens to the prefix cache first when ``cache_prefix``); ``truncate(seq, n)`` keeps
  only the blocks of its first ``n`` tokens; ``cache_prefix(seq)`` offers its computed tokens to
  the prefix cache (both do nothing without one).
* ``engine.eos_token_id`` (an int, or None) and ``engine.max_model_len`` (tokens).

After the forward pass, every scheduled request's K/V is cached up to ``item.start +
item.num_real_tokens``: that is its ``seq.num_computed`` now (plus the guesses it kept). Guesses
that were not kept leave blocks behind: give them back (``engine.kv.truncate``). A request's
first token ends its prefill: set ``seq.prefill_done`` and offer its prompt to the prefix cache
(``engine.kv.cache_prefix(seq)``), so later requests with the same prefix reuse it. Append tokens
one at a time and ask ``stop_reason`` after each: at the first stop, ``finish`` the request and
append nothing more.

Check it: ``infer-lab check engine steploop``. Your step loop then runs inside the real engine on
hidden traces (EOS, stop ids, ``max_tokens``, the context limit, cancellations, chunked prefill,
speculative decoding, a prefix cache, a failing forward pass), with every token compared with
transformers and every finish reason with the library's. The library's version:
``src/infer_lab/engine/step_loop.py``.
"""

from infer_lab.engine.scheduler import SchedulerOutput  # noqa: F401
from infer_lab.engine.sequence import Sequence, SequenceStatus  # noqa: F401


def stop_reason(seq: Sequence, token: int, eos_token_id: int | None, max_model_len: int) -> str | None:
    """Why ``seq`` ends now that ``token`` was appended to it (it is ``seq.output_ids[-1]``), or None.

    ``"stop"``: the token is EOS (``eos_token_id``, unless ``seq.params.ignore_eos``) or one of
    ``seq.params.stop_token_ids``. ``"length"``: the request has its ``seq.params.max_tokens`` new
    tokens, or its context is full (``seq.num_tokens`` reached ``max_model_len``). When both hold,
    ``"stop"`` (the request ended on its own).
    """
    raise NotImplementedError


def finish(engine, seq: Sequence, reason: str, error: str | None = None) -> None:
    """``seq`` leaves the engine; ``reason`` is ``"stop"``, ``"length"``, ``"cancelled"`` or ``"error"``.

    Take it out of the scheduler (``engine.scheduler.remove``), give its KV blocks back
    (``engine.kv.free``; a request that ended normally, ``stop`` or ``length``, offers its text
    to the prefix cache), and set ``seq.status = SequenceStatus.FINISHED``, ``seq.finish_reason``
    and ``seq.error`` (``error`` says why, for ``"error"``).
    """
    raise NotImplementedError


def step(engine) -> SchedulerOutput:
    """One engine step: schedule, propose, execute, sample, postprocess; returns the batch scheduled.

    Nothing scheduled: return the (empty) batch at once.
    """
    raise NotImplementedError
