"""Stage 4's check: the scheduler, its two guided rules alone, then the whole class inside the engine.

1. ``admit_tokens`` (chapter 09's admission) on fixed and hidden cases: never over the budget or
   what the request has, never a chunk whose blocks are not free, never a wait when the whole
   chunk fits. A smaller chunk that fits when the whole one does not is a policy of its own
   (the largest chunk that fits, say) and passes.
2. ``split_budget`` (chapter 11's chunked prefill) on fixed and hidden cases: one count per
   running request, none over what it has, the budget neither exceeded nor left unused while a
   request still has tokens, no decode starved behind a younger prompt.
3. Inside the real engine, the learner's ``Scheduler`` with every other component the library's,
   on hidden traces of the hidden model (odd block sizes): chunked prefill over a tight pool
   (preemption, a cancellation), no chunking over a small pool, static batching, a radix prefix
   cache; then the embedded model's chat prompts. After every ``schedule()``: each request
   starts at its ``num_computed`` with its blocks allocated, none scheduled twice or after it
   finished, at most ``max_num_seqs`` running, no waiting request holding blocks, the budget
   kept, static batches closed. Then: every token identical to transformers', every request
   finished, no more steps than the library scheduler's x 1.1 on the same trace and config,
   prefix-cache hits not below the library's, and the pool full at the end.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...engine.scheduler import ScheduledSequence, SchedulerOutput
from ...engine.sequence import Sequence
from . import Stage, StageContext
from . import harness as h
from .boundary import BadResult, LearnerCodeError, as_bool, as_count, as_int, as_int_list, describe

STEP_FACTOR = 1.1  # a learner's scheduler may take at most this many times the library's steps
QUESTIONS = ("hi", "Say OK.", "What is 2+2?", "Reply with one word: yes or no?")

# admit_tokens: (tokens to compute, token budget left or None, most tokens whose blocks are free)
ADMIT_CASES = ((20, None, 100), (20, None, 19), (40, 16, 100), (40, 16, 10), (12, 16, 100), (5, 5, 5),
               (7, 3, 2), (1, 1, 0), (30, None, 0), (9, 4, 4))
# split_budget: (tokens each running request has to compute, oldest first; the step's budget or None)
SPLIT_CASES = (([1, 1, 40], 16), ([1, 1, 26], 16), ([1, 1, 12], 16), ([30, 1], 16), ([1, 1, 40], None),
               ([], 16), ([], None), ([5], 8), ([1, 1, 1], 2), ([1, 9, 1], 5), ([52], None))


# ---------------------------------------------------------------------------------------------
# The engine takes the learner's schedule() as a SchedulerOutput


def as_scheduler_output(result: Any, args: tuple, kwargs: dict) -> SchedulerOutput:
    """A :class:`SchedulerOutput` from what ``schedule()`` returned: its ``scheduled`` and ``preempted``
    may be lists, tuples or generators; an item is a :class:`ScheduledSequence` or a
    ``(seq, start, num_new_tokens)`` tuple; counts may be any whole numbers."""
    if not hasattr(result, "scheduled"):
        raise BadResult("expected a SchedulerOutput(scheduled=[ScheduledSequence(seq, start, num_new_tokens), ...])")
    try:
        items = list(result.scheduled)
        preempted = list(getattr(result, "preempted", None) or ())
    except TypeError:
        raise BadResult("its scheduled and preempted must be lists of requests") from None
    scheduled = []
    for item in items:
        if isinstance(item, ScheduledSequence):
            item.start, item.num_new_tokens = as_int(item.start, args, kwargs), as_int(item.num_new_tokens, args, kwargs)
            scheduled.append(item)
        elif isinstance(item, (tuple, list)) and len(item) == 3 and isinstance(item[0], Sequence):
            scheduled.append(ScheduledSequence(item[0], as_int(item[1], args, kwargs), as_int(item[2], args, kwargs)))
        else:
            raise BadResult(f"an item of scheduled is {describe(item)}: expected ScheduledSequence(seq, start, "
                            "num_new_tokens)")
    if any(not isinstance(s, Sequence) for s in preempted):
        raise BadResult("preempted must list requests (Sequence objects)")
    idle = getattr(result, "idle_slots", 0)
    return SchedulerOutput(scheduled, preempted, as_int(idle, args, kwargs) if idle is not None else 0)


# ---------------------------------------------------------------------------------------------
# 1-2. The guided rules alone


def _admit_mistake(tokens: int, budget: int | None, free: int, got: int, asked: list[int]) -> str | None:
    """What is wrong with ``admit_tokens``' answer (None: nothing); ``free`` tokens' blocks are free."""
    chunk = tokens if budget is None else min(tokens, budget)
    where = (f"admit_tokens(tokens_to_compute={tokens}, token_budget={budget}, fits) where fits(n) is n <= {free} "
             f"returned {got}")
    if got > tokens:
        return f"{where}: more than the {tokens} tokens the request has"
    if budget is not None and got > budget:
        return f"{where}: over what is left of the budget ({budget}): cut the chunk to the budget"
    if got > free:
        return (f"{where}: fits({got}) is False, the KV cache cannot hold those tokens (the engine would raise "
                "OutOfKVMemory): return 0, so the request waits")
    if budget is None and 0 < got < tokens:
        return (f"{where}: with token_budget None chunked prefill is off, and a prompt is computed whole: all "
                f"{tokens} tokens, or 0 when they do not fit")
    if got == 0 and chunk <= free:
        why = (f" (you asked fits({asked[0]}), but the chunk to schedule is {chunk} tokens)"
               if asked and chunk not in asked else "")
        return f"{where}: the request waited although a chunk of {chunk} tokens fits{why}"
    if 0 < got < chunk and chunk <= free:
        return (f"{where}: the whole chunk of {chunk} tokens fits the budget and the free blocks: a chunk takes all "
                "the budget leaves (a smaller one costs steps)")
    return None


def check_admit(ctx: StageContext) -> None:
    """``admit_tokens`` on the fixed cases and 10 hidden ones (token counts; ``fits`` by free tokens)."""
    rng = ctx.rng("admit")
    hidden = []
    for _ in range(10):
        tokens = rng.randint(1, 80)
        hidden.append((tokens, rng.choice((None, rng.randint(1, 32))), rng.randint(0, 100)))
    cases = ADMIT_CASES + tuple(hidden)
    fn = ctx.fn("admit_tokens")
    for tokens, budget, free in cases:
        asked: list[int] = []

        def fits(n: int, free: int = free, asked: list[int] = asked) -> bool:
            asked.append(n)
            return n <= free

        try:
            got = fn(tokens, budget, fits)
        except LearnerCodeError as exc:
            ctx.report.record("admit_tokens", False, str(exc))
            return
        wrong = _admit_mistake(tokens, budget, free, got, asked)
        if wrong:
            ctx.report.record(f"admit_tokens on {len(cases)} cases ({len(hidden)} hidden)", False, wrong)
            return
    ctx.report.record(f"admit_tokens on {len(cases)} cases ({len(hidden)} hidden)", True,
                      "within the budget and the free blocks, and nobody who fits left waiting")


def _split_mistake(tokens: list[int], budget: int | None, got: list[int]) -> str | None:
    """What is wrong with ``split_budget``' answer (None: nothing)."""
    you = f"split_budget({tokens}, {budget}) returned {got}"
    if len(got) != len(tokens):
        return f"{you}: one count per running request ({len(tokens)}), in the same order"
    for i, (n, t) in enumerate(zip(got, tokens, strict=True)):
        if n < 0:
            return f"{you}: request {i} gets {n} tokens, below zero (is the budget spent before it is cut to it?)"
        if n > t:
            return f"{you}: request {i} has only {t} tokens to compute"
    if budget is None:
        return None if got == list(tokens) else (f"{you}: with no budget (None: chunked prefill is off) every "
                                                 "running request computes all it has, however long")
    total = sum(got)
    if total > budget:
        i = next(k for k in range(len(got)) if sum(got[: k + 1]) > budget)
        left = budget - sum(got[:i])
        if got[i] == tokens[i] and got[i] > 1:
            hint = (f"request {i}, a prompt being prefilled, got its whole remainder of {got[i]} tokens with only "
                    f"{left} left of the budget: cut it to a chunk of what is left, the rest follows in later steps")
        elif got[i] == min(tokens[i], budget):
            hint = (f"request {i} was cut to the whole budget of {budget}, not to the {left} tokens the requests "
                    "before it left: take each request's tokens off the budget as you go")
        else:
            hint = f"request {i} got {got[i]} tokens with {left} left of the budget"
        return f"{you}, {total} tokens, over the budget of {budget}: {hint}"
    if total < min(sum(tokens), budget):
        i = next(k for k in range(len(got)) if got[k] < tokens[k])
        return (f"{you}: {budget - total} of the budget's {budget} tokens unused while request {i} still has "
                f"{tokens[i] - got[i]} to compute: each request takes what it has, cut to what is left of the "
                "budget (a chunk smaller than that is a wasted step)")
    for j, (n, t) in enumerate(zip(got, tokens, strict=True)):
        if t == 1 and n == 0 and any(got[i] > 0 for i in range(j + 1, len(got))):
            return (f"{you}: request {j} decodes (1 token) and gets nothing while a younger request gets a chunk: a "
                    "decode waits behind a prompt, the stall chunked prefill is there to end; serve the running "
                    "requests oldest first")
    return None


