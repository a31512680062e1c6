"""Stage 5's check: the step loop, ``stop_reason`` and ``finish`` alone, then the whole loop inside the engine.

1. ``stop_reason`` on fixed and hidden cases (EOS ids the learner never saw, ``ignore_eos``, stop
   ids, ``max_tokens`` and the one before it, the context limit, EOS on the last allowed token).
2. ``finish`` on requests of a running engine: out of the scheduler, every block's holder count
   down by one, status, reason and error set, a normally finished text offered to the prefix cache.
3. Inside the real engine (every other component the library's): the embedded model's chat prompts
   (EOS stops, chunked prefill), then hidden traces of the hidden model with odd block sizes: stop
   ids, ``max_tokens``, the context limit, cancellations mid-stream and chunked prefill; n-gram
   speculation (guesses verified, rejected blocks given back); a radix prefix cache; a forward pass
   that fails at one step. After every step: a prompt chunk that stops short moves ``num_computed``
   and samples nothing, a chunk that completes its context appends a token, ``num_computed`` is
   where the forward pass left it (plus the kept guesses), nothing is appended after a stop, every
   stop is taken, a finished request holds no blocks and is out of the scheduler. Then: tokens
   identical to transformers', finish reasons equal to the library step loop's on the same trace,
   prefix-cache hits not below the library's, and the pool full at the end.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from ...engine import Engine
from ...engine import step_loop as library_loop
from ...engine.sequence import SamplingParams, Sequence, SequenceStatus
from . import Stage, StageContext
from . import harness as h
from .boundary import BadResult, LearnerCodeError

QUESTIONS = ("hi", "What is 2+2?", "Reply with one word: yes or no?", "Thanks!")  # EOS at 11, 12 (= max), 3; length
CHAT_TOKENS = 12
REASONS = (None, "stop", "length")


def as_reason(result: Any, args: tuple, kwargs: dict) -> str | None:
    """``stop_reason``'s answer: None, ``"stop"`` or ``"length"``."""
    if result is None or result in ("stop", "length"):
        return result
    raise BadResult('expected None (it goes on), "stop" or "length"')


# ---------------------------------------------------------------------------------------------
# 1. stop_reason alone


@dataclass(frozen=True)
class _StopCase:
    prompt: int  # prompt tokens
    before: int  # output tokens before this one
    token: int
    eos: int | None
    max_tokens: int
    max_model_len: int
    ignore_eos: bool = False
    stop_ids: tuple[int, ...] = ()

    def sequence(self) -> Sequence:
        params = SamplingParams(max_tokens=self.max_tokens, ignore_eos=self.ignore_eos, stop_token_ids=self.stop_ids)
        seq = Sequence(request_id="r", prompt_ids=[7] * self.prompt, params=params, arrival_s=0.0)
        seq.output_ids = [8] * self.before + [self.token]
        return seq

    def text(self) -> str:
        extra = (", ignore_eos" if self.ignore_eos else "") + (f", stop_token_ids={self.stop_ids}" if self.stop_ids
                                                               else "")
        return (f"stop_reason(seq, token={self.token}, eos_token_id={self.eos}, max_model_len={self.max_model_len}) "
                f"where seq has {self.prompt} prompt tokens and {self.before + 1} new ones (the token included), "
                f"max_tokens={self.max_tokens}{extra}")


STOP_CASES = (
    _StopCase(10, 3, 2, 2, 16, 128),  # EOS
    _StopCase(10, 3, 2, 2, 16, 128, ignore_eos=True),  # EOS, ignored
    _StopCase(10, 3, 2, None, 16, 128),  # no EOS id
    _StopCase(10, 3, 57, 2, 16, 128, stop_ids=(9, 57)),  # a stop id
    _StopCase(10, 3, 57, 2, 16, 128, ignore_eos=True, stop_ids=(57,)),  # ignore_eos does not ignore stop ids
    _StopCase(10, 15, 40, 2, 16, 128),  # the 16th of max_tokens=16
    _StopCase(10, 14, 40, 2, 16, 128),  # the 15th
    _StopCase(10, 0, 40, 2, 1, 128),  # max_tokens=1
    _StopCase(10, 15, 2, 2, 16, 128),  # EOS on the last allowed token: stop
    _StopCase(100, 27, 40, 2, 64, 128),  # the context is full (128 tokens)
    _StopCase(100, 26, 40, 2, 64, 128),  # one short of it
    _StopCase(40, 3, 40, 2, 200, 40 + 4),
)


