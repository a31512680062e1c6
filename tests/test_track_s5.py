"""Stage 5, the step loop: the starter fails, the solution passes (its runs stop every way there is, chunk
prompts, give rejected guesses' blocks back, reuse prefixes and survive a failing forward pass), near misses
are caught by name, and correct answers written differently pass."""

from __future__ import annotations

import pytest
from track_helpers import (
    assert_near_miss_caught,
    assert_variant_passes,
    check_text,
    failures,
    mutated,
    solution_result,
)

from infer_lab.course import track

KEY = "steploop"
STOPS = "stop ids, max_tokens, the context limit, cancellations, chunked prefill"


def _detail(result, case: str) -> str:
    return next(o.detail for o in result.outcomes if o.case == case)


def test_the_starter_is_not_done_and_the_solution_passes(tmp_path, track_solutions):
    starter = track.starter_path(track.stage(KEY)).read_text()
    assert check_text(KEY, starter, tmp_path).status == "todo"
    result = solution_result(track_solutions, KEY)
    assert result.passed, failures(result)
    assert result.tokens_identical and len(result.engine_runs) == 5
    # The traces exercise what they are there for (CI's seed).
    reasons = _detail(result, f"{STOPS}: finish reasons")
    for ending in ("cancelled", "length (max_tokens)", "length (the context limit)", "stop (a stop id)"):
        assert ending in reasons, reasons
    assert " 0 prompt chunk(s)" not in _detail(result, f"{STOPS}: the step loop, step by step")
    assert "stop (EOS)" in _detail(result, "chat prompts that stop at EOS: the step loop, step by step")
    spec = _detail(result, "n-gram speculation: the step loop, step by step")
    assert " 0 of " not in spec and " 0 guesses verified" not in spec, spec
    kept = _detail(result, "n-gram speculation, guesses kept: the step loop, step by step")
    assert " 0 kept" not in kept and " 0 guesses verified" not in kept, kept
    assert not _detail(result, "a radix prefix cache: prefix-cache hits").startswith("0 ")
    assert " error" in _detail(result, "a forward pass that fails: finish reasons")


NEAR_MISSES = [  # (name, old, new, what the check must say)
    ("num_computed-only-when-sampling",
     "        seq.num_computed = item.start + item.num_real_tokens\n        if not item.completes_context:\n"
     "            continue  # a prompt chunk: its K/V is cached, no token yet\n",
     "        if not item.completes_context:\n            continue  # a prompt chunk: its K/V is cached, no token yet\n"
     "        seq.num_computed = item.start + item.num_real_tokens\n",
     "set seq.num_computed = item.start + item.num_real_tokens"),
    ("a-token-for-every-chunk",
     "        if not item.completes_context:\n            continue  # a prompt chunk: its K/V is cached, no token yet\n", "",
     "so it has no row and samples nothing"),
    ("no-eos-check", "(token == eos_token_id and not p.ignore_eos) or ", "", "the token is the EOS id given"),
    ("eos-hard-coded", "token == eos_token_id and", "token == 2 and", "stop_reason(seq, token=2, eos_token_id=None"),
    ("max-tokens-off-by-one", "len(seq.output_ids) >= p.max_tokens", "len(seq.output_ids) > p.max_tokens",
     "it has all its new tokens"),
    ("stop-ids-ignored", " or token in p.stop_token_ids", "", "one of seq.params.stop_token_ids"),
    ("context-limit-ignored", " or seq.num_tokens >= max_model_len", "", "the context is full"),
    ("finish-does-not-free",
     '    engine.kv.free(seq, cache_prefix=reason in ("stop", "length"))  # a finished text may serve later prompts\n',
     "", "or they leak"),
    ("finish-keeps-it-scheduled", "    engine.scheduler.remove(seq)\n", "", "engine.scheduler.remove(seq)"),
    ("rejected-not-truncated", "            engine.kv.truncate(seq, seq.num_computed)  # the rejected guesses' blocks go back\n",
     "", "give the rejected guesses' blocks back with engine.kv.truncate"),
    ("kept-guesses-not-counted", "            seq.num_computed += kept  # the kept guesses' K/V is valid\n", "",
     "plus the 1 guess(es) kept"),
    ("prefix-never-offered", "        engine.kv.cache_prefix(seq)  # the prompt's K/V can serve other requests now\n", "",
     "offer its prompt to the cache with engine.kv.cache_prefix(seq)"),
    ("propose-never-called", "    engine.propose(batch)  # speculative decoding: guesses join the decoding requests\n", "",
     "call engine.propose(batch) before the forward pass"),
    ("prefill-done-never-set", "        seq.prefill_done = True\n", "", "seq.prefill_done is still False"),
    ("numpy-tokens", "            append(engine, seq, [token])\n",
     "            append(engine, seq, [__import__('numpy').int64(token)])\n",
     "append Python ints"),
]