def check_split(ctx: StageContext) -> None:
    """``split_budget`` on the fixed cases and 12 hidden ones (token counts per running request)."""
    rng = ctx.rng("split")
    hidden = []
    for _ in range(12):
        tokens = [1 if rng.random() < 0.5 else rng.randint(2, 60) for _ in range(rng.randint(1, 6))]
        hidden.append((tokens, rng.choice((None, rng.randint(1, 40)))))
    cases = SPLIT_CASES + tuple(hidden)
    fn = ctx.fn("split_budget")
    for tokens, budget in cases:
        try:
            got = fn(list(tokens), budget)
        except LearnerCodeError as exc:
            ctx.report.record("split_budget", False, str(exc))
            return
        wrong = _split_mistake(list(tokens), budget, got)
        if wrong:
            ctx.report.record(f"split_budget on {len(cases)} cases ({len(hidden)} hidden)", False, wrong)
            return
    ctx.report.record(f"split_budget on {len(cases)} cases ({len(hidden)} hidden)", True,
                      "oldest first, the budget used up to what the requests have and never exceeded")


# ---------------------------------------------------------------------------------------------
# 3. Inside the engine: the scheduler watched at every schedule()


class _Stop(RuntimeError):
    """The watch found a broken promise: the engine fails the step's requests and the run ends."""