def _stop_hint(case: _StopCase, want: str | None, got: str | None) -> str:
    seq = case.sequence()
    eos = case.eos is not None and case.token == case.eos
    if want == "stop" and eos and not case.ignore_eos:
        if got == "length":
            return "it is EOS and its last allowed token at once: 'stop' (the request ended on its own)"
        return "the token is the EOS id given (eos_token_id) and ignore_eos is False: 'stop'"
    if want == "stop":
        return "the token is one of seq.params.stop_token_ids: 'stop' (ignore_eos ignores only EOS)"
    if want is None and got == "stop" and eos:
        return "ignore_eos is True: EOS does not end it (benchmarks use this)"
    if want is None and got == "stop":
        return "the token is neither EOS nor a stop id"
    if want == "length" and len(seq.output_ids) >= case.max_tokens:
        return (f"len(seq.output_ids) is {len(seq.output_ids)}, its max_tokens: it has all its new tokens (the token "
                "is already in output_ids)")
    if want == "length":
        return f"seq.num_tokens is {seq.num_tokens}, max_model_len: the context is full"
    if want is None and got == "length":
        if len(seq.output_ids) == case.max_tokens - 1:
            return (f"one token early: output_ids holds {len(seq.output_ids)} of max_tokens={case.max_tokens} (the "
                    "token is already appended)")
        if seq.num_tokens == case.max_model_len - 1:
            return f"one token early: the context holds {seq.num_tokens} of max_model_len={case.max_model_len}"
    return ""


def check_stop_reason(ctx: StageContext) -> None:
    """``stop_reason`` on the fixed cases and 16 hidden ones, against the library's answer."""
    rng = ctx.rng("stop")
    hidden = []
    for _ in range(16):
        prompt, max_tokens = rng.randint(1, 60), rng.randint(1, 40)
        before = rng.randint(0, max_tokens - 1)
        limit = prompt + before + 1 + rng.choice((0, 0, 1, rng.randint(2, 50)))
        eos = rng.choice((None, rng.randrange(400), rng.randrange(400)))
        token = eos if eos is not None and rng.random() < 0.4 else rng.randrange(400)
        stops = tuple(rng.sample(range(400), rng.randint(0, 3)))
        if stops and rng.random() < 0.3:
            token = stops[0]
        hidden.append(_StopCase(prompt, before, token, eos, max_tokens, limit, rng.random() < 0.3, stops))
    cases = STOP_CASES + tuple(hidden)
    fn = ctx.fn("stop_reason")
    name = f"stop_reason on {len(cases)} cases ({len(hidden)} hidden)"
    for case in cases:
        seq = case.sequence()
        want = library_loop.stop_reason(case.sequence(), case.token, case.eos, case.max_model_len)
        try:
            got = fn(seq, case.token, case.eos, case.max_model_len)
        except LearnerCodeError as exc:
            ctx.report.record(name, False, str(exc))
            return
        if got != want:
            hint = _stop_hint(case, want, got)
            ctx.report.record(name, False, f"{case.text()} returned {got!r}, expected {want!r}"
                              + (f": {hint}" if hint else ""))
            return
    ctx.report.record(name, True, "EOS (ids of the hidden models too), ignore_eos, stop ids, max_tokens and the "
                                  "context limit, each at and one before its bound")


# ---------------------------------------------------------------------------------------------
# 2. finish alone, on requests of a running engine


