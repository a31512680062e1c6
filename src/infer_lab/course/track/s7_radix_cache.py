"""Stage 7's check: the radix prefix cache on hidden trees, under memory pressure, then inside the engine.

Every run keeps the **provenance** of every KV slot: the token prefix whose K/V was computed into it
(recorded when the KV cache allocates a request's chunk, carried along by copy-on-write copies). A
position a request reuses must hold the K/V of its own prefix; that catches a wrong slot, or a
block freed and handed to someone else while the tree still pointed at it, even where the model's
tokens would not show it.

1. Hidden trees of any depth, without memory pressure (the reuse is then fully determined, so it is
   checked exactly, request by request): prompts drawn as paths of a random prompt
   tree (families, branches at random depths, prompts ending in the middle of an edge, exact
   repeats), run through the engine's protocol with the prefix cache (attach on admission, insert
   after the prefill and at the end) on hidden block sizes. Each attach must reuse the longest cached
   prefix (all but the last token at most), and hidden lookups ``match(q)`` must return, slot for
   slot, what the tree holds (the slots of the first request that computed each prefix).
2. Eviction, in hidden scenarios built so that every correct least-recently-used policy agrees
   (whatever its tie-break, and whether it evicts a whole edge or one token at a time): texts with
   distinct first tokens are cached, all but one used again in a hidden order, then a new prompt
   needs one block more than is free. Exactly the least recently used text must lose tokens; with a
   branch, the unused branch goes and the common stem (an inner node, used through the other
   branch) stays.
3. Random traces under memory pressure (a pool of about one and a half requests, three running at
   once: cached prefixes evicted, requests preempted), beside the library's ``RadixPrefixCache`` on
   the same trace: after every operation ``num_evictable()`` is exactly the number of blocks the
   tree alone holds and every block in a running request's table is still held; ``clear()`` gives
   every block back; the tokens reused are at least :data:`HIT_SLACK` of the library's (not equal:
   see :func:`check_pressure`).
4. Inside the real engine: the embedded model's chat prompts (they share the chat template's
   system prompt; one repeats) and the hidden model on a prompt-tree trace with an odd block size
   and a tight pool (eviction): every token compared with transformers; the prompt tokens reused
   equal to the library's engine on the same trace and config (at least :data:`HIT_SLACK` of them
   where the library evicted); provenance, holders and ``num_evictable()`` after every step; the
   pool full after ``clear()``.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from ...engine import PagedKVCache, RadixPrefixCache, SamplingParams
from ...engine.sequence import Sequence, SequenceStatus
from ...shape import ModelShape, model_shape
from . import Stage, StageContext
from . import harness as h
from .boundary import LearnerCodeError, as_bool, as_count, as_int_list

QUESTIONS = ("What is the capital of France?", "Give me three prime numbers.", "Write a haiku about the sea.",
             "What is the capital of France?")
VOCAB = 1000  # token ids of the model-free traces
MAX_PROMPT = 44


@lru_cache(maxsize=1)
def _shape() -> ModelShape:
    """A one-layer shape for the model-free KV caches (a few KB per block)."""
    return model_shape("smollm2-135m").with_layers(1)


# ---------------------------------------------------------------------------------------------
# Provenance: which prefix's K/V each slot holds


def _key(seq: Sequence, pos: int) -> tuple[int, ...]:
    return tuple(seq.all_ids[: pos + 1])


class _Audit:
    """Hooks on a paged KV cache: every allocated chunk records the prefix each of its slots will hold,
    copy-on-write copies carry it along, and before a request's chunk is allocated every position it
    already has (reused or computed) must hold its own prefix. ``problem`` is the first violation."""

    def __init__(self, kv: PagedKVCache):
        self.kv, self.prov, self.problem = kv, {}, None
        self.reused = 0  # positions checked that came from the cache
        allocate, copy = kv.allocate, kv.store.copy

        def tracked_allocate(seq: Sequence, num_new_tokens: int) -> None:
            hit = seq.prefix_hit
            self.check(seq, hit)
            allocate(seq, num_new_tokens)
            self.record(seq, seq.num_computed, num_new_tokens)

        def tracked_copy(src: Any, dst: Any) -> None:
            copy(src, dst)
            for s, d in zip(torch.as_tensor(src).tolist(), torch.as_tensor(dst).tolist(), strict=True):
                self.prov[d] = self.prov.get(s)

        kv.allocate = tracked_allocate
        kv.store.copy = tracked_copy

    def slot(self, seq: Sequence, pos: int) -> int:
        bs = self.kv.block_size
        return seq.block_table[pos // bs] * bs + pos % bs

    def record(self, seq: Sequence, start: int, count: int) -> None:
        for pos in range(start, min(start + count, seq.num_tokens)):
            self.prov[self.slot(seq, pos)] = _key(seq, pos)

    def check(self, seq: Sequence, hit: int | None) -> None:
        if self.problem is not None:
            return
        bs = self.kv.block_size
        if len(seq.block_table) * bs < seq.num_computed:
            self.problem = (f"request {seq.request_id} has {seq.num_computed} tokens computed but a block table of "
                            f"{len(seq.block_table)} blocks of {bs}: attach must give it the blocks of every reused "
                            "token")
            return
        if hit is not None:
            self.reused += hit
        for pos in range(seq.num_computed):
            slot = self.slot(seq, pos)
            held = self.prov.get(slot)
            if held != _key(seq, pos):
                reused = hit is not None and pos < hit
                what = "a reused" if reused else "a computed"
                why = ("the cache handed it a slot whose K/V was computed for other tokens: the slots of the matched "
                       "prefix, in order" if reused else
                       "its block was freed and handed to another request while it still held it: give back only "
                       "references the tree holds")
                self.problem = (f"request {seq.request_id}: position {pos} ({what} token of its {seq.num_computed}) "
                                f"reads slot {slot} (block {slot // bs}), which holds the K/V of "
                                f"{'nothing yet' if held is None else f'a {len(held)}-token prefix that differs'}: "
                                f"{why}")
                return


def _holders(kv: PagedKVCache, live: list[Sequence], cache: Any) -> str | None:
    """After an operation: every block of a running request still held; num_evictable() the blocks the tree alone holds."""
    uses = Counter(b for s in live for b in s.block_table)
    for b, n in sorted(uses.items()):
        refs = kv.blocks.ref_count(b)
        if refs < n:
            return (f"block {b} is in {n} running request table(s) but has {refs} holder(s): your cache gave back a "
                    "reference it did not hold, so a block a running request still uses was freed")
    alone = sum(1 for b in range(kv.num_blocks) if kv.blocks.ref_count(b) > 0 and not uses[b])
    got = cache.num_evictable()
    if got != alone:
        return (f"num_evictable() returned {got}, but {alone} blocks are held by the tree alone (no running request "
                "holds them): count the blocks whose every holder is the tree"
                + (" (a block a running request also holds cannot be freed by eviction)" if got > alone else ""))
    return None


# ---------------------------------------------------------------------------------------------
# Hidden prompt trees


@dataclass(frozen=True)
class _Req:
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # the tokens it generates (model-free runs)


def prompt_tree(rng: random.Random, n: int, vocab: int, max_prompt: int = MAX_PROMPT, low: int = 4) -> list[list[int]]:
    """``n`` prompts drawn as paths of a random tree of token runs: families sharing prefixes, branches at
    random depths, some ending in the middle of a run, some exact repeats of an earlier prompt."""
    paths = [[]]
    for _ in range(rng.randint(6, 12)):
        parent = rng.choice(paths)
        run = [rng.randrange(low, vocab) for _ in range(rng.randint(2, 10))]
        if len(parent) + len(run) <= max_prompt - 6:
            paths.append(parent + run)
    prompts: list[list[int]] = []
    for _ in range(n):
        if prompts and rng.random() < 0.15:
            prompts.append(list(rng.choice(prompts)))
            continue
        path = rng.choices(paths, weights=[len(p) + 4 for p in paths])[0]  # deeper paths more often
        cut = rng.randint(len(path) // 2, len(path)) if rng.random() < 0.3 else len(path)
        own = [rng.randrange(low, vocab) for _ in range(rng.randint(0 if cut else 1, 6))]
        prompts.append(path[:cut] + own)
    return prompts


def _requests(rng: random.Random, n: int) -> list[_Req]:
    return [_Req(tuple(p), tuple(rng.randrange(4, VOCAB) for _ in range(rng.randint(1, 10))))
            for p in prompt_tree(rng, n, VOCAB)]


# ---------------------------------------------------------------------------------------------
# The engine's protocol with a prefix cache, without a model


class _Shadow:
    """What a tree without eviction holds: for each prefix, the slot of the first request that offered it."""

    def __init__(self) -> None:
        self.root: dict[int, tuple[int, dict]] = {}

    def offer(self, tokens: list[int], slots: list[int]) -> None:
        node = self.root
        for t, s in zip(tokens, slots, strict=True):
            if t not in node:
                node[t] = (s, {})
            node = node[t][1]

    def match(self, tokens: list[int]) -> list[int]:
        node, out = self.root, []
        for t in tokens:
            if t not in node:
                break
            out.append(node[t][0])
            node = node[t][1]
        return out


class _World:
    """One KV cache and prefix cache driven the way the engine drives them (attach on admission, insert
    after the prefill and at the end, preemption when a decode finds no block), with a provenance audit."""

    def __init__(self, make_cache: Callable[[PagedKVCache], Any], num_blocks: int, block_size: int):
        self.kv = PagedKVCache(_shape(), num_blocks, block_size, torch.float32)
        self.cache = make_cache(self.kv)
        self.kv.prefix_cache = self.cache
        self.audit = _Audit(self.kv)
        self.shadow = _Shadow()
        self.hits: dict[str, int] = {}
        self.expected: dict[str, int] = {}  # without eviction: the longest prefix the tree holds at admission
        self.preemptions = 0
        self.evicted = 0
        self.live: list[Sequence] = []

    def _offer(self, seq: Sequence) -> None:
        n = min(seq.num_computed, seq.num_tokens)
        self.shadow.offer(seq.all_ids[:n], self.kv.slots(seq, 0, n))

    def _finish(self, seq: Sequence) -> None:
        self._offer(seq)
        self.kv.free(seq, cache_prefix=True)
        self.live.remove(seq)

    def _advance(self, seq: Sequence, plan: tuple[int, ...]) -> None:
        seq.output_ids.append(plan[len(seq.output_ids)])
        if len(seq.output_ids) == len(plan):
            self._finish(seq)

    def _preempt(self, seq: Sequence, queue: deque) -> None:
        self._offer(seq)
        self.kv.free(seq, cache_prefix=True)
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.preemptions += 1
        self.live.remove(seq)
        queue.appendleft(seq)

    def run(self, reqs: list[_Req], max_live: int, tag: str = "q") -> str | None:
        """Every request to its end (ids ``<tag><i>``); the first problem found (the learner's error included), or None."""
        try:
            return self._run(reqs, max_live, tag)
        except LearnerCodeError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001  (OutOfKVMemory after can_allocate said yes, a double free...)
            return f"the KV cache raised {type(exc).__name__}: {exc}"

    def _run(self, reqs: list[_Req], max_live: int, tag: str) -> str | None:
        plans = {f"{tag}{i}": r.output for i, r in enumerate(reqs)}
        queue = deque(Sequence(f"{tag}{i}", list(r.prompt), SamplingParams(max_tokens=len(r.output), ignore_eos=True),
                               0.0) for i, r in enumerate(reqs))
        limit = 20 * sum(len(r.prompt) + len(r.output) for r in reqs)
        for _ in range(limit):
            if not queue and not self.live:
                return None
            for seq in list(self.live):  # decode: one token each, oldest first; the newest is preempted for room
                while seq in self.live and not self.kv.can_allocate(seq, 1):
                    self._preempt(self.live[-1], queue)
                if seq not in self.live:
                    continue
                self.kv.allocate(seq, 1)
                seq.num_computed += 1
                self._advance(seq, plans[seq.request_id])
                why = self.audit.problem or _holders(self.kv, self.live, self.cache)
                if why:
                    return why
            while queue and len(self.live) < max_live:  # admission, oldest first, while memory lasts
                seq = queue[0]
                fresh = seq.request_id not in self.hits
                want = min(len(self.shadow.match(seq.all_ids)), seq.num_tokens - 1)
                self.kv.attach_prefix(seq)
                hit = seq.num_computed
                if seq.prefix_hit is not None and seq.prefix_hit != hit:
                    return (f"attach returned {seq.prefix_hit} but set seq.num_computed to {hit}: return the number "
                            "of tokens reused")
                if hit > seq.num_tokens - 1:
                    return (f"attach reused {hit} tokens of a {seq.num_tokens}-token prompt: at most all but the last "
                            "(self.reusable_limit(seq)); the last token is computed to give the first new token")
                need = seq.num_tokens - hit
                if not self.kv.can_allocate(seq, need):
                    self.kv.detach_prefix(seq)
                    why = self.audit.problem or _holders(self.kv, self.live, self.cache)
                    if why:
                        return why
                    break
                queue.popleft()
                if fresh:
                    self.hits[seq.request_id], self.expected[seq.request_id] = hit, want
                self.kv.allocate(seq, need)
                seq.num_computed = seq.num_tokens
                seq.status = SequenceStatus.RUNNING
                self.live.append(seq)
                if not seq.prefill_done:
                    seq.prefill_done = True
                    self._offer(seq)
                    self.kv.cache_prefix(seq)
                self._advance(seq, plans[seq.request_id])
                why = self.audit.problem or _holders(self.kv, self.live, self.cache)
                if why:
                    return why
        return f"the requests did not finish within {limit} steps"


# ---------------------------------------------------------------------------------------------
# 1. Hidden trees, no memory pressure


def _edge_ends(cache: RadixPrefixCache, tokens: list[int]) -> list[int]:
    """Along ``tokens``' path in the library's tree: how many tokens each whole edge walked ends at."""
    node, i, ends = cache.root, 0, []
    while i < len(tokens) and tokens[i] in node.children:
        child = node.children[tokens[i]]
        if tokens[i:i + len(child.tokens)] != child.tokens:
            break
        i += len(child.tokens)
        ends.append(i)
        node = child
    return ends


def _match_hint(got: list[int], want: list[int], ends: list[int]) -> str:
    if len(got) < len(want) and want[:len(got)] == got:
        if len(ends) > 2 and len(got) == ends[1]:
            return ("your walk stopped after two edges, but the prefix goes deeper: keep walking down while the edges "
                    "match (a loop or a recursion, not a fixed number of steps)")
        if len(got) in ends or not got:
            return ("your walk stopped at the end of a whole edge, but the prompt goes on matching part of the next "
                    "edge: a partly matching edge still gives the slots of the tokens that do match")
        return "keep walking while the edges match; a partly matching edge gives the slots of its matching tokens"
    if len(got) > len(want) and got[:len(want)] == want:
        return "you returned slots past the last matching token: stop where the prompt and the edge part"
    if len(got) == len(want):
        return ("the right number of slots, but not the tree's: take them from the nodes walked, in order (the "
                "first request that computed a prefix keeps it; a later insert of the same prefix adds nothing)")
    return ""


def check_match(ctx: StageContext) -> bool:
    n = 40 if ctx.full else 24
    case = f"match and attach on {n}-request hidden prompt trees (any depth, branches, repeats), no memory pressure"
    sizes = []
    for trial, bs in enumerate(ctx.rng("sizes").sample((1, 3, 5, 7, 16), 2)):
        rng = ctx.rng(f"tree{trial}")
        reqs = _requests(rng, n)
        num_blocks = sum(math.ceil((len(r.prompt) + len(r.output)) / bs) for r in reqs) + 8
        world = _World(ctx.part("prefix_cache"), num_blocks, bs)
        library = _World(RadixPrefixCache, num_blocks, bs)
        if library.run(reqs, max_live=2) or library.hits != library.expected:
            raise RuntimeError(f"the library's cache does not reuse what a tree would hold (trace {trial})")
        why = world.run(reqs, max_live=2)
        if why:
            return ctx.report.record(case, False, f"blocks of {bs}: {why}")
        for rid, hit in world.hits.items():
            want = world.expected[rid]
            if hit != want:
                i = int(rid[1:])
                return ctx.report.record(case, False, f"blocks of {bs}: request {i} (a {len(reqs[i].prompt)}-token "
                                                      f"prompt) reused {hit} tokens, but the tree held its first "
                                                      f"{want} (all but the last token at most): attach must reuse the "
                                                      "longest cached prefix" + (f". Hint: {hint}" if (hint := _match_hint(
                                                          list(range(hit)), list(range(want)),
                                                          _edge_ends(library.cache, list(reqs[i].prompt)))) else ""))
        offered = [r.prompt + r.output for r in reqs]
        queries = []
        for _ in range(16):
            text = list(rng.choice(offered))
            queries.append(text[:rng.randint(1, len(text))] + [rng.randrange(4, VOCAB) for _ in range(rng.randint(0, 4))])
        queries.append([rng.randrange(4, VOCAB) for _ in range(5)])
        match = world.cache.match
        for q in queries:
            try:
                got = match(list(q))
            except LearnerCodeError as exc:
                return ctx.report.record(case, False, str(exc))
            want = world.shadow.match(q)
            if got != want:
                hint = _match_hint(got, want, _edge_ends(library.cache, q))
                return ctx.report.record(case, False, f"blocks of {bs}: match(a {len(q)}-token query) returned "
                                                      f"{len(got)} slots, the tree holds its first {len(want)} tokens "
                                                      f"(slots {want[:6]}{' ...' if len(want) > 6 else ''}, you: "
                                                      f"{got[:6]}{' ...' if len(got) > 6 else ''})"
                                                      + (f". Hint: {hint}" if hint else ""))
        problem = _cleared(world)
        if problem:
            return ctx.report.record(case, False, f"blocks of {bs}: {problem}")
        sizes.append(f"blocks of {bs}: {sum(world.hits.values())} prompt tokens reused, {world.audit.reused} checked "
                     f"slot by slot, {len(queries)} lookups")
    return ctx.report.record(case, True, "; ".join(sizes))


def _cleared(world: _World) -> str | None:
    """clear() gives every block back (nothing runs any more)."""
    try:
        world.cache.clear()
    except LearnerCodeError as exc:
        return str(exc)
    kv = world.kv
    if kv.all_blocks_free():
        return None
    held = [b for b in range(kv.num_blocks) if kv.blocks.ref_count(b)]
    return (f"after every request finished and clear(), {len(held)} of {kv.num_blocks} blocks still have holders "
            f"(blocks {held[:6]}): a leak (does insert take references again on what the tree holds already, or "
            "eviction drop a node without giving back its blocks?)")


# ---------------------------------------------------------------------------------------------
# 2. Eviction: least recently used leaves first


def _family(rng: random.Random, first: int, low: int, high: int) -> list[int]:
    return [first] + [rng.randrange(4, VOCAB) for _ in range(rng.randint(low, high) - 1)]


def lru_scenario(rng: random.Random, branches: bool) -> tuple[int, list[list[int]], list[int], int, int]:
    """A hidden eviction scenario: ``(block size, texts in the order they are cached, the order in which all
    but one are used again, the index of the least recently used one, the first token of a new prompt)``. The texts start with distinct tokens (separate subtrees); with ``branches`` the
    last two share a prefix (an inner node) and the least recently used is the second branch."""
    bs = rng.choice((1, 3, 5, 7))
    m = rng.randint(3, 5)
    firsts = rng.sample(range(8, VOCAB), m + 2)  # the texts', a branch's, a new prompt's
    texts = [_family(rng, firsts[i], max(4, 2 * bs + 1), 4 * bs + 2) for i in range(m)]
    if branches:
        stem = texts[-1]
        texts[-1] = stem + _family(rng, firsts[m], 2, bs + 2)
        other = rng.choice([t for t in range(8, VOCAB) if t != firsts[m]])
        texts.append(stem + _family(rng, other, bs + 1, 2 * bs + 2))
        lru = len(texts) - 1  # the second branch: its stem is used again through the first
    else:
        lru = rng.randint(1, m - 2) if m > 3 else 1  # neither the first cached nor the last
    touch = [i for i in range(len(texts)) if i != lru]
    rng.shuffle(touch)
    return bs, texts, touch, lru, firsts[m + 1]


def _cached_len(world: _World, text: list[int]) -> int:
    return len(world.cache.match(list(text)))


def check_lru(ctx: StageContext) -> bool:
    case = "eviction: the least recently used leaf goes first, and only leaves (hidden scenarios)"
    details = []
    for trial, branches in enumerate((False, True, False, True)):
        rng = ctx.rng(f"lru{trial}")
        bs, texts, touch, lru, new_first = lru_scenario(rng, branches)
        cached = sum(math.ceil(len(t) / bs) for t in texts)
        num_blocks = cached + 2 + rng.randint(0, 2)  # room for a request that reuses one text, no more
        outcome = {}
        for name, make in (("library", RadixPrefixCache), ("yours", ctx.part("prefix_cache"))):
            world = _World(make, num_blocks, bs)
            steps = [("cache", [_Req(tuple(t), (5,)) for t in texts]), ("use", [_Req(tuple(texts[i]), (5,)) for i in touch])]
            why = None
            for tag, reqs in steps:
                for j, req in enumerate(reqs):
                    why = why or world.run([req], 1, tag=f"{tag}{j}-")
            free = world.kv.blocks.num_free_blocks()
            pressure = [new_first] + [7] * ((free + 1) * bs - 1)  # one block more than is free
            why = why or world.run([_Req(tuple(pressure), (5,))], 1, tag="p")
            if why:
                if name == "library":
                    raise RuntimeError(f"the library's cache failed an eviction scenario: {why}")
                return ctx.report.record(case, False, f"blocks of {bs}: {why}")
            try:
                outcome[name] = [_cached_len(world, t) for t in texts]
            except LearnerCodeError as exc:
                return ctx.report.record(case, False, str(exc))
        want, got = outcome["library"], outcome["yours"]
        if want[lru] == len(texts[lru]) or any(w != len(t) for i, (w, t) in enumerate(zip(want, texts, strict=True))
                                               if i != lru):
            raise RuntimeError(f"an eviction scenario the library does not pass: {want}")
        shown = ", ".join(f"text {i}: {g} of {len(t)}" for i, (g, t) in enumerate(zip(got, texts, strict=True)))
        setting = (f"blocks of {bs}: {len(texts)} texts cached" + (" (the last two branch from a common stem)" if branches
                   else "") + f", then all but text {lru} used again in the order {touch}; a new prompt needing one "
                   "block more than is free")
        lost = [i for i, (g, t) in enumerate(zip(got, texts, strict=True)) if g < len(t)]
        if lru not in lost:
            return ctx.report.record(case, False, f"{setting}: afterwards the cache holds {shown}. Text {lru} was the "
                                                  "least recently used and should have lost tokens: evict the least "
                                                  "recently used leaf first (a lookup or an insert that walks a node "
                                                  "uses it)")
        wrong = [i for i in lost if i != lru]
        if wrong:
            stem = branches and lru == len(texts) - 1 and len(texts) - 2 in wrong
            return ctx.report.record(case, False, f"{setting}: afterwards the cache holds {shown}: text(s) {wrong} "
                                                  f"lost tokens too, but one block was needed and text {lru} (the "
                                                  "least recently used) had enough: evict one leaf at a time, until "
                                                  "a block is free" + (" (and never a node with children: the common "
                                                                       "stem was used recently)" if stem else ""))
        details.append(f"blocks of {bs}, {len(texts)} texts{' with a branch' if branches else ''}: text {lru} lost "
                       f"{len(texts[lru]) - got[lru]} tokens")
    return ctx.report.record(case, True, "; ".join(details))


# ---------------------------------------------------------------------------------------------
# 3. Memory pressure, beside the library's cache

HIT_SLACK = 0.7  # under eviction, reuse at least this share of the library's (see check_pressure)


def check_pressure(ctx: StageContext) -> bool:
    """Random traces under pressure: every invariant exact; the tokens reused close to the library's.

    Exact equality would refuse correct caches: a tie among equally old leaves broken the other way,
    a split's tail that keeps its own age, or a trie of one token per node (it evicts a token at a
    time, the radix tree a whole edge) reuse more or fewer tokens than the library's on some traces
    under this much pressure, by tens of percent either way. The eviction order itself is
    checked exactly by :func:`check_lru`, and without eviction the reuse is checked exactly by
    :func:`check_match`.
    """
    traces = 6 if ctx.full else 3
    case = f"{traces} hidden traces under memory pressure, beside the library's radix cache on the same trace"
    details = []
    for trial in range(traces):
        rng = ctx.rng(f"pressure{trial}")
        bs = rng.choice((1, 3, 5, 7))
        reqs = _requests(rng, 30)
        largest = max(math.ceil((len(r.prompt) + len(r.output)) / bs) for r in reqs)
        num_blocks = largest + rng.randint(2, largest // 2 + 2)
        max_live = 3
        library = _World(RadixPrefixCache, num_blocks, bs)
        if library.run(reqs, max_live):
            raise RuntimeError(f"the library's cache failed pressure trace {trial}: {library.audit.problem}")
        world = _World(ctx.part("prefix_cache"), num_blocks, bs)
        setting = f"trace {trial + 1} ({len(reqs)} requests, blocks of {bs}, a pool of {num_blocks}, {max_live} at once)"
        why = world.run(reqs, max_live)
        if why:
            return ctx.report.record(case, False, f"{setting}: {why}")
        mine, theirs = sum(world.hits.values()), sum(library.hits.values())
        if mine < HIT_SLACK * theirs:
            return ctx.report.record(case, False, f"{setting}: your cache reused {mine} prompt tokens, the library's "
                                                  f"{theirs} ({library.cache.stats.evicted_blocks} blocks evicted): "
                                                  "cached prefixes were lost or not found")
        problem = _cleared(world)
        if problem:
            return ctx.report.record(case, False, f"{setting}: {problem}")
        same = sum(world.hits[r] == library.hits[r] for r in library.hits)
        details.append(f"{mine} tokens reused (the library's {theirs}; {same} of {len(reqs)} requests the same), "
                       f"{library.cache.stats.evicted_blocks} blocks evicted, {library.preemptions} preemptions")
    return ctx.report.record(case, True, "after every operation num_evictable() exact and no running request's block "
                                         "freed; the pool full after clear(): " + "; ".join(details))


# ---------------------------------------------------------------------------------------------
# 3. Inside the engine


class _EngineWatch:
    """Audits an engine's KV cache from the moment the prefix cache is built (provenance), and after every
    step (holders, num_evictable)."""

    def __init__(self, make_cache: Callable[[PagedKVCache], Any]):
        self.make_cache, self.audit, self.problem = make_cache, None, None

    def build(self, kv: PagedKVCache) -> Any:
        self.audit = _Audit(kv)
        return self.make_cache(kv)

    def on_step(self, engine: Any, step: int) -> None:
        if self.problem is None:
            live = [s for s in engine.requests.values() if not s.is_finished and s.block_table]
            try:
                self.problem = self.audit.problem or _holders(engine.kv, live, engine.prefix_cache)
            except LearnerCodeError as exc:
                self.problem = str(exc)
            if self.problem:
                self.problem = f"after step {step}: {self.problem}"


_library_hits: dict[tuple, tuple[int, int, int]] = {}


def _library_run(model: h.CheckModel, config: Any, trace: h.Trace) -> tuple[int, int, int]:
    """(prompt tokens reused, blocks evicted, preemptions) of the library's engine on ``trace`` (cached)."""
    key = (model.name, repr(config), tuple(map(tuple, trace.prompts)), tuple(map(repr, trace.params)),
           tuple(trace.arrivals))
    if key not in _library_hits:
        run = h.run(model, config, None, trace)
        stats = run.engine.prefix_cache.stats
        _library_hits[key] = (stats.hit_tokens, stats.evicted_blocks, run.preemptions)
    return _library_hits[key]


def _engine_case(ctx: StageContext, name: str, what: str, model: h.CheckModel, config: Any, trace: h.Trace) -> bool:
    """One engine run with your cache: tokens, provenance and holders, tokens reused, the pool after clear()."""
    watch = _EngineWatch(ctx.part("prefix_cache"))
    result = h.run(model, config, ctx.parts(prefix_cache=watch.build), trace, on_step=watch.on_step)
    if watch.problem or (watch.audit and watch.audit.problem):
        return ctx.report.record(f"{name}: {what}", False, watch.problem or watch.audit.problem)
    if not h.compare(ctx.report, f"{name}: {what}", result):
        return False
    hits, evicted, preempted = _library_run(model, config, trace)
    mine = result.engine.prefix_cache.stats.hit_tokens
    enough = mine == hits if not evicted else mine >= HIT_SLACK * hits
    detail = (f"{mine} prompt tokens reused, the library's cache {hits} on the same trace and config ({evicted} blocks "
              f"evicted, {preempted} preemptions)")
    if not enough:
        return ctx.report.record(f"{name}: prompt tokens reused", False, detail + (
            ": fewer means a cached prefix was computed again" if mine < hits else
            ": more, with nothing evicted, means tokens were handed over that the tree does not hold"))
    ctx.report.record(f"{name}: prompt tokens reused", True,
                      f"{detail}; the K/V of every reused position ({watch.audit.reused}) was its own prefix's, and "
                      f"every running request's blocks held, after each of {result.steps} steps")
    return h.pool_full(ctx.report, f"{name}: the pool is full again after clear()", result)


def check_engine(ctx: StageContext) -> bool:
    rng = ctx.rng("engine")
    chat = h.chat_trace(QUESTIONS, max_tokens=6, name="chat prompts sharing the chat template's system prompt")
    chat.arrivals = [0, 0, 3, 9]
    bs = rng.choice((3, 5, 7))
    if not _engine_case(ctx, "inside the engine, the embedded model", f"{chat.describe()}, the last repeating the "
                        f"first, blocks of {bs}", h.embedded(),
                        h.engine_config(block_size=bs, max_num_seqs=2, prefix_cache="radix"), chat):
        return False
    model = h.hidden()
    bs = rng.choice((3, 7))
    prompts = prompt_tree(rng, 10 if ctx.full else 8, model.vocab, max_prompt=40)
    params = [SamplingParams(max_tokens=rng.randint(3, 10), ignore_eos=True) for _ in prompts]
    trace = h.Trace("a hidden prompt-tree trace", prompts, params, arrivals=sorted(rng.randint(0, 12)
                                                                                   for _ in prompts))
    per_request = math.ceil(64 / bs)
    config = h.engine_config(block_size=bs, max_model_len=64, num_blocks=per_request + 3, max_num_seqs=3,
                             prefix_cache="radix")
    return _engine_case(ctx, "inside the engine, the hidden model", f"{trace.describe()}, blocks of {bs}, a pool of "
                        f"{config.num_blocks} blocks (tight)", model, config, trace)


def check(ctx: StageContext) -> None:
    if check_match(ctx) and check_lru(ctx) and check_pressure(ctx):
        check_engine(ctx)


STAGE = Stage(
    number=7, key="radix", title="The radix prefix cache", file="07_radix_cache.py",
    components={"prefix_cache": "RadixPrefixCache"}, chapter="10", minutes=90,
    task="A radix tree over token ids that hands later requests the K/V of their longest cached prefix, token by "
         "token: the tree walk (match), insert with edge splits, reference counts on the blocks it keeps, and LRU "
         "eviction of leaves under memory pressure.",
    check=check,
    adapters={"match": as_int_list, "attach": as_count, "num_evictable": as_count, "evict_one": as_bool},
    symbol="src/infer_lab/engine/prefix_cache.py::RadixPrefixCache",
)
