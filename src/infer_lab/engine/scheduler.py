"""Deciding, every step, which requests run and how many of their tokens are computed.

* **Static batching** takes up to ``max_num_seqs`` requests and admits nobody else until all of
  them have finished: a request that ends early leaves its slot idle.
* **Continuous (iteration-level) batching** re-decides every step: finished requests leave and
  waiting ones join at once, as long as KV memory allows (admission by free blocks).
* **Preemption by recompute**: when a running request needs a new block and none is left, the
  most recently admitted request gives all its blocks back and goes to the front of the queue;
  later it recomputes its prompt and the tokens it already generated in one prefill.
* **Chunked prefill**: with a per-step token budget, decodes are scheduled first (one token each)
  and prompts fill what is left of the budget in chunks, so a long prompt no longer stalls
  the decoding requests for a whole step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling policy.

    Attributes:
        policy: ``"continuous"`` or ``"static"``.
        max_num_seqs: most requests running at once (batch slots).
        max_num_batched_tokens: token budget per step when ``chunked_prefill`` is on (tokens).
        chunked_prefill: split prompts into chunks under the token budget. Off: a prompt is
            computed whole in one step, however long.
    """

    policy: str = "continuous"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    chunked_prefill: bool = False

    def validate(self) -> None:
        if self.policy not in ("continuous", "static"):
            raise ValueError(f"policy must be 'continuous' or 'static', got {self.policy!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )


@dataclass
class ScheduledSequence:
    """``num_new_tokens`` tokens of ``seq`` starting at ``start`` are computed this step.

    With speculative decoding the last ``len(drafts)`` of them are guesses that follow the
    sequence's real tokens; ``draft_probs`` are the distributions they were sampled from.
    """

    seq: Sequence
    start: int
    num_new_tokens: int
    drafts: list[int] = field(default_factory=list)
    draft_probs: Any = None
    accepted: int = 0  # guesses the target kept (set after verification)

    @property
    def num_real_tokens(self) -> int:
        return self.num_new_tokens - len(self.drafts)

    @property
    def completes_context(self) -> bool:
        """True when this chunk reaches the sequence's last real token, so a new token is sampled."""
        return self.start + self.num_real_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    idle_slots: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


def admit_tokens(tokens_to_compute: int, token_budget: int | None, fits: Callable[[int], bool]) -> int:
    """How many tokens of the request at the head of the queue to schedule now (0: it waits).

    The chunk is the request's tokens, cut to what is left of the step's token budget
    (``token_budget`` is ``None`` when chunked prefill is off: the whole prompt at once), and it is
    admitted only if the KV cache can hold it (``fits(n)``: enough free blocks for ``n`` tokens).
    """
    n = tokens_to_compute if token_budget is None else min(tokens_to_compute, token_budget)
    return n if n > 0 and fits(n) else 0


def split_budget(tokens_to_compute: list[int], budget: int | None) -> list[int]:
    """How many tokens each running request computes this step: chunked prefill's split.

    ``tokens_to_compute`` holds, for every running request, oldest first, what it still has to
    compute: 1 for a request that decodes, more for a prompt still being prefilled. ``budget`` is
    the step's token budget (``None`` when chunked prefill is off: every request computes all it
    has, however long). In order, each request takes what it has, cut to what is left of the
    budget, and the budget shrinks by that much; once it is spent, the rest compute nothing this
    step. A prompt is thus cut into chunks, one per step, that fit beside the decodes::

        split_budget([1, 1, 40], 16)    -> [1, 1, 14]   two decodes, then a 14-token chunk
        split_budget([1, 1, 26], 16)    -> [1, 1, 14]   next step: 26 left, 14 more
        split_budget([1, 1, 12], 16)    -> [1, 1, 12]   the last chunk; 2 tokens left for admissions
        split_budget([30, 1], 16)       -> [16, 0]      an older prompt first: the decode waits a step
        split_budget([1, 1, 40], None)  -> [1, 1, 40]   no chunking: the whole prompt in one step

    """
    if budget is None:
        return list(tokens_to_compute)
    split = []
    for n in tokens_to_compute:
        n = min(n, budget)
        split.append(n)
        budget -= n
    return split


class Scheduler:
    """Waiting queue + running list over a KV cache ``kv``: who runs each step, and how many tokens.

    The interface the engine's step loop uses (and the course's build track asks a learner to
    write, stage 4): ``add(seq)``, ``remove(seq)``, ``has_unfinished()`` and ``schedule()``.
    From ``kv`` it uses ``can_allocate`` / ``allocate`` / ``free`` and, for the prefix cache,
    ``attach_prefix`` / ``detach_prefix`` (which do nothing when there is none).
    """

    def __init__(self, config: SchedulerConfig, kv: Any):
        config.validate()
        self.config, self.kv = config, kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """A new request joins the back of the queue."""
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queue or the running list (it finished or was cancelled).

        Its KV memory is the caller's to free (the step loop's ``finish``).
        """
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _tokens_to_compute(self, seq: Sequence) -> int:
        if not self.kv.stores_kv:
            return seq.num_tokens  # no cache: everything, every step
        return seq.num_tokens - seq.num_computed

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Preemption by recompute: ``seq`` gives all its blocks back and waits at the front of the queue.

        Its computed tokens go to the prefix cache first (if any), so the recompute may find them.
        """
        self.running.remove(seq)
        self.kv.free(seq, cache_prefix=True)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def schedule(self) -> SchedulerOutput:
        """The work of the next step. KV memory for it is allocated before this returns."""
        cfg, out = self.config, SchedulerOutput()
        budget = cfg.max_num_batched_tokens if cfg.chunked_prefill else None

        # 1. Requests already running, oldest first, each its share of the budget (split_budget);
        #    the newest are preempted if memory runs out.
        running = list(self.running)
        split = split_budget([self._tokens_to_compute(seq) for seq in running], budget)
        for seq, n in zip(running, split, strict=True):
            if n <= 0 or seq not in self.running:
                continue  # nothing to compute, or preempted a moment ago to make room for an older request
            while seq in self.running and not self.kv.can_allocate(seq, n):
                self._preempt(self.running[-1], out)  # the newest gives its blocks back (perhaps seq itself)
            if seq not in self.running:
                continue
            self.kv.allocate(seq, n)
            out.scheduled.append(ScheduledSequence(seq, seq.num_computed if self.kv.stores_kv else 0, n))
            budget = None if budget is None else budget - n

        # 2. Admit waiting requests.
        self.admit(out, budget)
        out.idle_slots = cfg.max_num_seqs - len(out.scheduled)
        return out

    def admit(self, out: SchedulerOutput, budget: int | None) -> None:
        """Step 2 of :meth:`schedule`: waiting requests join, oldest first, into ``out``.

        One joins while a batch slot is free, the step's token budget (``None``: none) lasts and
        the KV cache can hold its prompt (:func:`admit_tokens`). Static batching admits only into
        an empty batch; no policy admits in a step that had to preempt.
        """
        cfg = self.config
        if out.preempted or (cfg.policy == "static" and self.running):
            return  # static: nobody joins until the whole batch has finished
        while self.waiting and len(self.running) < cfg.max_num_seqs and (budget is None or budget > 0):
            seq = self.waiting[0]
            self.kv.attach_prefix(seq)  # a cached prefix: its blocks join seq's table, num_computed grows
            n = admit_tokens(self._tokens_to_compute(seq), budget, lambda m, s=seq: self.kv.can_allocate(s, m))
            if n <= 0:
                self.kv.detach_prefix(seq)
                return  # no memory: it waits, and so does everyone behind it
            self.waiting.popleft()
            self.kv.allocate(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, seq.num_computed if self.kv.stores_kv else 0, n))
            budget = None if budget is None else budget - n
