"""The engine's scheduler and KV caches driven without a model, for checks that need their decisions.

A step here does what :class:`infer_lab.engine.Engine` does after its forward pass, minus the
forward pass: every scheduled sequence's computed tokens advance, a sequence whose context is
complete gets one new token (id 0), and a sequence with all its tokens leaves the scheduler.
Decisions (who is admitted, how big each chunk is, which blocks are used) are the real ones.
"""

from __future__ import annotations

import torch

from ...engine import PagedKVCache, SamplingParams, Scheduler, SchedulerConfig, Sequence
from ...engine.scheduler import SchedulerOutput
from ...engine.sequence import SequenceStatus
from ...shape import ModelShape, model_shape

CHECK_MODEL = "smollm2-135m"


def tiny_shape() -> ModelShape:
    """The embedded model's shape with one layer: real head sizes, a few KB per block."""
    return model_shape(CHECK_MODEL).with_layers(1)


def paged_cache(num_blocks: int, block_size: int) -> PagedKVCache:
    return PagedKVCache(tiny_shape(), num_blocks, block_size, torch.float32)


def sequence(request_id: str, prompt: list[int] | int, max_tokens: int = 1) -> Sequence:
    """A request with ``prompt`` token ids (or that many distinct ids) and ``max_tokens`` to generate."""
    ids = list(range(1, prompt + 1)) if isinstance(prompt, int) else list(prompt)
    return Sequence(request_id, ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival_s=0.0)


def scheduler(kv: PagedKVCache, policy: str = "continuous", max_num_seqs: int = 16,
              budget: int | None = None) -> Scheduler:
    """The engine's scheduler over ``kv`` (a prefix cache built over ``kv`` is already attached to it)."""
    config = SchedulerConfig(policy=policy, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=budget or 512, chunked_prefill=budget is not None)
    return Scheduler(config, kv)


def advance(sched: Scheduler, out: SchedulerOutput) -> None:
    """The engine's bookkeeping after a step: computed tokens, one new token, finished requests leave."""
    for item in out.scheduled:
        seq = item.seq
        seq.num_computed = item.start + item.num_real_tokens
        if not item.completes_context:
            continue
        seq.output_ids.append(0)
        if len(seq.output_ids) >= seq.params.max_tokens:
            sched.remove(seq)
            sched.kv.free(seq)
            seq.status = SequenceStatus.FINISHED


def run_to_completion(sched: Scheduler, max_steps: int = 100_000) -> list[SchedulerOutput]:
    """Step until nothing is left; the outputs of every step, in order."""
    steps = []
    while sched.has_unfinished():
        if len(steps) >= max_steps:
            raise RuntimeError(f"the scheduler did not finish within {max_steps} steps")
        out = sched.schedule()
        advance(sched, out)
        steps.append(out)
    return steps