class _CountingKV:
    """The engine's KV cache as the learner's scheduler sees it: every call passed on, some counted."""

    COUNTED = ("can_allocate", "allocate", "free", "attach_prefix", "detach_prefix")

    def __init__(self, kv: Any):
        self._kv = kv
        self.calls: Counter[str] = Counter()
        self.attached: set[int] = set()  # requests attach_prefix was called for

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._kv, name)
        if name not in self.COUNTED:
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "attach_prefix" and args:
                self.attached.add(id(args[0]))
            return value(*args, **kwargs)

        return counted


@dataclass
class _Notes:
    """What the watch saw over one run."""

    problems: list[str] = field(default_factory=list)
    raised: list[str] = field(default_factory=list)  # what the learner's code raised inside the engine
    kvs: list[_CountingKV] = field(default_factory=list)
    schedules: int = 0
    preempted: int = 0
    short_chunks: list[str] = field(default_factory=list)  # steps that left budget unused beside a short chunk


class _Watch:
    """The scheduler the engine sees: the learner's (guarded), every ``schedule()`` checked after it returns."""

    def __init__(self, inner: Any, kv: Any, counting: _CountingKV, config: Any, notes: _Notes):
        self.inner, self.kv, self.counting, self.config, self.notes = inner, kv, counting, config, notes
        self.seqs: list[Sequence] = []
        self.admitted: set[int] = set()  # requests scheduled since they last held no blocks

    def add(self, seq: Sequence) -> None:
        self.seqs.append(seq)
        self.inner.add(seq)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def schedule(self) -> SchedulerOutput:
        live = [s for s in self.seqs if s.finish_reason is None]  # finish_reason: set once, by finish alone
        before = set(self.admitted)
        try:
            out = self.inner.schedule()
        except LearnerCodeError as exc:
            self.notes.raised.append(str(exc))
            raise
        self.notes.schedules += 1
        problem = self._broken(out, live, before)
        if problem:
            self.notes.problems.append(f"step {self.notes.schedules - 1}: {problem}")
            raise _Stop(problem)
        return out

    def _broken(self, out: SchedulerOutput, live: list[Sequence], before: set[int]) -> str | None:
        cfg, bs = self.config, self.kv.block_size
        seen: set[int] = set()
        preempted = {id(p) for p in out.preempted}
        for item in out.scheduled:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            rid = seq.request_id
            if id(seq) in seen:
                return f"{rid} is scheduled twice in one step"
            seen.add(id(seq))
            if id(seq) in preempted:
                return (f"{rid} is scheduled in this step and also preempted in it: its blocks were given back "
                        "after it was scheduled, so the forward pass would write into blocks it no longer holds. "
                        "Preempt a request that is not scheduled yet (the library takes the newest running one, "
                        "whose turn comes last)")
            if seq.finish_reason is not None:
                return (f"{rid} is scheduled, but it finished ({seq.finish_reason}): remove(seq) must take it out "
                        "of the queue and the running list")
            if n < 1:
                return f"{rid} is scheduled with num_new_tokens={n}: leave a request that computes nothing out of it"
            if start != seq.num_computed:
                return (f"{rid} is scheduled from position {start}, but its K/V is cached up to seq.num_computed="
                        f"{seq.num_computed}: start there (read it after attach_prefix, which may move it)")
            if start + n > seq.num_tokens:
                return (f"{rid} has {seq.num_tokens} tokens, {seq.num_computed} of them computed, but the step "
                        f"computes {n} more: at most seq.num_tokens - seq.num_computed")
            if len(seq.block_table) * bs < start + n:
                return (f"{rid}'s blocks hold {len(seq.block_table) * bs} tokens, but the step writes positions "
                        f"{start}..{start + n - 1}: call kv.allocate(seq, {n}) (after kv.can_allocate says yes) "
                        "before scheduling it")
            if not cfg.chunked_prefill and not item.completes_context:
                return (f"{rid} computes {n} of the {seq.num_tokens - start} tokens it has left, but chunked prefill "
                        "is off: a prompt is computed whole, in one step (with token_budget None, admit_tokens "
                        "returns all of it, or 0 when it does not fit)")
        for seq in live:
            if not seq.block_table and seq.num_computed:
                return (f"{seq.request_id} holds no KV blocks but its num_computed is {seq.num_computed}: after "
                        "kv.free(seq) (a preemption), set seq.num_computed = 0: its K/V is gone, it is recomputed "
                        "from the start")
        total = out.num_tokens
        budget = cfg.max_num_batched_tokens if cfg.chunked_prefill else None
        if budget is not None and total > budget:
            return (f"{total} tokens are scheduled, over the budget of {budget} (config.max_num_batched_tokens): "
                    "the running requests take their share first, the waiting ones what is left")
        scheduled = {id(item.seq) for item in out.scheduled}
        joiners = [item.seq.request_id for item in out.scheduled if id(item.seq) not in before]
        if cfg.policy == "static" and joiners:
            batch = [s.request_id for s in live if id(s) in before]
            if batch:
                return (f"static batching let {', '.join(joiners)} join while {', '.join(batch)} of the current "
                        "batch still run: a static batch takes nobody until all of it has finished")
        self.admitted |= scheduled
        self.notes.preempted += len({id(s) for s in live if id(s) in before and not s.block_table})
        for seq in live:
            if not seq.block_table:
                self.admitted.discard(id(seq))
        for seq in live:
            if seq.block_table and id(seq) not in self.admitted:
                how = (": kv.attach_prefix(seq) gave it a cached prefix's blocks; when it then waits (it does not "
                       "fit), kv.detach_prefix(seq) gives them back" if id(seq) in self.counting.attached else "")
                return (f"{seq.request_id} is waiting (it was not scheduled) but holds {len(seq.block_table)} KV "
                        f"blocks that no one else can use{how}")
        running = [s.request_id for s in live if id(s) in self.admitted]
        for name, want in (("running", len(running)), ("waiting", len(live) - len(running))):
            queue = getattr(self.inner, name, None)
            if queue is None or not hasattr(queue, "__len__"):
                return (f"your Scheduler has no {name} list: keep the running requests in self.running and the "
                        "waiting ones in self.waiting (the server reports their lengths on /metrics)")
            done = [s for s in list(queue) if getattr(s, "finish_reason", None) is not None]
            if done:
                return (f"self.{name} still holds {done[0].request_id}, which finished ({done[0].finish_reason}): "
                        "remove(seq) must take it out of the queue and the running list")
            if len(queue) != want:
                return (f"self.{name} holds {len(queue)} requests, but {want} are {name} (scheduled since they last "
                        "held no blocks, or not): keep the two lists up to date")
        if len(running) > cfg.max_num_seqs:
            return (f"{len(running)} requests are running ({', '.join(running)}), more than max_num_seqs="
                    f"{cfg.max_num_seqs}: a request joins only while a batch slot is free")
        if budget is not None and total < budget and not any(id(s) in before and not s.block_table for s in live):
            for item in out.scheduled:
                left = item.seq.num_tokens - item.start - item.num_new_tokens
                extra = min(budget - total, left)
                if extra > 0 and self.kv.can_allocate(item.seq, item.num_new_tokens + extra):
                    self.notes.short_chunks.append(
                        f"step {self.notes.schedules - 1} computed {total} of the budget's {budget} tokens while "
                        f"{item.seq.request_id} got a chunk of {item.num_new_tokens} with {left} more tokens to "
                        f"compute, whose blocks were free: a chunk takes all the budget leaves")
                    break
        return None