def check_finish(ctx: StageContext) -> None:
    """``finish`` with each reason on three requests of a running engine (hidden model, radix prefix cache)."""
    model = h.hidden()
    rng = ctx.rng("finish")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, prefix_cache="radix")
    engine = Engine.from_loaded(model.lm, config)  # the library's loop runs it; the learner's finish ends them
    prompts = [h.random_prompt(rng, model.vocab, rng.randint(8, 20)) for _ in range(3)]
    ids = [engine.add_request(p, SamplingParams(max_tokens=20, ignore_eos=True)) for p in prompts]
    for _ in range(3):
        engine.step()
    finish = ctx.fn("finish")
    name = "finish on running requests"
    kv = engine.kv
    for rid, reason, error in zip(ids, ("cancelled", "error", "length"), (None, "the check failed it", None),
                                  strict=True):
        seq = engine.requests[rid]
        table = list(seq.block_table)
        computed = seq.num_computed
        tree = engine.prefix_cache.tree_refs  # the prefix cache's own holds (offering a text adds some)
        others = {b: kv.blocks.ref_count(b) - tree.get(b, 0) for b in table}  # the requests' holds
        call = f"finish(engine, {rid}, {reason!r}, {error!r}) on a request that holds {len(table)} blocks"
        try:
            finish(engine, seq, reason, error)
        except LearnerCodeError as exc:
            ctx.report.record(name, False, str(exc))
            return
        held = [b for b in table if kv.blocks.ref_count(b) - tree.get(b, 0) != others[b] - 1]
        if seq.block_table or held:
            ctx.report.record(name, False, f"{call}: block(s) {held[:4] or seq.block_table[:4]} still held for it: give "
                                           "its blocks back with engine.kv.free(seq, ...), or they leak")
            return
        if seq in engine.scheduler.running or seq in engine.scheduler.waiting:
            ctx.report.record(name, False, f"{call}: it is still in the scheduler, which would schedule it again: "
                                           "engine.scheduler.remove(seq)")
            return
        if seq.status is not SequenceStatus.FINISHED or seq.finish_reason != reason or seq.error != error:
            ctx.report.record(name, False, f"{call}: status {seq.status.name}, finish_reason {seq.finish_reason!r}, "
                                           f"error {seq.error!r}; expected FINISHED, {reason!r}, {error!r}")
            return
        if reason == "length" and engine.prefix_cache is not None:
            reused = len(engine.prefix_cache.match(seq.all_ids))
            if reused < computed:
                ctx.report.record(name, False, f"{call}: its {computed} computed tokens were not offered to the prefix "
                                               f"cache ({reused} found there after): a request that ends normally "
                                               "(stop, length) frees with engine.kv.free(seq, cache_prefix=True), "
                                               "before anything resets its num_computed")
                return
    if engine.has_unfinished():
        ctx.report.record(name, False, "after finishing every request, engine.has_unfinished() is still True")
        return
    engine.reset_prefix_cache()
    ok = kv.all_blocks_free()
    ctx.report.record(name, ok, "out of the scheduler, blocks given back, status, reason and error set, a finished "
                                "text offered to the prefix cache" if ok else
                      f"{kv.num_used_blocks()} of {kv.num_blocks} KV blocks still held after every request finished")


# ---------------------------------------------------------------------------------------------
# 3. Inside the engine: the step loop watched after every step


class _Injected(RuntimeError):
    """The forward-pass failure the check injects into one step."""


class _Stop(RuntimeError):
    """The watch found a broken promise: the engine fails the step's requests and the run ends soon."""


@dataclass
class _Notes:
    problems: list[str] = field(default_factory=list)
    raised: list[str] = field(default_factory=list)
    steps: int = 0
    chunks: int = 0  # prompt chunks that stopped short of their context
    verified: int = 0  # requests that verified guesses
    truncated: int = 0  # of which gave blocks back
    cancels: int = 0


def _why(seq: Sequence, token: int, reason: str, engine: Any) -> str:
    p = seq.params
    if reason == "stop":
        return (f"it is the EOS id {engine.eos_token_id}" if token == engine.eos_token_id and not p.ignore_eos
                else f"it is one of the stop ids {tuple(p.stop_token_ids)}")
    if len(seq.output_ids) >= p.max_tokens:
        return f"it is new token {len(seq.output_ids)} of max_tokens={p.max_tokens}"
    return f"the context is full: {seq.num_tokens} tokens, max_model_len={engine.max_model_len}"


def _row_hint(engine: Any, live: list[Sequence], exc: LearnerCodeError) -> str:
    """A hint when indexing the logits failed in a step with a prompt chunk that stops short (it has no row)."""
    batch = engine.scheduler.last
    if not isinstance(exc.__cause__, IndexError) or batch is None:
        return ""
    short = [item for item in batch.scheduled if item.start + item.num_real_tokens < item.seq.num_tokens]
    if not short:
        return ""
    item = short[0]
    return (f"\n    hint: this step's logits have one row per item that completes its context, in batch order; "
            f"{item.seq.request_id}'s chunk (positions {item.start}..{item.start + item.num_real_tokens - 1} of "
            f"{item.seq.num_tokens}) stops short, so it has no row and samples nothing (item.completes_context)")