@pytest.mark.parametrize("name, old, new, phrase", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_a_near_miss_is_caught(tmp_path, name, old, new, phrase):
    assert_near_miss_caught(KEY, old, new, phrase, tmp_path)


VARIANTS = {  # correct answers written differently
    "per-row-sampling": {
        "        tokens = engine.sampler.sample(logits[rows], [s.params for s in sampling], [s.generator for s in "
        "sampling])\n        for seq, token in zip(sampling, tokens, strict=True):\n            append(engine, seq, "
        "[token])\n":
        "        for seq, row in zip(sampling, rows, strict=True):\n"
        "            (token,) = engine.sampler.sample(logits[row : row + 1], [seq.params], [seq.generator])\n"
        "            append(engine, seq, [token])\n",
    },
}

TWO_PASSES = '''"""Stage 5 written another way: two passes (state, then tokens), generators, a set of stops."""

from infer_lab.engine.sequence import SequenceStatus


def stop_reason(seq, token, eos_token_id, max_model_len):
    stops = set(seq.params.stop_token_ids)
    if not seq.params.ignore_eos and eos_token_id is not None:
        stops.add(eos_token_id)
    if token in stops:
        return "stop"
    full = seq.num_tokens >= max_model_len
    return "length" if full or len(seq.output_ids) == seq.params.max_tokens else None


def finish(engine, seq, reason, error=None):
    seq.status = SequenceStatus.FINISHED
    seq.finish_reason = reason
    seq.error = error
    engine.kv.free(seq, cache_prefix=reason not in ("cancelled", "error"))
    engine.scheduler.remove(seq)


def _rows(batch):
    at = 0
    for item in batch.scheduled:
        if item.completes_context:
            yield item, at
            at += 1 + len(item.drafts)


def _push(engine, seq, tokens):
    for token in tokens:
        if not seq.prefill_done:
            seq.prefill_done = True
            engine.kv.cache_prefix(seq)
        seq.output_ids.append(int(token))
        why = stop_reason(seq, token, engine.eos_token_id, engine.max_model_len)
        if why:
            return finish(engine, seq, why)


def step(engine):
    batch = engine.scheduler.schedule()
    if not batch.scheduled:
        return batch
    engine.propose(batch)
    logits = engine.execute(batch)
    rows = list(_rows(batch))          # the rows, decided before any request changes
    for item in batch.scheduled:       # first pass: what the forward pass computed
        item.seq.num_computed = item.start + item.num_real_tokens
    plain = [(item, at) for item, at in rows if not item.drafts]
    if plain:                          # the plain decodes first, the speculating ones after
        picked = engine.sampler.sample(logits[[at for _, at in plain]], [i.seq.params for i, _ in plain],
                                       [i.seq.generator for i, _ in plain])
        for (item, _), token in zip(plain, picked):
            _push(engine, item.seq, (token,))
    for item, at in rows:
        if item.drafts:
            seq = item.seq
            tokens, kept = engine.sampler.verify(item.drafts, item.draft_probs, logits[at : at + 1 + len(item.drafts)],
                                                 seq.params, seq.generator)
            seq.num_computed += kept
            engine.kv.truncate(seq, seq.num_computed)
            _push(engine, seq, (t for t in tokens))
    return batch
'''

OWN_TRY = {  # a try/except of its own around the forward pass, the tokens as a tuple
    "    logits = engine.execute(batch)  # one row per request that completes its context (1 + k with k guesses)\n":
    "    try:\n        logits = engine.execute(batch)\n    except Exception as exc:\n"
    "        for item in batch.scheduled:\n            finish(engine, item.seq, \"error\", str(exc))\n"
    "        return batch\n",
    "        tokens = engine.sampler.sample(logits[rows], [s.params for s in sampling], [s.generator for s in sampling])\n":
    "        tokens = tuple(engine.sampler.sample(logits[rows], [s.params for s in sampling],\n"
    "                                             [s.generator for s in sampling]))\n",
}


@pytest.mark.parametrize("name", [*VARIANTS, "two-passes-file", "own-try-and-a-tuple"])
def test_a_correct_variant_passes(tmp_path, name):
    if name == "two-passes-file":
        text = TWO_PASSES
    else:
        text = mutated(KEY, OWN_TRY if name == "own-try-and-a-tuple" else VARIANTS[name])
    assert_variant_passes(KEY, text, tmp_path)
