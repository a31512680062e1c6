"""Stage 5 · The step loop: a reference solution."""

from infer_lab.engine.sequence import SequenceStatus


def stop_reason(seq, token, eos_token_id, max_model_len):
    p = seq.params
    if (token == eos_token_id and not p.ignore_eos) or token in p.stop_token_ids:
        return "stop"
    if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None


def finish(engine, seq, reason, error=None):
    engine.scheduler.remove(seq)
    engine.kv.free(seq, cache_prefix=reason in ("stop", "length"))  # a finished text may serve later prompts
    seq.status = SequenceStatus.FINISHED
    seq.finish_reason, seq.error = reason, error
    seq.num_computed = 0


def step(engine):
    batch = engine.scheduler.schedule()
    if not batch.scheduled:
        return batch
    engine.propose(batch)  # speculative decoding: guesses join the decoding requests
    logits = engine.execute(batch)  # one row per request that completes its context (1 + k with k guesses)

    sampling, rows, at = [], [], 0
    for item in batch.scheduled:
        seq = item.seq
        seq.num_computed = item.start + item.num_real_tokens
        if not item.completes_context:
            continue  # a prompt chunk: its K/V is cached, no token yet
        n = 1 + len(item.drafts)
        if item.drafts:
            tokens, kept = engine.sampler.verify(item.drafts, item.draft_probs, logits[at : at + n], seq.params,
                                                 seq.generator)
            seq.num_computed += kept  # the kept guesses' K/V is valid
            engine.kv.truncate(seq, seq.num_computed)  # the rejected guesses' blocks go back
            append(engine, seq, tokens)
        else:
            sampling.append(seq)
            rows.append(at)
        at += n
    if sampling:
        tokens = engine.sampler.sample(logits[rows], [s.params for s in sampling], [s.generator for s in sampling])
        for seq, token in zip(sampling, tokens, strict=True):
            append(engine, seq, [token])
    return batch


def append(engine, seq, tokens):
    """Postprocess: the first token ends the prefill; tokens are appended up to the first stop."""
    if not seq.prefill_done:
        seq.prefill_done = True
        engine.kv.cache_prefix(seq)  # the prompt's K/V can serve other requests now
    for token in tokens:
        seq.output_ids.append(token)
        reason = stop_reason(seq, token, engine.eos_token_id, engine.max_model_len)
        if reason is not None:
            finish(engine, seq, reason)
            return