class _Watch:
    """The step loop the engine runs: the learner's (guarded), every step checked after it returns."""

    def __init__(self, ctx: StageContext, notes: _Notes):
        inner = ctx.part("step_loop")
        self.inner, self.notes = inner, notes

    def finish(self, engine: Any, seq: Sequence, reason: str, error: str | None = None) -> None:
        """The engine's own calls (a cancellation, a failed step): checked before its fallback tidies up."""
        try:
            self.inner.finish(engine, seq, reason, error)
        except LearnerCodeError as exc:  # the engine would tidy up after it silently: say so here
            self.notes.raised.append(str(exc))
            raise
        if reason == "cancelled":
            self.notes.cancels += 1
        if seq.block_table and not self.notes.problems:
            self.notes.problems.append(f"your finish(engine, {seq.request_id}, {reason!r}) left it holding "
                                       f"{len(seq.block_table)} KV blocks: give them back with engine.kv.free(seq, ...)")
        elif seq.status is not SequenceStatus.FINISHED and not self.notes.problems:
            self.notes.problems.append(f"your finish(engine, {seq.request_id}, {reason!r}) left its status "
                                       f"{seq.status.name}: set seq.status = SequenceStatus.FINISHED")

    def step(self, engine: Any) -> Any:
        live = [s for s in engine.requests.values() if s.finish_reason is None]
        before = {id(s): (len(s.output_ids), s.num_tokens) for s in live}
        try:
            out = self.inner.step(engine)
        except LearnerCodeError as exc:
            if not isinstance(exc.__cause__, _Injected):
                self.notes.raised.append(str(exc) + _row_hint(engine, live, exc))
            raise
        self.notes.steps += 1
        problem = None if self.notes.problems else self._broken(engine, live, before)
        if problem:
            self.notes.problems.append(f"step {self.notes.steps - 1}: {problem}")
            raise _Stop(problem)
        return out

    def _broken(self, engine: Any, live: list[Sequence], before: dict[int, tuple[int, int]]) -> str | None:
        batch = engine.scheduler.last
        items = list(batch.scheduled) if batch is not None else []
        scheduled = {id(item.seq) for item in items}
        for seq in live:
            if id(seq) not in scheduled and len(seq.output_ids) != before[id(seq)][0]:
                return f"{seq.request_id} was not scheduled in this step, but tokens were appended to it"
        bs = engine.kv.block_size
        for item in items:
            seq = item.seq
            if seq.finish_reason == "error" or id(seq) not in before:
                continue
            n0, total = before[id(seq)]
            rid, new = seq.request_id, seq.output_ids[n0:]
            done = seq.finish_reason is not None
            span = f"positions {item.start}..{item.start + item.num_real_tokens - 1} of its {total} tokens"
            if item.start + item.num_real_tokens < total:  # it did not complete its context (judged before the step)
                self.notes.chunks += 1
                if new:
                    return (f"{rid} computed a prompt chunk ({span}) that stops short of its last token, yet a token "
                            "was appended to it: only an item whose chunk completes its context "
                            "(item.completes_context) has a logits row and samples a token")
                if seq.num_computed != item.start + item.num_real_tokens:
                    return (f"{rid} computed a prompt chunk ({span}) but its num_computed is {seq.num_computed}: set "
                            f"seq.num_computed = item.start + item.num_real_tokens ({item.start + item.num_real_tokens})"
                            " after the forward pass: that chunk's K/V is in the cache now")
                continue
            if not new:
                return (f"{rid}'s chunk ({span}) completed its context, but no token was appended to it: sample one "
                        "from its logits row")
            odd = next((t for t in new if type(t) is not int), None)
            if odd is not None:
                return (f"{rid} got a token of type {type(odd).__name__} ({odd!r}): append Python ints (int(token)); "
                        "the engine streams them to clients as JSON")
            if not item.drafts and len(new) > 1:
                return f"{rid} had one logits row but {len(new)} tokens were appended to it"
            shadow = Sequence(rid, list(seq.prompt_ids), seq.params, 0.0, output_ids=list(seq.output_ids[:n0]))
            reason = None
            for j, token in enumerate(new):
                shadow.output_ids.append(token)
                reason = library_loop.stop_reason(shadow, token, engine.eos_token_id, engine.max_model_len)
                if reason is not None and j < len(new) - 1:
                    return (f"{rid}: token {token} at output position {n0 + j} ends it ('{reason}': "
                            f"{_why(shadow, token, reason, engine)}), yet {len(new) - 1 - j} more token(s) were "
                            "appended after it: stop at the first")
            token = new[-1]
            if reason is not None and not done:
                return (f"{rid}: token {token} at output position {len(seq.output_ids) - 1} ends it ('{reason}': "
                        f"{_why(shadow, token, reason, engine)}), but it goes on: ask stop_reason after each token "
                        "appended and finish the request when it says so")
            if done and seq.finish_reason in ("stop", "length") and reason != seq.finish_reason:
                if reason is None:
                    p = seq.params
                    return (f"{rid} finished with '{seq.finish_reason}' after token {token} at output position "
                            f"{len(seq.output_ids) - 1}, but nothing ends it there (max_tokens={p.max_tokens}, "
                            f"{seq.num_tokens} of max_model_len={engine.max_model_len} tokens, not EOS or a stop id)")
                return f"{rid} finished with '{seq.finish_reason}' where it is '{reason}'"
            if done:
                if seq.block_table:
                    return (f"{rid} finished ({seq.finish_reason}) but still holds {len(seq.block_table)} KV blocks: "
                            "finish must give them back (engine.kv.free(seq, ...)), or they leak")
                if seq in engine.scheduler.running or seq in engine.scheduler.waiting:
                    return (f"{rid} finished ({seq.finish_reason}) but is still in the scheduler, which would "
                            "schedule it again: finish must call engine.scheduler.remove(seq)")
                if seq.status is not SequenceStatus.FINISHED:
                    return f"{rid} finished ({seq.finish_reason}) but its status is {seq.status.name}: FINISHED"
                continue
            kept = len(new) - 1 if item.drafts else 0
            want = item.start + item.num_real_tokens + kept
            if seq.num_computed != want:
                how = (f"item.start + item.num_real_tokens, plus the {kept} guess(es) kept" if item.drafts
                       else "item.start + item.num_real_tokens")
                return (f"{rid} computed {span} and got a token, but its num_computed is {seq.num_computed}, not "
                        f"{want} ({how})")
            if not seq.prefill_done:
                return (f"{rid} has its first token, but seq.prefill_done is still False: its prefill ended, set it "
                        "(and offer its prompt to the prefix cache: engine.kv.cache_prefix(seq))")
            if item.drafts:
                self.notes.verified += 1
                need = math.ceil(seq.num_computed / bs)
                if len(seq.block_table) > need:
                    return (f"{rid} verified {len(item.drafts)} guess(es) and kept {kept}, but it still holds "
                            f"{len(seq.block_table)} blocks for its {seq.num_computed} computed tokens (blocks of {bs}, "
                            f"{need} needed): give the rejected guesses' blocks back with engine.kv.truncate(seq, "
                            "seq.num_computed)")
                if len(seq.block_table) < math.ceil((item.start + item.num_new_tokens) / bs):
                    self.notes.truncated += 1
        return None


