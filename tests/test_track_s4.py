"""Stage 4, the scheduler: the starter fails, the solution passes (its runs preempt, chunk, share prefixes and
make requests wait after a prefix lookup), near misses are caught by name, and correct answers written
differently pass."""

from __future__ import annotations

import pytest
from track_helpers import (
    assert_near_miss_caught,
    assert_variant_passes,
    check_text,
    failures,
    mutated,
    solution_result,
    source,
)

from infer_lab.course import track

KEY = "scheduler"


def _detail(result, case_start: str) -> str:
    return next(o.detail for o in result.outcomes if o.case.startswith(case_start))


def test_the_starter_is_not_done_and_the_solution_passes(tmp_path, track_solutions):
    starter = track.starter_path(track.stage(KEY)).read_text()
    assert check_text(KEY, starter, tmp_path).status == "todo"
    result = solution_result(track_solutions, KEY)
    assert result.passed, failures(result)
    assert result.tokens_identical and len(result.engine_runs) == 6
    # The traces exercise what they are there for (CI's seed): preemption, a prefix cache that reuses
    # prompts and requests that wait after a lookup (detach_prefix), static batching.
    for label in ("chunked prefill", "no chunking", "chat"):
        assert " 0 preemption(s)" not in _detail(result, f"{label}: what schedule() returned"), label
    tight = _detail(result, "prefix cache, tight pool: what schedule() returned")
    assert " 0 detach_prefix" not in tight and " 0 prompt tokens reused" not in tight
    assert " 0 prompt tokens reused" not in _detail(result, "prefix cache: prefix-cache hits")
    assert "static batches closed" in _detail(result, "static batching: what schedule() returned")


NEAR_MISSES = [  # (name, old, new, what the check must say)
    ("preempts-the-oldest", "self.preempt(self.running[-1], out)", "self.preempt(self.running[0], out)",
     "also preempted in it"),
    ("admit-ignores-fits", "return n if n > 0 and fits(n) else 0", "return n", "OutOfKVMemory"),
    # Admission that never asks for free blocks, in the class itself: chunking off and a small pool crash the engine.
    ("admission-never-asks-kv", "lambda m, s=seq: self.kv.can_allocate(s, m)", "lambda m: True",
     "ask kv.can_allocate(seq, n) before kv.allocate"),
    ("split-whole-budget", "        n = min(n, budget)\n        split.append(n)\n        budget -= n\n",
     "        split.append(min(n, budget))\n", "not to the 14 tokens the requests before it left"),
    # A prompt gets one token per step once admitted: efficiency is the lesson, the step bound catches it.
    ("one-token-chunks", "split_budget([self.to_compute(s) for s in running], budget)",
     "split_budget([1 if budget is not None else self.to_compute(s) for s in running], budget)",
     "a chunk takes all the budget leaves"),
    ("half-budget", "budget = self.config.max_num_batched_tokens if",
     "budget = self.config.max_num_batched_tokens // 2 if", "the library scheduler's"),
    ("no-preemption", "            while seq in self.running and not self.kv.can_allocate(seq, n):\n"
                      "                self.preempt(self.running[-1], out)\n",
     "            if not self.kv.can_allocate(seq, n):\n                continue\n", "preempt the newest running request"),
    ("static-admits-mid-batch", 'if out.preempted or (self.config.policy == "static" and self.running):',
     "if out.preempted:", "a static batch takes nobody until all of it has finished"),
    ("forgotten-detach", "            if n == 0:\n                self.kv.detach_prefix(seq)\n", "            if n == 0:\n",
     "kv.detach_prefix(seq) gives them back"),
    ("never-attach", "            self.kv.attach_prefix(seq)  # a cached prefix: num_computed grows, its blocks join the "
                     "table\n", "", "never called kv.attach_prefix"),
    ("preempt-keeps-num_computed", "        seq.num_computed = 0\n", "", "set seq.num_computed = 0"),
    ("slots-ignored", "while self.waiting and len(self.running) < self.config.max_num_seqs and (",
     "while self.waiting and (", "more than max_num_seqs"),
    ("remove-forgets-the-queue", "        if seq in self.waiting:\n            self.waiting.remove(seq)\n", "",
     "remove(seq) must take it out"),
]


@pytest.mark.parametrize("name, old, new, phrase", NEAR_MISSES, ids=[n[0] for n in NEAR_MISSES])
def test_a_near_miss_is_caught(tmp_path, name, old, new, phrase):
    assert_near_miss_caught(KEY, old, new, phrase, tmp_path)


def test_admission_without_free_blocks_crashes_the_engine_with_a_hint(tmp_path):
    """The issue's case: chunking off, a small pool; the boundary says OutOfKVMemory, where, and what to do."""
    text = mutated(KEY, {"lambda m, s=seq: self.kv.can_allocate(s, m)": "lambda m: True"})
    said = failures(check_text(KEY, text, tmp_path, fail_fast=True))
    assert "no chunked prefill" in said and "raised OutOfKVMemory" in said and "04_scheduler.py:" in said, said


