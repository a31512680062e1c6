"""Stage 4 · The scheduler: who runs each step, and how many of their tokens are computed.

Every engine step starts with ``Scheduler.schedule()``: it picks the requests that run in this
step and, for each, a run of its tokens to compute (a whole prompt, a chunk of one, or the one
token a decoding request computes), and it gets their KV blocks before it returns. The step loop
then runs one forward pass over exactly that.

Your scheduler keeps a waiting queue and a running list, as the attributes ``waiting`` and
``running`` (the server reports their lengths on ``/metrics``). On hidden traces the check holds
you to: at most ``config.max_num_seqs`` running, the token budget, static batching's closed
batch, a request's blocks allocated before it is scheduled and from its ``num_computed``,
nothing scheduled twice or after it finished, no waiting request holding blocks, every request
finished with transformers' tokens, and **no more steps than the library's scheduler x 1.1**
on the same trace. Below is how the library's scheduler decides (first come, first served); a
policy of yours may differ where it still keeps all of that:

* **Continuous batching** (``config.policy == "continuous"``): every step, after the running
  requests, waiting ones join while a batch slot is free (at most ``config.max_num_seqs``
  running), the step's token budget lasts and the KV cache can hold their tokens. The head of the
  queue that does not fit waits, and so does everyone behind it.
* **Static batching** (``"static"``): nobody joins while any request of the batch still runs.
* **Chunked prefill** (``config.chunked_prefill``): a step computes at most
  ``config.max_num_batched_tokens`` tokens. Running requests come first, oldest first, each
  taking what it has to compute cut to what is left of the budget; waiting requests get the
  rest. A long prompt is thus computed in chunks, each as large as the budget allows (a chunk
  smaller than it needs to be costs steps: the check counts them). Off: a prompt is computed
  whole, in one step, however long.
* **Preemption by recompute**: when a running request needs more blocks than are free, the
  newest running request gives all its blocks back (``kv.free(seq, cache_prefix=True)``), its
  ``num_computed`` goes back to 0, and it waits at the *front* of the queue; later it
  recomputes everything (prompt and generated tokens) as one prefill. No one joins in a step
  that had to preempt.

The KV cache ``kv`` (the engine's; every count is in tokens, a Python ``int``, no tensors here):

* ``kv.can_allocate(seq, n) -> bool``: are enough blocks free for ``n`` more tokens of ``seq``?
* ``kv.allocate(seq, n)``: grow ``seq.block_table`` for ``n`` more tokens after its
  ``seq.num_computed``; it raises ``OutOfKVMemory`` when they do not fit (ask first).
* ``kv.free(seq, cache_prefix=True)``: give back all of ``seq``'s blocks (preemption).
* ``kv.attach_prefix(seq)``: before sizing a waiting request, find its prompt's longest cached
  prefix (the prefix cache, when the engine has one): ``seq.num_computed`` grows by the tokens
  found and their blocks join its table. ``kv.detach_prefix(seq)`` undoes it when the request
  then waits after all (or its blocks stay held while it waits: a leak). Both do nothing
  without a prefix cache.
* ``kv.stores_kv``: True (the checks run paged KV).

A request ``seq`` (:class:`infer_lab.engine.sequence.Sequence`) has ``seq.num_tokens`` (prompt +
generated so far) and ``seq.num_computed`` (the leading tokens whose K/V is cached); it has
``seq.num_tokens - seq.num_computed`` tokens left to compute. Set ``seq.status``
(``SequenceStatus.RUNNING`` / ``WAITING``) and count ``seq.num_preemptions`` as you go (the
engine's statistics read them). The step loop, not you, moves ``num_computed`` forward after the
forward pass and frees a finished request's blocks (then calls ``remove``).

Write the two guided functions first, then the class (it may use them):
``admit_tokens`` (chapter 09's admission rule) and ``split_budget`` (chapter 11's chunked
prefill). Check it: ``infer-lab check engine scheduler``. Your scheduler then runs inside the real
engine on hidden traces (arrivals, tight pools that force preemption, chunked prefill on and off,
static batching, a prefix cache), with every token compared with transformers, the budget, the
slots and the pool checked, and its step count held to the library scheduler's x 1.1 on the same
trace. The library's version: ``src/infer_lab/engine/scheduler.py``.
"""