@dataclass(frozen=True)
class _Library:
    """The library step loop's run of a trace."""

    outputs: tuple[tuple[int, ...], ...]
    reasons: tuple[str | None, ...]
    hits: int
    proposed: int
    accepted: int


_LIBRARY: dict[Any, _Library] = {}


def _ending(result: h.Run, i: int) -> str:
    """How request ``i`` of a run ended, in words: ``stop (EOS)``, ``length (context limit)``..."""
    reason, out = result.finish_reasons[i], result.outputs[i]
    params, engine = result.trace.params[i], result.engine
    if reason == "stop":
        return "stop (EOS)" if out and out[-1] == engine.eos_token_id else "stop (a stop id)"
    if reason == "length":
        full = len(result.trace.prompts[i]) + len(out) >= engine.max_model_len
        return "length (the context limit)" if full and len(out) < params.max_tokens else "length (max_tokens)"
    return str(reason)


def _injector(fail_at: int | None) -> Any:
    """An ``on_step`` that makes the forward pass of step ``fail_at`` raise (None: never)."""

    def fail(batch: Any) -> Any:
        raise _Injected("the forward pass failed (the check made it fail)")

    def on_step(engine: Any, steps: int) -> None:
        if steps == fail_at:
            engine.execute = fail
        elif "execute" in vars(engine):
            del engine.execute

    return on_step