def _watched(ctx: StageContext, notes: _Notes) -> Callable[..., _Watch]:
    """The scheduler factory for the engine: the learner's class, guarded and watched."""
    make = ctx.part("scheduler")

    def build(config: Any, kv: Any) -> _Watch:
        counting = _CountingKV(kv)
        notes.kvs.append(counting)
        return _Watch(make(config, counting), kv, counting, config, notes)

    return build


@dataclass(frozen=True)
class _Library:
    """The library scheduler's run of a trace: what the learner's is held to."""

    steps: int
    hits: int
    preemptions: int


_LIBRARY: dict[Any, _Library] = {}


def _library_run(model: h.CheckModel, config: Any, trace: h.Trace) -> _Library:
    key = (model.name, config, tuple(map(tuple, trace.prompts)), tuple(trace.params), tuple(trace.arrivals),
           tuple(sorted(trace.cancel_at.items())))
    if key not in _LIBRARY:
        result = h.run(model, config, None, trace)
        if not result.finished or any(result.errors):
            raise RuntimeError(f"the library scheduler did not finish {trace.describe()}: {result.crash}")
        cache = result.engine.prefix_cache
        _LIBRARY[key] = _Library(result.steps, cache.stats.hit_tokens if cache is not None else 0, result.preemptions)
    return _LIBRARY[key]