from collections.abc import Callable

from infer_lab.engine.scheduler import ScheduledSequence, SchedulerConfig, SchedulerOutput  # noqa: F401
from infer_lab.engine.sequence import Sequence, SequenceStatus  # noqa: F401


def admit_tokens(tokens_to_compute: int, token_budget: int | None, fits: Callable[[int], bool]) -> int:
    """How many tokens of the request at the head of the waiting queue to schedule now (0: it waits).

    ``tokens_to_compute`` is what it still has to compute (its prompt, less a prefix-cache hit);
    ``token_budget`` is what is left of this step's token budget, or ``None`` when chunked prefill
    is off (no budget: the whole prompt at once). ``fits(n)`` says whether the KV cache has the
    free blocks for ``n`` more tokens of this request.

    Returns the tokens to schedule: its tokens cut to the budget when they fit, 0 when they do
    not (it waits, and everyone behind it). Never more than the request has or the budget allows,
    never a chunk whose blocks are not free.
    """
    raise NotImplementedError


def split_budget(tokens_to_compute: list[int], budget: int | None) -> list[int]:
    """How many tokens each running request computes this step: chunked prefill's split.

    ``tokens_to_compute`` holds, for every running request, oldest first, what it still has to
    compute: 1 for a request that decodes, more for a prompt still being prefilled. ``budget`` is
    the step's token budget (``None``: chunked prefill is off, every request computes all it has).

    Returns one count per request, in order: each takes what it has, cut to what is left of the
    budget, which shrinks by that much; once it is spent, the rest compute 0 this step. So the
    counts add up to ``min(sum(tokens_to_compute), budget)``: no more (the budget), no less (a step
    that leaves budget unused while a prompt waits for its next chunk is a wasted step)::

        split_budget([1, 1, 40], 16)    -> [1, 1, 14]   two decodes, then a 14-token chunk
        split_budget([30, 1], 16)       -> [16, 0]      an older prompt first: the decode waits a step
        split_budget([1, 1, 40], None)  -> [1, 1, 40]   no chunking: the whole prompt in one step
    """
    raise NotImplementedError


class Scheduler:
    """A waiting queue and a running list over the KV cache ``kv``: who runs each step, how many tokens.

    The engine builds it as ``Scheduler(config, kv)`` and calls ``add`` when a request arrives,
    ``schedule`` at the start of every step, ``has_unfinished`` to know whether to step again,
    and ``remove`` when a request finishes or is cancelled.
    """

    def __init__(self, config: SchedulerConfig, kv) -> None:
        """``config``: ``policy``, ``max_num_seqs``, ``chunked_prefill``, ``max_num_batched_tokens``."""
        raise NotImplementedError

    def add(self, seq: Sequence) -> None:
        """A new request joins the back of the waiting queue."""
        raise NotImplementedError

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queue or the running list (it finished or was cancelled).

        Only that: the step loop's ``finish`` has freed (or will free) its KV blocks.
        """
        raise NotImplementedError

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
        raise NotImplementedError

    def schedule(self) -> SchedulerOutput:
        """The work of the next step, with its KV blocks allocated before it returns.

        Returns ``SchedulerOutput(scheduled=[ScheduledSequence(seq, start, num_new_tokens), ...],
        preempted=[...])``: ``num_new_tokens`` (>= 1) tokens of ``seq`` from position ``start``,
        which is ``seq.num_computed`` (read it after ``attach_prefix``), computed in this step;
        ``preempted`` lists the requests preempted in it. Each request at most once.
        """
        raise NotImplementedError