def _run(model: h.CheckModel, config: Any, parts: Any, trace: h.Trace, fail_at: int | None) -> h.Run:
    return h.run(model, config, parts, trace, on_step=_injector(fail_at))


def _library_run(model: h.CheckModel, config: Any, trace: h.Trace, fail_at: int | None) -> _Library:
    key = (model.name, config, tuple(map(tuple, trace.prompts)), tuple(trace.params), tuple(trace.arrivals),
           tuple(sorted(trace.cancel_at.items())), fail_at)
    if key not in _LIBRARY:
        result = _run(model, config, None, trace, fail_at)
        if not result.finished:
            raise RuntimeError(f"the library step loop did not finish {trace.describe()}: {result.crash}")
        engine = result.engine
        _LIBRARY[key] = _Library(tuple(map(tuple, result.outputs)), tuple(result.finish_reasons),
                                 engine.prefix_cache.stats.hit_tokens if engine.prefix_cache is not None else 0,
                                 engine.spec_totals["proposed_tokens"], engine.spec_totals["accepted_tokens"])
    return _LIBRARY[key]


def _expected(model: h.CheckModel, trace: h.Trace, max_model_len: int) -> h.Trace:
    """``trace`` with each request's max_tokens cut to where it must stop: the context limit, its first stop id."""
    params = []
    for prompt, p in zip(trace.prompts, trace.params, strict=True):
        limit = min(p.max_tokens, max_model_len - len(prompt))
        ref = h.reference(model, prompt, replace(p, max_tokens=limit, stop_token_ids=()))
        stop = next((j + 1 for j, t in enumerate(ref.tokens) if t in p.stop_token_ids), len(ref.tokens))
        params.append(replace(p, max_tokens=max(1, min(limit, stop)), stop_token_ids=()))
    return replace(trace, params=params)


def _engine_case(ctx: StageContext, label: str, model: h.CheckModel, config: Any, trace: h.Trace,
                 fail_at: int | None = None, library: bool = True) -> bool:
    """One trace through the engine with the learner's step loop; records its cases, True if all pass."""
    r = ctx.report
    notes = _Notes()
    lib = _library_run(model, config, trace, fail_at) if library else None
    parts = ctx.parts(step_loop=_Watch(ctx, notes))
    result = _run(model, config, parts, trace, fail_at)
    name = f"inside the engine ({label}: {trace.describe()}, blocks of {config.block_size})"
    if notes.raised:
        return r.record(name, False, notes.raised[0])
    if notes.problems:
        return r.record(f"{label}: the step loop, step by step", False, notes.problems[0])
    if fail_at is None:
        expected = _expected(model, trace, result.engine.max_model_len)
        if not h.compare(r, name, replace(result, trace=expected)):
            return False
    ok = True
    if lib is not None:
        got = tuple(result.finish_reasons)
        wrong = [i for i in range(len(got)) if got[i] != lib.reasons[i]]
        if fail_at is not None and not wrong:
            wrong = [i for i in range(len(got)) if tuple(result.outputs[i]) != lib.outputs[i]]
        if wrong:
            i = wrong[0]
            what = ("a failing forward pass fails only its step's requests" if fail_at is not None else
                    "the same trace, the same scheduler: the same ending")
            return r.record(f"{label}: finish reasons", False,
                            f"request {i} ended with {got[i]!r} after {len(result.outputs[i])} tokens; with the library "
                            f"step loop, {lib.reasons[i]!r} after {len(lib.outputs[i])}: {what}")
        counts = ", ".join(f"{k} {kind}" for kind, k in sorted(Counter(
            _ending(result, i) for i in range(len(got))).items()))
        failed = f" (the forward pass of step {fail_at} failed)" if fail_at is not None else ""
        ok = r.record(f"{label}: finish reasons", True, f"{counts}{failed}, as with the library step loop")
        if config.speculative and lib.proposed and not result.engine.spec_totals["proposed_tokens"]:
            return r.record(f"{label}: speculative guesses", False, f"no guess was ever verified; with the library "
                            f"step loop, {lib.proposed}: call engine.propose(batch) before the forward pass (it gives "
                            "the decoding requests their guesses when speculation is on)")
        if config.prefix_cache != "none":
            hits = result.engine.prefix_cache.stats.hit_tokens
            ok = r.record(f"{label}: prefix-cache hits", hits >= lib.hits,
                          f"{hits} prompt tokens reused from the prefix cache, the library step loop {lib.hits}"
                          + ("" if hits >= lib.hits else ": when a request's prefill ends (its first token), offer its "
                             "prompt to the cache with engine.kv.cache_prefix(seq), so the requests that arrive while "
                             "it decodes reuse it")) and ok
    detail = f"checked after each of {notes.steps} steps: {notes.chunks} prompt chunk(s) that sampled nothing"
    if config.speculative:
        totals = result.engine.spec_totals
        detail += (f", {totals['proposed_tokens']} guesses verified and {totals['accepted_tokens']} kept, "
                   f"{notes.truncated} of {notes.verified} verifications gave rejected guesses' blocks back")
    if notes.cancels:
        detail += f", {notes.cancels} cancellation(s) through your finish"
    if lib is None:
        detail += "; endings: " + ", ".join(f"{k} {kind}" for kind, k in sorted(Counter(
            _ending(result, i) for i in range(len(result.outputs))).items()))
    ok = r.record(f"{label}: the step loop, step by step", True, detail) and ok
    return h.pool_full(r, f"{label}: the pool is full again after the run", result) and ok


