"""Stage 2's check: the block manager, alone on hidden allocate/share/free traces, then inside the engine.

1. ``blocks_needed`` on chapter 08's cases and hidden ones (exact: a block too many is memory
   another request could have had).
2. Hidden traces of grow / shrink / share / release / free over pools of odd sizes and block
   sizes (1, 3, 5, 16), against a shadow count of every block's holders: free counts, reference
   counts, all-or-nothing growth, ``OutOfKVMemory`` when the pool runs short, a double free refused,
   and the pool full at the end.
3. Inside the real engine: the embedded model's chat prompts, then the hidden model on a trace
   whose pool is small enough to force preemption, with a radix prefix cache (shared blocks,
   copy-on-write) and n-gram speculation (rolled-back blocks); every token compared with
   transformers and, after every step, every block in a request's table held at least as many
   times as tables hold it.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

from ...engine.block_manager import OutOfKVMemory, paged_blocks_needed
from . import Stage, StageContext
from . import harness as h
from .boundary import LearnerCodeError, as_count

NEEDED_CASES = ((0, 16, 0, 16), (0, 17, 0, 16), (16, 1, 1, 16), (15, 1, 1, 16), (40, 30, 3, 16), (0, 5, 0, 1),
                (10, 0, 1, 16), (3, 2, 4, 4), (7, 1, 3, 3))
TRACE_OPS = 120  # operations per hidden allocator trace
QUESTIONS = ("hi", "What is the capital of France?", "Write a haiku about the sea.", "Give me three prime numbers.")


def _needed_hint(computed: int, new: int, held: int, bs: int, got: Any) -> str:
    want = paged_blocks_needed(computed, new, held, bs)
    if not isinstance(got, int):
        return ""
    if got == max(0, (computed + new) // bs - held):
        return ("a partly filled block still holds tokens: round (cached + new) / block size UP, then subtract the "
                "blocks already held")
    if got == math.ceil((computed + new) / bs):
        return "that is the blocks for all the tokens: subtract the blocks the request already holds"
    if got < 0:
        return "never below 0: a request holding more blocks than it needs gets none"
    if got == math.ceil(new / bs) and want != got:
        return "the new tokens go after the cached ones, into the last block's free slots first: count from the total"
    return ""


def check_blocks_needed(ctx: StageContext) -> None:
    rng = ctx.rng("needed")
    hidden = [(rng.randint(0, 60), rng.randint(0, 40), 0, rng.choice((1, 3, 5, 7, 16))) for _ in range(8)]
    hidden = [(c, n, rng.randint(0, math.ceil(c / bs) + 1), bs) for c, n, _, bs in hidden]
    wrong = []
    for computed, new, held, bs in NEEDED_CASES + tuple(hidden):
        bm = ctx.part("block_manager")(64, bs)
        try:
            got = bm.blocks_needed(computed, new, held)
        except LearnerCodeError as exc:
            ctx.report.record("blocks_needed", False, str(exc))
            return
        want = paged_blocks_needed(computed, new, held, bs)
        if got != want:
            wrong.append(f"{computed} tokens cached in {held} block(s) of {bs}, {new} new: expected {want}, got "
                         f"{got}" + (f". Hint: {hint}" if (hint := _needed_hint(computed, new, held, bs, got)) else ""))
    n = len(NEEDED_CASES) + len(hidden)
    ctx.report.record(f"blocks_needed on {n} cases ({len(hidden)} hidden)", not wrong,
                      wrong[0] if wrong else f"all {n} exact")


class _Shadow:
    """The reference count every block should have, kept beside the learner's manager."""

    def __init__(self, num_blocks: int, block_size: int):
        self.refs = [0] * num_blocks
        self.bs = block_size

    @property
    def free(self) -> int:
        return self.refs.count(0)


def _raised(call: Any) -> BaseException | None:
    """The learner's exception behind a guarded call, or None when it returned."""
    try:
        call()
    except LearnerCodeError as exc:
        return exc.__cause__ or exc
    return None