VARIANTS = {  # correct answers written differently
    # The largest chunk that fits when the whole one does not (under a budget): a policy of its own.
    "largest-chunk-that-fits": {
        "    return n if n > 0 and fits(n) else 0":
        "    if token_budget is None:\n        return n if fits(n) else 0\n"
        "    while n > 0 and not fits(n):\n        n -= 1\n    return n",
    },
    # Another preemption victim: the request (not yet scheduled this step) that computed the fewest tokens.
    "fewest-computed-victim": {
        "                self.preempt(self.running[-1], out)":
        "                done = {id(i.seq) for i in out.scheduled}\n"
        "                victims = [s for s in self.running if id(s) not in done]\n"
        "                self.preempt(min(reversed(victims), key=lambda s: s.num_computed), out)",
    },
    "generators-tuples-floats": {
        "    if budget is None:\n        return list(tokens_to_compute)\n    split = []\n    for n in tokens_to_compute:\n"
        "        n = min(n, budget)\n        split.append(n)\n        budget -= n\n    return split\n":
        "    for n in tokens_to_compute:\n        if budget is None:\n            yield n\n            continue\n"
        "        n = min(n, budget)\n        yield n\n        budget -= n\n",
        "        self.admit(out, budget)\n        out.idle_slots = self.config.max_num_seqs - len(out.scheduled)\n"
        "        return out\n":
        "        self.admit(out, budget)\n"
        "        return SchedulerOutput(scheduled=(s for s in out.scheduled), preempted=tuple(out.preempted))\n",
        "    return n if n > 0 and fits(n) else 0": "    return float(n) if n > 0 and fits(n) else 0.0",
    },
}

DECODES_FIRST = '''"""Stage 4 written another way: decodes first, then prompt chunks; plain lists; one method."""

from infer_lab.engine.scheduler import ScheduledSequence, SchedulerOutput
from infer_lab.engine.sequence import SequenceStatus


def admit_tokens(tokens_to_compute, token_budget, fits):
    want = tokens_to_compute if token_budget is None else min(token_budget, tokens_to_compute)
    if want <= 0:
        return 0
    return want if fits(want) else 0


def split_budget(tokens_to_compute, budget):
    if budget is None:
        return tuple(tokens_to_compute)
    out = [0] * len(tokens_to_compute)
    order = sorted(range(len(tokens_to_compute)), key=lambda i: (tokens_to_compute[i] != 1, i))
    for i in order:  # decodes first, then prompts, oldest first within each
        out[i] = min(tokens_to_compute[i], budget)
        budget -= out[i]
    return out


class Scheduler:
    def __init__(self, config, kv):
        self.cfg = config
        self.kv = kv
        self.waiting = []
        self.running = []

    def add(self, seq):
        self.waiting.append(seq)

    def remove(self, seq):
        self.waiting = [s for s in self.waiting if s is not seq]
        self.running = [s for s in self.running if s is not seq]

    def has_unfinished(self):
        return len(self.waiting) + len(self.running) > 0

    def schedule(self):
        budget = self.cfg.max_num_batched_tokens if self.cfg.chunked_prefill else None
        items, preempted = [], []
        todo = [s.num_tokens - s.num_computed for s in self.running]
        for seq, n in list(zip(list(self.running), split_budget(todo, budget))):
            if n == 0 or seq not in self.running:
                continue
            while not self.kv.can_allocate(seq, n):
                victim = self.running.pop()
                self.kv.free(victim, cache_prefix=True)
                victim.num_computed = 0
                victim.num_preemptions += 1
                victim.status = SequenceStatus.WAITING
                self.waiting.insert(0, victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq in self.running:
                self.kv.allocate(seq, n)
                items.append(ScheduledSequence(seq, seq.num_computed, n))
                if budget is not None:
                    budget -= n
        if not preempted and not (self.cfg.policy == "static" and self.running):
            while self.waiting and len(self.running) < self.cfg.max_num_seqs and budget != 0:
                head = self.waiting[0]
                self.kv.attach_prefix(head)
                n = admit_tokens(head.num_tokens - head.num_computed, budget,
                                 lambda m: self.kv.can_allocate(head, m))
                if not n:
                    self.kv.detach_prefix(head)
                    break
                self.waiting.pop(0)
                head.status = SequenceStatus.RUNNING
                self.running.append(head)
                self.kv.allocate(head, n)
                items.append(ScheduledSequence(head, head.num_computed, n))
                if budget is not None:
                    budget -= n
        return SchedulerOutput(items, preempted, self.cfg.max_num_seqs - len(items))
'''


@pytest.mark.parametrize("name", [*VARIANTS, "decodes-first-file"])
def test_a_correct_variant_passes(tmp_path, name):
    text = DECODES_FIRST if name == "decodes-first-file" else mutated(KEY, VARIANTS[name])
    assert_variant_passes(KEY, text, tmp_path)


def test_a_scheduler_without_the_running_and_waiting_lists_is_told_to_keep_them(tmp_path):
    """The server reports their lengths on /metrics; the starter says so, and the check asks for them."""
    text = source(KEY).replace("self.running", "self.active")
    result = check_text(KEY, text, tmp_path, fail_fast=True)
    assert result.status == "fail" and "keep the running requests in self.running" in failures(result)