def _lookup_prompt(rng: random.Random, model: h.CheckModel, length: int) -> list[int]:
    """A prompt in which prompt lookup finds guesses, right ones and wrong ones.

    It repeats a few short phrases (guesses the model may follow), and each token the model answers
    it with appears earlier followed by something else (guesses it rejects, so a verification gives
    blocks back).
    """
    phrases = [h.random_prompt(rng, model.vocab, rng.randint(2, 4)) for _ in range(3)]
    prompt: list[int] = []
    while len(prompt) < length:
        prompt += rng.choice(phrases)
    prompt = prompt[:length]
    answer = h.reference(model, prompt, SamplingParams(max_tokens=12, ignore_eos=True)).tokens
    for t in dict.fromkeys(answer):  # "t, something else" in the first half: after the model says t, lookup guesses wrong
        at = rng.randrange(1, max(2, length // 2))
        prompt[at:at] = [t, *h.random_prompt(rng, model.vocab, 2)]
    return prompt


def _stop_trace(ctx: StageContext, model: h.CheckModel, n: int, max_model_len: int) -> h.Trace:
    """A hidden trace where every way to end happens: the context limit (the longest prompt, with max_tokens
    beyond it), stop ids its greedy continuation reaches (three requests), max_tokens, and two cancellations
    (the first request to arrive and the last, a few steps after they arrive)."""
    rng = ctx.rng("stops-ids")
    trace = h.random_trace(ctx.subseed("stops-trace"), model.vocab, n=n, prompt_lens=(14, 40), new_tokens=(4, 20),
                           arrival_steps=5, ignore_eos=False, name="a hidden trace")
    longest = max(range(n), key=lambda i: len(trace.prompts[i]))
    trace.params[longest] = replace(trace.params[longest], max_tokens=max_model_len)
    order = sorted((i for i in range(n) if i != longest), key=lambda i: (trace.arrivals[i], i))
    first, last = order[0], order[-1]
    trace.cancel_at = {first: trace.arrivals[first] + rng.randint(3, 6), last: trace.arrivals[last] + rng.randint(3, 6)}
    for i in rng.sample(order[1:-1], 3):
        p = trace.params[i]
        limit = min(p.max_tokens, max_model_len - len(trace.prompts[i]))
        tokens = h.reference(model, trace.prompts[i], replace(p, max_tokens=limit)).tokens
        trace.params[i] = replace(p, stop_token_ids=(tokens[rng.randrange(len(tokens))], rng.randrange(4, model.vocab)))
    return trace


def check_engine(ctx: StageContext) -> None:
    """The learner's step loop inside the engine: four hidden traces of the hidden model, then the chat prompts."""
    model = h.hidden()
    n = 9 if ctx.full else 7

    rng = ctx.rng("stops")
    max_model_len = 48
    config = h.engine_config(block_size=rng.choice((3, 5, 7)), max_model_len=max_model_len, chunked_prefill=True,
                             max_num_batched_tokens=rng.randint(7, 13))
    trace = _stop_trace(ctx, model, n, max_model_len)
    _engine_case(ctx, "stop ids, max_tokens, the context limit, cancellations, chunked prefill", model, config, trace)

    rng = ctx.rng("spec")
    bs = rng.choice((3, 5))  # 4 tokens of a step with 3 guesses often take a block of their own
    config = h.engine_config(block_size=bs, max_model_len=96, speculative="ngram", num_speculative_tokens=3)
    prompts = [_lookup_prompt(rng, model, rng.randint(16, 36)) for _ in range(n - 2)]
    params = [SamplingParams(max_tokens=rng.randint(10, 30), ignore_eos=True) for _ in prompts]
    trace = h.Trace("prompts that repeat phrases", prompts, params, [rng.randint(0, 4) for _ in prompts])
    _engine_case(ctx, "n-gram speculation", model, config, trace)

    # Guesses the target keeps: SmolLM2 copies a text it has seen three times (the hidden model's
    # random weights never follow a lookup's guess, so there every guess is rejected).
    rng = ctx.rng("grounded")
    embedded = h.embedded()
    phrases = [h.random_prompt(rng, embedded.vocab, 12, low=1000) for _ in range(2)]
    prompts = [p * 3 + p[:4] for p in phrases]
    trace = h.Trace("prompts of a phrase said three times (the model copies it)", prompts,
                    [SamplingParams(max_tokens=10, ignore_eos=True) for _ in prompts])
    config = h.engine_config(block_size=rng.choice((3, 5)), max_model_len=96, speculative="ngram",
                             num_speculative_tokens=3)
    _engine_case(ctx, "n-gram speculation, guesses kept", embedded, config, trace)

    rng = ctx.rng("prefix")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, prefix_cache="radix")
    trace = h.random_trace(ctx.subseed("prefix-trace"), model.vocab, n=n - 2, prompt_lens=(16, 30), new_tokens=(3, 8),
                           shared_prefix=rng.randint(9, 15), name="a hidden trace with a shared system prompt")
    trace.params[0] = replace(trace.params[0], max_tokens=28)  # the first decodes while the others arrive
    trace.arrivals = [0] + [rng.randint(3, 8) for _ in range(n - 3)]
    _engine_case(ctx, "a radix prefix cache", model, config, trace)

    rng = ctx.rng("failure")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, max_num_seqs=3)
    trace = h.random_trace(ctx.subseed("failure-trace"), model.vocab, n=5, prompt_lens=(6, 20), new_tokens=(6, 12),
                           arrival_steps=3, name="a hidden trace")
    _engine_case(ctx, "a forward pass that fails", model, config, trace, fail_at=rng.randint(2, 5))

    chat = h.chat_trace(QUESTIONS, max_tokens=CHAT_TOKENS)
    config = h.engine_config(block_size=5, max_model_len=64, chunked_prefill=True, max_num_batched_tokens=16)
    _engine_case(ctx, "chat prompts that stop at EOS", h.embedded(), config, chat, library=False)


def check(ctx: StageContext) -> None:
    """Stage 5's check: the cheap parts first (stop_reason, finish), then the engine runs."""
    check_stop_reason(ctx)
    check_finish(ctx)
    check_engine(ctx)


STAGE = Stage(
    number=5, key="steploop", title="The step loop", file="05_step_loop.py",
    components={"step_loop": None}, chapter="09", reads=("09", "10", "12"), minutes=75,
    task="One engine step: schedule, run the forward pass, sample (or verify speculative guesses), move num_computed, "
         "append tokens up to the first stop, and finish requests (their blocks back, out of the scheduler).",
    check=check, requires=("stop_reason", "finish", "step"), adapters={"stop_reason": as_reason},
    symbol="src/infer_lab/engine/step_loop.py",
)
