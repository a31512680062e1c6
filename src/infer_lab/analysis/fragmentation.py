"""Where KV memory goes over time: used, reserved for later, internal and external fragmentation.

A small discrete-time simulation in the spirit of the vLLM paper (Kwon et al., 2023, Fig. 2-3).
Requests of a mixed workload arrive over time; each engine step, every running request writes one
token's K/V; a request leaves when it has generated its output. All requests share a fixed KV
budget of ``budget_slots`` token slots, handed out by one of three layouts:

* ``contiguous-max``: each admitted request reserves ``max_model_len`` contiguous slots (early
  servers, Orca (Max) in the paper).
* ``contiguous-exact``: each request reserves ``prompt + max_tokens`` contiguous slots, where
  ``max_tokens`` is the limit the client *declared*; it usually generates fewer. Reservations have
  different sizes, so the :class:`FirstFitAllocator` leaves holes between them.
* ``paged``: blocks of ``block_size`` slots are taken from a :class:`~infer_lab.engine.block_manager.BlockManager` as the
  request grows (``ceil(tokens / block_size)`` blocks), as in vLLM.

After every step each slot of the budget is in exactly one class (:class:`StepSlots`):

* **used**: holds a token's K/V now;
* **reserved for future tokens** (over-reservation): reserved by a request for tokens it *will*
  generate later in its life;
* **internal fragmentation**: reserved by a request but never filled (past ``prompt + actual
  output``; for paged, the empty tail of the last block);
* **external fragmentation**: free slots that are blocked: the first waiting request does not fit
  in any free contiguous range although the free total would hold it. Counted only at such steps;
* **free**: everything else.

Scheduling is first-come-first-served with head-of-line blocking (a waiting request is admitted
only after the ones ahead of it), and the paged layout preempts the newest running request by
recompute when a block runs out (vLLM's default). Everything is plain ints: no tensors, no model.

This is the engine's continuous-batching policy (:mod:`infer_lab.engine.scheduler`) reduced to what
memory accounting needs, and it differs on purpose: one token per request per step (no prefill
token budget, no chunking), no batch-slot cap, and the layout, not the scheduler, decides what
fits, because the lesson compares layouts under the same admission order.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..engine.block_manager import BlockManager, OutOfKVMemory

LAYOUTS = ("contiguous-max", "contiguous-exact", "paged")


@dataclass(frozen=True)
class Request:
    """One request of the workload, in tokens and engine steps.

    ``output_len`` is what it really generates (at most ``max_tokens``); ``max_tokens`` is the
    limit it declared, which is all an allocator can know when the request arrives.
    """

    arrival_step: int
    prompt_len: int
    output_len: int
    max_tokens: int

    @property
    def final_len(self) -> int:
        """Tokens held at the end of its life: ``prompt_len + output_len``."""
        return self.prompt_len + self.output_len


def make_requests(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_model_len: int,
    max_tokens: int | Sequence[int] | None = 512,
    arrival_every: float = 1.0,
) -> list[Request]:
    """Requests from a workload's lengths; request ``i`` arrives at step ``int(i * arrival_every)``.

    ``max_tokens`` is the declared limit per request (one int for all, one per request, or
    ``None`` for an oracle that declares exactly its output length). Like a server, the output is
    cut at the declared limit and at ``max_model_len``, so every layout sees the same tokens.
    """
    n = len(prompt_lens)
    if len(output_lens) != n:
        raise ValueError(f"{n} prompt lengths but {len(output_lens)} output lengths")
    if max_tokens is None:
        declared = list(output_lens)
    elif isinstance(max_tokens, int):
        declared = [max_tokens] * n
    else:
        declared = list(max_tokens)
    requests = []
    for i, (p, o, m) in enumerate(zip(prompt_lens, output_lens, declared, strict=True)):
        if not 1 <= p < max_model_len or o < 1 or m < 1:
            raise ValueError(f"request {i}: prompt {p}, output {o}, max_tokens {m} do not fit")
        m = min(m, max_model_len - p)
        requests.append(Request(int(i * arrival_every), p, min(o, m), m))
    return requests


class FirstFitAllocator:
    """Variable-sized contiguous ranges of one linear space of ``capacity`` slots, placed first fit.

    Free space is a list of ``(start, length)`` ranges sorted by start. ``allocate`` takes the
    front of the first range that is long enough; ``free`` merges the range back with any free
    neighbour (coalescing), so adjacent holes always appear as one bigger hole.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.free_ranges: list[tuple[int, int]] = [(0, capacity)]
        self.allocated: dict[int, int] = {}  # start -> length of every live reservation

    @property
    def num_free(self) -> int:
        return sum(length for _, length in self.free_ranges)

    @property
    def largest_free(self) -> int:
        return max((length for _, length in self.free_ranges), default=0)

    def find(self, size: int) -> int | None:
        """Start of the first free range that holds ``size`` slots, or None."""
        return next((start for start, length in self.free_ranges if length >= size), None)

    def allocate(self, size: int) -> int:
        """Reserve ``size`` contiguous slots; returns their start (raises OutOfKVMemory)."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        for i, (start, length) in enumerate(self.free_ranges):
            if length >= size:  # first fit: the lowest hole that is big enough
                if length == size:
                    del self.free_ranges[i]
                else:
                    self.free_ranges[i] = (start + size, length - size)
                self.allocated[start] = size
                return start
        raise OutOfKVMemory(f"no free range of {size} slots (largest is {self.largest_free})")

    def free(self, start: int) -> None:
        """Give back the reservation that begins at ``start``, merging it with free neighbours."""
        if start not in self.allocated:
            raise ValueError(f"no reservation starts at slot {start} (double free?)")
        size = self.allocated.pop(start)
        i = bisect.bisect(self.free_ranges, (start, size))
        if i > 0 and sum(self.free_ranges[i - 1]) == start:  # previous hole ends where we start
            i -= 1
            start, size = self.free_ranges[i][0], self.free_ranges[i][1] + size
            del self.free_ranges[i]
        if i < len(self.free_ranges) and self.free_ranges[i][0] == start + size:  # next touches
            size += self.free_ranges[i][1]
            del self.free_ranges[i]
        self.free_ranges.insert(i, (start, size))


class ContiguousLayout:
    """Each request reserves one contiguous range at admission, for its whole life.

    ``reservation`` is ``"max"`` (``max_model_len`` slots) or ``"exact"`` (``prompt + max_tokens``).
    """

    def __init__(self, budget_slots: int, max_model_len: int, reservation: str):
        if reservation not in ("max", "exact"):
            raise ValueError(f"reservation must be 'max' or 'exact', got {reservation!r}")
        self.name = f"contiguous-{reservation}"
        self.max_model_len, self.reservation = max_model_len, reservation
        self.allocator = FirstFitAllocator(budget_slots)
        self.starts: dict[int, int] = {}  # request id -> start of its range

    def need(self, req: Request, tokens: int) -> int:
        """Slots the request must get at admission: its whole reservation, whatever ``tokens``."""
        return self.max_model_len if self.reservation == "max" else req.prompt_len + req.max_tokens

    def fits(self, req: Request, tokens: int) -> bool:
        return self.allocator.find(self.need(req, tokens)) is not None

    def admit(self, rid: int, req: Request, tokens: int) -> None:
        self.starts[rid] = self.allocator.allocate(self.need(req, tokens))

    def grow(self, rid: int, tokens: int) -> bool:
        return tokens <= self.reserved(rid)  # reserved up front: growing never allocates

    def release(self, rid: int) -> None:
        self.allocator.free(self.starts.pop(rid))

    def reserved(self, rid: int) -> int:
        return self.allocator.allocated[self.starts[rid]]

    @property
    def num_free(self) -> int:
        return self.allocator.num_free


class PagedLayout:
    """Blocks of ``block_size`` slots on demand from the engine's :class:`BlockManager` (vLLM's rule).

    The pool has ``budget_slots // block_size`` blocks; a remainder under one block stays free.
    """

    def __init__(self, budget_slots: int, block_size: int):
        self.name = "paged"
        self.block_size = block_size
        self.blocks = BlockManager(budget_slots // block_size, block_size)
        self.tables: dict[int, list[int]] = {}  # request id -> its block table

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def need(self, req: Request, tokens: int) -> int:
        """Slots (whole blocks) a request holding ``tokens`` tokens needs."""
        return self.blocks_for(tokens) * self.block_size

    def fits(self, req: Request, tokens: int) -> bool:
        return self.blocks_for(tokens) <= self.blocks.num_free_blocks()

    def admit(self, rid: int, req: Request, tokens: int) -> None:
        self.tables[rid] = []
        if not self.grow(rid, tokens):
            raise OutOfKVMemory(f"{self.blocks_for(tokens)} blocks needed, fewer are free")

    def grow(self, rid: int, tokens: int) -> bool:
        """Make room for ``tokens`` tokens; False (nothing taken) when the pool runs short."""
        try:
            self.blocks.grow(self.tables[rid], tokens)
        except OutOfKVMemory:
            return False
        return True

    def release(self, rid: int) -> None:
        self.blocks.shrink(self.tables.pop(rid), 0)

    def reserved(self, rid: int) -> int:
        return len(self.tables[rid]) * self.block_size

    @property
    def num_free(self) -> int:
        return self.blocks.num_free_blocks() * self.block_size


Layout = ContiguousLayout | PagedLayout


def make_layout(name: str, budget_slots: int, max_model_len: int, block_size: int = 16) -> Layout:
    """One of :data:`LAYOUTS` over a budget of ``budget_slots`` token slots."""
    if name == "paged":
        return PagedLayout(budget_slots, block_size)
    if name in ("contiguous-max", "contiguous-exact"):
        return ContiguousLayout(budget_slots, max_model_len, name.removeprefix("contiguous-"))
    raise ValueError(f"layout must be one of {LAYOUTS}, got {name!r}")


@dataclass(frozen=True)
class StepSlots:
    """Every slot of the budget after one step, in token slots (the five classes sum to the budget)."""

    step: int
    running: int
    waiting: int
    used: int
    future: int  # reserved for tokens the request will still generate (over-reservation)
    internal: int  # reserved, never filled
    external: int  # free but blocked: the head of the queue fits in total, not in any range
    free: int


@dataclass
class Timeline:
    """What :func:`simulate` measured for one layout."""

    layout: str
    budget_slots: int
    steps: list[StepSlots] = field(default_factory=list)
    preemptions: int = 0
    eol_used: int = 0  # sum over requests of prompt + output at the end of their life
    eol_reserved: int = 0  # sum over requests of the slots they held at that moment

    def total(self, kind: str) -> int:
        """Slot-steps of one class summed over the run (``used``, ``future``, ...)."""
        return sum(getattr(s, kind) for s in self.steps)

    def fractions(self) -> dict[str, float]:
        """Time-averaged share of each class in the memory that was allocated or blocked.

        ``fraction[k] = sum over steps of k / sum over steps of (used + future + internal +
        external)``: a ratio of slot-steps, so a step with much memory in play weighs more than
        an almost idle one. Free memory is left out (it is not waste, only spare budget). The four
        shares sum to 1; the vLLM paper's "waste" is ``1 - used``.
        """
        kinds = ("used", "future", "internal", "external")
        totals = {k: self.total(k) for k in kinds}
        denominator = sum(totals.values())
        return {k: totals[k] / denominator if denominator else 0.0 for k in kinds}


def simulate(
    layout: Layout, requests: Sequence[Request], budget_slots: int, max_steps: int = 1_000_000
) -> Timeline:
    """Run the workload through ``layout`` step by step until every request has finished.

    One step: (1) arrivals join the queue; (2) each running request makes room for one more token
    (paged may have to preempt the newest running request, which goes back to the queue front
    and later recomputes its tokens); (3) if nothing was preempted, waiting requests are admitted
    in arrival order while the first one fits; (4) every running request writes one token's K/V;
    (5) all slots are classified (:class:`StepSlots`); (6) requests with all their output leave.
    """
    for i, req in enumerate(requests):
        admit_all = layout.need(req, req.final_len)  # the most it will ever ask for
        if admit_all > budget_slots:
            raise ValueError(f"request {i} needs {admit_all} slots, the budget is {budget_slots}")
    timeline = Timeline(layout.name, budget_slots)
    arrivals = sorted(range(len(requests)), key=lambda i: requests[i].arrival_step)
    waiting: deque[int] = deque()
    running: list[int] = []  # in admission order, oldest first
    generated = [0] * len(requests)  # output tokens so far (kept across a preemption)
    next_arrival, finished, step = 0, 0, 0

    def tokens(rid: int) -> int:  # tokens whose K/V the request holds
        return requests[rid].prompt_len + generated[rid]

    while finished < len(requests):
        if step >= max_steps:
            raise RuntimeError(f"workload not finished after {max_steps} steps")
        while (
            next_arrival < len(arrivals) and requests[arrivals[next_arrival]].arrival_step <= step
        ):
            waiting.append(arrivals[next_arrival])
            next_arrival += 1

        preempted = False
        for rid in list(running):
            if rid not in running:  # preempted earlier in this loop
                continue
            while not layout.grow(rid, tokens(rid) + 1):
                victim = running.pop()  # newest first: the oldest requests keep making progress
                layout.release(victim)
                waiting.appendleft(victim)
                timeline.preemptions += 1
                preempted = True
                if victim == rid:
                    break

        # After a preemption memory is tight: admitting more would only cause the next one.
        while waiting and not preempted:
            rid = waiting[0]
            if not layout.fits(requests[rid], tokens(rid) + 1):
                break
            layout.admit(rid, requests[rid], tokens(rid) + 1)
            running.append(waiting.popleft())

        for rid in running:
            generated[rid] += 1
        timeline.steps.append(
            _classify(step, layout, budget_slots, requests, running, waiting, tokens)
        )

        for rid in [r for r in running if generated[r] == requests[r].output_len]:
            timeline.eol_used += tokens(rid)
            timeline.eol_reserved += layout.reserved(rid)
            layout.release(rid)
            running.remove(rid)
            finished += 1
        step += 1
    return timeline


def _classify(
    step: int,
    layout: Layout,
    budget_slots: int,
    requests: Sequence[Request],
    running: list[int],
    waiting: deque[int],
    tokens: Callable[[int], int],
) -> StepSlots:
    """Put every slot of the budget in one class (see the module docstring)."""
    used = future = internal = 0
    for rid in running:
        held, reserved = tokens(rid), layout.reserved(rid)
        will_fill = min(reserved, requests[rid].final_len)  # slots it will ever write
        used += held
        future += will_fill - held
        internal += reserved - will_fill
    external = 0
    if waiting:  # is the head of the queue held back by holes rather than by a full memory?
        head, head_tokens = requests[waiting[0]], tokens(waiting[0]) + 1
        if layout.num_free >= layout.need(head, head_tokens) and not layout.fits(head, head_tokens):
            external = layout.num_free
    free = budget_slots - used - future - internal - external
    return StepSlots(step, len(running), len(waiting), used, future, internal, external, free)