def _config_text(config: Any) -> str:
    blocks = config.num_blocks or config.max_num_seqs * math.ceil(config.max_model_len / config.block_size)
    parts = [f"blocks of {config.block_size}", f"a pool of {blocks} blocks",
             f"{config.max_num_seqs} slots", f"{config.policy} batching"]
    parts.append(f"chunked prefill, budget {config.max_num_batched_tokens}" if config.chunked_prefill
                 else "no chunked prefill")
    if config.prefix_cache != "none":
        parts.append(f"{config.prefix_cache} prefix cache")
    return ", ".join(parts)


def _engine_case(ctx: StageContext, label: str, model: h.CheckModel, config: Any, trace: h.Trace,
                 library: bool = True, compare_hits: bool = False) -> bool:
    """One trace through the engine with the learner's scheduler; records its cases, True if all pass.

    ``library``: hold the steps to the library scheduler's on the same trace; ``compare_hits``: and the
    prefix-cache hits (a trace whose hits every valid policy shares)."""
    r = ctx.report
    notes = _Notes()
    lib = _library_run(model, config, trace) if library else None
    limit = 3 * lib.steps + 30 if lib is not None else None
    result = h.run(model, config, ctx.parts(scheduler=_watched(ctx, notes)), trace, max_steps=limit)
    name = f"{label}: {trace.describe()}, {_config_text(config)}"
    calls = notes.kvs[0].calls if notes.kvs else Counter()
    if notes.raised:
        return r.record(f"inside the engine ({name})", False, notes.raised[0])
    if notes.problems:
        return r.record(f"{label}: what schedule() returned, every step", False, notes.problems[0])
    hint = ""
    if not result.finished and not result.crash and notes.preempted == 0 and (lib is None or lib.preemptions):
        hint = ("the pool is full and no running request gave its blocks back: when a running request cannot grow "
                "(kv.can_allocate is False), preempt the newest running request (kv.free(seq, cache_prefix=True), "
                "num_computed = 0, to the front of the queue) and try again")
    if not h.compare(r, f"inside the engine ({name})", result, hint=hint):
        return False
    budget = config.max_num_batched_tokens if config.chunked_prefill else None
    extra = " and static batches closed until they finished" if config.policy == "static" else ""
    detail = (f"after each of {notes.schedules} schedule() calls: every request started at its num_computed with its "
              f"blocks allocated, none twice, at most {config.max_num_seqs} running, no waiting request holding "
              f"blocks{extra}, {notes.preempted} preemption(s)")
    if budget is not None:
        detail += f", at most {max(result.step_tokens, default=0)} of the budget's {budget} tokens a step"
    if config.prefix_cache != "none":
        detail += (f", {result.engine.prefix_cache.stats.hit_tokens} prompt tokens reused from the prefix cache, "
                   f"{calls['detach_prefix']} detach_prefix call(s) for requests that had to wait")
    ok = r.record(f"{label}: what schedule() returned, every step", True, detail)
    if lib is not None:
        if compare_hits:
            hits = result.engine.prefix_cache.stats.hit_tokens
            if hits < lib.hits:
                why = ("your scheduler never called kv.attach_prefix(seq): call it for the head of the queue before "
                       "sizing it" if not calls["attach_prefix"] else
                       "call kv.attach_prefix(seq) for every waiting request before sizing it")
                ok = r.record(f"{label}: prefix-cache hits", False, f"{hits} prompt tokens reused from the prefix "
                              f"cache, the library scheduler {lib.hits} on the same trace: {why}") and ok
            else:
                ok = r.record(f"{label}: prefix-cache hits", True, f"{hits} prompt tokens reused from the "
                              f"prefix cache (the library scheduler: {lib.hits})") and ok
        bound = math.floor(lib.steps * STEP_FACTOR)
        said = (f"{result.steps} engine steps, the library scheduler's {lib.steps} on the same trace (at most {bound} "
                f"allowed); {notes.preempted} preemption(s), the library's {lib.preemptions}")
        if result.steps > bound:
            why = notes.short_chunks[0] if notes.short_chunks else (
                "each step should do all the work the slots, the budget and the free blocks allow"
                + ("; a preemption throws work away: preempt only when a running request cannot grow, and the "
                   "newest (it has done the least)" if notes.preempted > lib.preemptions else ""))
            ok = r.record(f"{label}: steps", False, f"{said}: {why}") and ok
        else:
            ok = r.record(f"{label}: steps", True, said) and ok
    return h.pool_full(r, f"{label}: the pool is full again after the run", result) and ok


