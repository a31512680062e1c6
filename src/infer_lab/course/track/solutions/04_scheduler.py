"""Stage 4 · The scheduler: a reference solution."""

from collections import deque

from infer_lab.engine.scheduler import ScheduledSequence, SchedulerConfig, SchedulerOutput
from infer_lab.engine.sequence import SequenceStatus


def admit_tokens(tokens_to_compute, token_budget, fits):
    n = tokens_to_compute if token_budget is None else min(tokens_to_compute, token_budget)
    return n if n > 0 and fits(n) else 0


def split_budget(tokens_to_compute, budget):
    if budget is None:
        return list(tokens_to_compute)
    split = []
    for n in tokens_to_compute:
        n = min(n, budget)
        split.append(n)
        budget -= n
    return split


class Scheduler:
    """A waiting queue and a running list over the KV cache ``kv``."""

    def __init__(self, config: SchedulerConfig, kv) -> None:
        self.config, self.kv = config, kv
        self.waiting = deque()
        self.running = []

    def add(self, seq) -> None:
        self.waiting.append(seq)

    def remove(self, seq) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens if self.config.chunked_prefill else None

        # 1. The running requests, oldest first; the newest gives its blocks back when memory runs out.
        running = list(self.running)
        for seq, n in zip(running, split_budget([self.to_compute(s) for s in running], budget), strict=True):
            if n <= 0 or seq not in self.running:
                continue
            while seq in self.running and not self.kv.can_allocate(seq, n):
                self.preempt(self.running[-1], out)
            if seq in self.running:
                self.run(seq, n, out)
                budget = None if budget is None else budget - n

        self.admit(out, budget)
        out.idle_slots = self.config.max_num_seqs - len(out.scheduled)
        return out

    def admit(self, out, budget) -> None:
        """2. Waiting requests join, oldest first, while a slot, the budget and the blocks allow."""
        if out.preempted or (self.config.policy == "static" and self.running):
            return  # static: nobody joins until the whole batch has finished
        while self.waiting and len(self.running) < self.config.max_num_seqs and (budget is None or budget > 0):
            seq = self.waiting[0]
            self.kv.attach_prefix(seq)  # a cached prefix: num_computed grows, its blocks join the table
            n = admit_tokens(self.to_compute(seq), budget, lambda m, s=seq: self.kv.can_allocate(s, m))
            if n == 0:
                self.kv.detach_prefix(seq)
                return  # it waits, and everyone behind it
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.run(seq, n, out)
            budget = None if budget is None else budget - n

    def to_compute(self, seq) -> int:
        if not self.kv.stores_kv:
            return seq.num_tokens
        return seq.num_tokens - seq.num_computed

    def run(self, seq, n, out) -> None:
        self.kv.allocate(seq, n)
        start = seq.num_computed if self.kv.stores_kv else 0
        out.scheduled.append(ScheduledSequence(seq, start, n))

    def preempt(self, seq, out) -> None:
        self.running.remove(seq)
        self.kv.free(seq, cache_prefix=True)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