def _one_trace(ctx: StageContext, rng: random.Random, label: str) -> str | None:
    """One hidden trace; what went wrong first (with the operations before it), or None."""
    bs = rng.choice((1, 3, 5, 16))
    num_blocks = rng.randint(6, 24)
    bm = ctx.part("block_manager")(num_blocks, bs)
    shadow = _Shadow(num_blocks, bs)
    tables: dict[int, tuple[list[int], int]] = {}  # request -> (its table, tokens it holds)
    log: list[str] = [f"a pool of {num_blocks} blocks of {bs}"]
    ids = iter(range(10**6))

    def fail(why: str) -> str:
        return f"{label}: {why}\n    the operations before it: " + "; ".join(log[-6:])

    def agree(touched: list[int]) -> str | None:
        free = bm.num_free_blocks()
        if free < shadow.free:
            return (f"num_free_blocks() is {free}, but {shadow.free} blocks have no holder: a block whose last "
                    "holder let go did not come back to the free list (a leak)")
        if free > shadow.free:
            return (f"num_free_blocks() is {free}, but only {shadow.free} blocks have no holder: a block came "
                    "back to the free list while someone still holds it")
        for b in sorted(set(touched)):
            if bm.ref_count(b) != shadow.refs[b]:
                return f"ref_count({b}) is {bm.ref_count(b)}, but it has {shadow.refs[b]} holder(s)"
        return None

    try:
        for _ in range(TRACE_OPS):
            op = rng.choices(("grow", "shrink", "fork", "free", "double", "share-free"), (8, 3, 2, 2, 1, 1))[0]
            if op == "grow":
                rid = rng.choice(list(tables)) if tables and rng.random() < 0.6 else next(ids)
                table, tokens = tables.get(rid, ([], 0))
                new = rng.randint(1, 3 * bs)
                need = max(0, math.ceil((tokens + new) / bs) - len(table))
                before = list(table)
                log.append(f"grow(table of {len(table)} blocks, {tokens + new} tokens)")
                err = _raised(lambda t=table, n=tokens + new: bm.grow(t, n))
                if need > shadow.free:
                    if err is None:
                        return fail(f"grow needed {need} blocks with {shadow.free} free and did not raise "
                                    "OutOfKVMemory")
                    if not isinstance(err, OutOfKVMemory):
                        return fail(f"grow raised {type(err).__name__} ({err}) when blocks ran short: raise "
                                    "OutOfKVMemory (the engine waits or preempts on it)")
                    if table != before or bm.num_free_blocks() != shadow.free:
                        return fail("grow raised OutOfKVMemory but took blocks first: all or nothing (check "
                                    "before you take any)")
                    continue
                if err is not None:
                    return fail(f"grow raised {type(err).__name__}: {err}")
                added = table[len(before):]
                if table[: len(before)] != before:
                    return fail(f"grow changed blocks the table already held: {before} became {table}")
                if len(added) != need:
                    return fail(f"grow added {len(added)} blocks for {tokens + new} tokens in blocks of {bs} "
                                f"(it held {len(before)}): it needs {need}")
                bad = [b for b in added if not (isinstance(b, int) and 0 <= b < num_blocks)]
                if bad:
                    return fail(f"grow handed out {bad[0]!r}, not a block id in 0..{num_blocks - 1}")
                taken = [b for b in added if shadow.refs[b]] or [b for b, c in Counter(added).items() if c > 1]
                if taken:
                    return fail(f"grow handed out block {taken[0]}, which was not free (it has "
                                f"{shadow.refs[taken[0]]} holder(s) or was handed out twice)")
                for b in added:
                    shadow.refs[b] = 1
                tables[rid] = (table, tokens + new)
                why = agree(added)
            elif op == "shrink" and tables:
                rid = rng.choice(list(tables))
                table, tokens = tables[rid]
                keep = rng.randint(0, tokens)
                log.append(f"shrink(table of {len(table)} blocks, {keep} tokens)")
                dropped = table[math.ceil(keep / bs):]
                err = _raised(lambda t=table, k=keep: bm.shrink(t, k))
                if err is not None:
                    return fail(f"shrink raised {type(err).__name__}: {err}")
                if len(table) != math.ceil(keep / bs):
                    return fail(f"shrink left {len(table)} blocks for {keep} tokens in blocks of {bs}: keep "
                                f"{math.ceil(keep / bs)} (a partly filled block still holds tokens)")
                for b in dropped:
                    shadow.refs[b] -= 1
                tables[rid] = (table, keep)
                why = agree(dropped)
            elif op == "fork" and any(t for t, n in tables.values() if n >= bs):
                rid = rng.choice([r for r, (t, n) in tables.items() if n >= bs])
                table, tokens = tables[rid]
                k = rng.randint(1, tokens // bs)
                log.append(f"share the first {k} block(s) of a table")
                for b in table[:k]:
                    err = _raised(lambda b=b: bm.share(b))
                    if err is not None:
                        return fail(f"share({b}) of a held block raised {type(err).__name__}: {err}")
                    shadow.refs[b] += 1
                tables[next(ids)] = (list(table[:k]), k * bs)
                why = agree(table[:k])
            elif op == "free" and tables:
                rid = rng.choice(list(tables))
                table, _ = tables.pop(rid)
                log.append(f"free a table of {len(table)} blocks")
                dropped = list(table)
                err = _raised(lambda t=table: bm.shrink(t, 0))
                if err is not None:
                    return fail(f"shrink(table, 0) raised {type(err).__name__}: {err}")
                if table:
                    return fail(f"shrink(table, 0) left {len(table)} blocks in the table")
                for b in dropped:
                    shadow.refs[b] -= 1
                why = agree(dropped)
            elif op in ("double", "share-free") and shadow.free:
                b = rng.choice([i for i, c in enumerate(shadow.refs) if c == 0])
                verb = "release" if op == "double" else "share"
                log.append(f"{verb}({b}) of a free block")
                free_before = bm.num_free_blocks()
                err = _raised(lambda b=b, verb=verb: getattr(bm, verb)(b))
                if err is None:
                    return fail(f"{verb}({b}) of a free block did not raise: "
                                + ("a double free must be noticed, or the block enters the free list twice"
                                   if verb == "release" else "a free block has no holder to share it with"))
                if bm.num_free_blocks() != free_before:
                    return fail(f"{verb}({b}) of a free block raised, but changed the free count first")
                why = agree([b])
            else:
                continue
            if why:
                return fail(why)
        log.append("free every table")
        for table, _ in tables.values():
            dropped = list(table)
            err = _raised(lambda t=table: bm.shrink(t, 0))
            if err is not None:
                return fail(f"shrink(table, 0) raised {type(err).__name__}: {err}")
            for b in dropped:
                shadow.refs[b] -= 1
        if bm.num_free_blocks() != num_blocks or any(bm.ref_count(b) for b in range(num_blocks)):
            held = [b for b in range(num_blocks) if bm.ref_count(b)]
            return fail(f"after every table let go, {bm.num_free_blocks()} of {num_blocks} blocks are free"
                        + (f" and blocks {held[:5]} still count holders" if held else "") + ": a leak")
    except LearnerCodeError as exc:
        return fail(str(exc))
    return None


def check_traces(ctx: StageContext) -> None:
    n = 12 if ctx.full else 4
    for i in range(n):
        why = _one_trace(ctx, ctx.rng(f"trace{i}"), f"hidden trace {i + 1}")
        if why:
            ctx.report.record(f"{n} hidden allocator traces of {TRACE_OPS} operations", False, why)
            return
    ctx.report.record(f"{n} hidden allocator traces of {TRACE_OPS} operations", True,
                      "free counts, reference counts, all-or-nothing growth, OutOfKVMemory, double frees refused, "
                      "the pool full at the end")


def _holders_cover_tables(problems: list[str]) -> Any:
    """After every step: each block in a live request's table is held at least once per table holding it."""

    def on_step(engine: Any, step: int) -> None:
        if problems:
            return
        uses = Counter(b for s in engine.requests.values() if not s.is_finished for b in s.block_table)
        for b, n in uses.items():
            refs = engine.kv.blocks.ref_count(b)
            if refs < n:
                problems.append(f"after step {step}, block {b} is in {n} request table(s) but ref_count({b}) is "
                                f"{refs}: a block was freed while still in use (did release give back a block "
                                "that had other holders?)")
                return

    return on_step


def check_engine(ctx: StageContext) -> None:
    parts = ctx.parts()
    problems: list[str] = []
    chat = h.chat_trace(QUESTIONS, max_tokens=8)
    result = h.run(h.embedded(), h.engine_config(block_size=5), parts, chat, on_step=_holders_cover_tables(problems))
    h.compare(ctx.report, f"inside the engine: {chat.describe()}, blocks of 5", result,
              hint=problems[0] if problems else "")
    if result.finished:
        h.pool_full(ctx.report, "the pool is full again after that run", result)

    rng = ctx.rng("engine")
    model = h.hidden()
    bs = rng.choice((3, 7))
    trace = h.random_trace(ctx.subseed("trace"), model.vocab, n=8 if ctx.full else 6, prompt_lens=(14, 30),
                           new_tokens=(10, 24), shared_prefix=12, arrival_steps=3,
                           name="a hidden trace on the hidden model")
    blocks_per_request = math.ceil(64 / bs)
    config = h.engine_config(block_size=bs, max_model_len=64, num_blocks=blocks_per_request + 4, max_num_seqs=4,
                             prefix_cache="radix", speculative="ngram", num_speculative_tokens=3)
    problems.clear()
    result = h.run(model, config, parts, trace, on_step=_holders_cover_tables(problems))
    shared = result.engine.prefix_cache.stats.hit_tokens if result.finished else 0
    h.compare(ctx.report, f"inside the engine: {trace.describe()}, blocks of {bs}, a pool of {config.num_blocks} "
                          f"blocks (tight), radix prefix cache, n-gram speculation", result,
              hint=problems[0] if problems else "")
    if result.finished:
        ctx.report.record("no block freed while a request still held it", not problems,
                          problems[0] if problems else f"checked after each of {result.steps} steps: "
                          f"{result.preemptions} preemption(s), {shared} prompt tokens reused from shared blocks")
        h.pool_full(ctx.report, "the pool is full again after that run", result)


def check(ctx: StageContext) -> None:
    check_blocks_needed(ctx)
    check_traces(ctx)
    check_engine(ctx)


STAGE = Stage(
    number=2, key="blocks", title="The block manager", file="02_block_manager.py",
    components={"block_manager": "BlockManager"}, chapter="08", minutes=60,
    task="A pool of KV blocks with a free list and reference counts: grow a request's block table all or "
         "nothing, shrink it, share blocks between requests, refuse a double free.",
    check=check, adapters={"blocks_needed": as_count, "num_free_blocks": as_count, "ref_count": as_count},
    symbol="src/infer_lab/engine/block_manager.py::BlockManager",
)