def _tight(max_model_len: int, block_size: int, spare: int) -> int:
    """A pool of one longest request's blocks and ``spare`` more: a few requests at once fill it."""
    return math.ceil(max_model_len / block_size) + spare


def _cancel_one(rng: random.Random, trace: h.Trace) -> h.Trace:
    """``trace`` with one request cancelled 1 to 4 steps after it arrives (waiting or running by then)."""
    i = rng.randrange(len(trace.prompts))
    trace.cancel_at = {i: trace.arrivals[i] + rng.randint(1, 4)}
    return trace


def check_engine(ctx: StageContext) -> None:
    """The learner's scheduler inside the engine: five hidden traces of the hidden model, then the chat prompts."""
    model = h.hidden()
    n = 9 if ctx.full else 7
    traces = []

    rng = ctx.rng("chunked")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, num_blocks=_tight(64, bs, rng.randint(2, 4)),
                             max_num_seqs=4, chunked_prefill=True, max_num_batched_tokens=rng.randint(9, 15))
    trace = h.random_trace(ctx.subseed("chunked-trace"), model.vocab, n=n, prompt_lens=(12, 40), new_tokens=(3, 10),
                           arrival_steps=6, name="a hidden trace")
    traces.append(("chunked prefill", config, _cancel_one(rng, trace)))

    rng = ctx.rng("whole")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, num_blocks=_tight(64, bs, rng.randint(1, 3)),
                             max_num_seqs=4)
    trace = h.random_trace(ctx.subseed("whole-trace"), model.vocab, n=n, prompt_lens=(15, 40), new_tokens=(4, 12),
                           arrival_steps=4, name="a hidden trace")
    last = max(range(n), key=lambda i: (trace.arrivals[i], i))
    trace.cancel_at = {last: trace.arrivals[last] + 1}  # most likely still waiting: remove() takes it off the queue
    traces.append(("no chunking", config, trace))

    rng = ctx.rng("static")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, num_blocks=_tight(64, bs, rng.randint(4, 8)),
                             max_num_seqs=3, policy="static")
    traces.append(("static batching", config, h.random_trace(ctx.subseed("static-trace"), model.vocab, n=n,
                                                             prompt_lens=(6, 24), new_tokens=(2, 14),
                                                             arrival_steps=3, name="a hidden trace")))

    rng = ctx.rng("prefix")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, max_num_seqs=4, chunked_prefill=True,
                             max_num_batched_tokens=rng.randint(12, 20), prefix_cache="radix")
    trace = h.random_trace(ctx.subseed("prefix-trace"), model.vocab, n=n - 2, prompt_lens=(20, 36),
                           new_tokens=(3, 8), shared_prefix=rng.randint(10, 18),
                           name="a hidden trace with a shared system prompt")
    # The first request alone, the others once its prompt is cached: every policy finds the same prefixes.
    trace.arrivals = [0] + [rng.randint(4, 10) for _ in range(n - 3)]
    traces.append(("prefix cache", config, trace))

    rng = ctx.rng("prefix-tight")
    bs = rng.choice((3, 5, 7))
    config = h.engine_config(block_size=bs, max_model_len=64, num_blocks=_tight(64, bs, rng.randint(1, 2)),
                             max_num_seqs=4, prefix_cache="radix")
    trace = h.random_trace(ctx.subseed("prefix-tight-trace"), model.vocab, n=n, prompt_lens=(24, 40),
                           new_tokens=(3, 8), shared_prefix=rng.randint(10, 18),
                           name="a hidden trace with a shared system prompt")
    # The first alone, then a crowd: requests find the cached prefix, and some of them must wait after all.
    trace.arrivals = [0] + [rng.randint(3, 5) for _ in range(n - 1)]
    traces.append(("prefix cache, tight pool", config, trace))

    for label, config, trace in traces:
        _engine_case(ctx, label, model, config, trace, compare_hits=label == "prefix cache")

    chat = h.chat_trace(QUESTIONS, max_tokens=8)
    config = h.engine_config(block_size=5, max_model_len=64, num_blocks=_tight(64, 5, 4), max_num_seqs=4,
                             chunked_prefill=True, max_num_batched_tokens=16)
    _engine_case(ctx, "chat", h.embedded(), config, chat, library=False)


def check(ctx: StageContext) -> None:
    """Stage 4's check: the guided rules first (cheap), then the engine runs."""
    check_admit(ctx)
    check_split(ctx)
    check_engine(ctx)


STAGE = Stage(
    number=4, key="scheduler", title="The scheduler", file="04_scheduler.py",
    components={"scheduler": "Scheduler"}, chapter="09", reads=("09", "10", "11"), minutes=90,
    task="Who runs each step and how many of their tokens: continuous and static batching, admission by free "
         "KV blocks, chunked prefill under a token budget, preemption by recompute, the prefix cache at admission.",
    check=check, requires=("admit_tokens", "split_budget"),
    adapters={"admit_tokens": as_count, "split_budget": as_int_list, "has_unfinished": as_bool,
              "schedule": as_scheduler_output},
    symbol="src/infer_lab/engine/scheduler.py::Scheduler",
)
