"""Chapter 09's exercises: the continuous-batching admit rule, and static vs continuous step counts."""

from __future__ import annotations

from ...engine.sequence import SequenceStatus
from . import Exercise
from .engine_sim import paged_cache, run_to_completion, scheduler, sequence

NUMBER = "09"
SLUG = "batching"
TITLE = "09 · Batching"

ADMIT_CASES = (
    ([20, 20, 20], 0, 100, 16, 2, "continuous"),
    ([20, 20, 20], 3, 100, 16, 4, "continuous"),
    ([40, 8, 8], 1, 2, 16, 8, "continuous"),
    ([32, 33], 0, 4, 16, 8, "continuous"),
    ([5, 5, 5, 5], 0, 2, 16, 8, "continuous"),
    ([16, 16, 16], 2, 10, 16, 8, "static"),
    ([16, 16, 16], 0, 10, 16, 2, "static"),
)


def admitted_by_scheduler(waiting: list[int], running: int, free_blocks: int, block_size: int,
                          max_num_seqs: int, policy: str) -> int:
    """How many of ``waiting`` the engine's scheduler admits in its next step."""
    kv = paged_cache(free_blocks + running, block_size)
    sched = scheduler(kv, policy, max_num_seqs)
    for i in range(running):  # running requests whose next token already has room (they need no block)
        seq = sequence(f"running{i}", 1, max_tokens=1000)
        kv.allocate(seq, 1)
        seq.num_computed, seq.status = 1, SequenceStatus.RUNNING
        sched.running.append(seq)
    queue = [sequence(f"waiting{i}", n) for i, n in enumerate(waiting)]
    for seq in queue:
        sched.add(seq)
    out = sched.schedule()
    return sum(item.seq in queue for item in out.scheduled)


def check_admit(fns, r) -> None:
    for waiting, running, free, block_size, max_seqs, policy in ADMIT_CASES:
        case = (f"{policy}: waiting prompts {waiting}, {running} running, {free} free blocks of {block_size}, "
                f"max_num_seqs {max_seqs}")
        got = r.call(fns.admit_count, list(waiting), running, free, block_size, max_seqs, policy, case=case)
        expected = admitted_by_scheduler(waiting, running, free, block_size, max_seqs, policy)
        hints = {
            "continuous": "admit from the head of the queue while a batch slot is free and the head's prompt "
                          "fits in the free blocks (rounded up to whole blocks); stop at the first that does "
                          "not fit: the ones behind it wait (first come, first served)",
            "static": "a static batch admits nobody while any request of the current batch still runs",
        }
        r.close(case, got, expected, unit="admitted", hint=hints[policy])


STEP_CASES = (([2, 9, 3, 3, 8, 1, 4], 3), ([5, 5, 5, 5, 5, 5], 2), ([10, 1, 1, 1], 2), ([7], 4),
              ([1, 1, 1, 1, 1], 5), ([12, 2, 2, 2, 2, 2, 2], 2))


def steps_by_scheduler(output_lens: list[int], max_num_seqs: int, policy: str) -> int:
    kv = paged_cache(4 * len(output_lens) * (1 + max(output_lens) // 16 + 1), 16)
    sched = scheduler(kv, policy, max_num_seqs)
    for i, n in enumerate(output_lens):
        sched.add(sequence(f"r{i}", 4, max_tokens=n))
    return len(run_to_completion(sched))


def check_steps(fns, r) -> None:
    for outputs, max_seqs in STEP_CASES:
        for policy in ("static", "continuous"):
            case = f"{policy}: outputs of {outputs} tokens, {max_seqs} slots"
            got = r.call(fns.batching_steps, list(outputs), max_seqs, policy, case=case)
            r.close(case, got, steps_by_scheduler(outputs, max_seqs, policy), unit="steps",
                    wrong={"one step per token of the longest request: the slots are fewer than the requests":
                           max(outputs)} if len(outputs) > max_seqs else None)


EXERCISES = [
    Exercise("admit_count", "The continuous-batching admit rule", "implement",
             "Decide how many waiting requests join the next step, by batch slots and free KV blocks; "
             "checked against the engine's scheduler, static batching included.", check_admit),
    Exercise("batching_steps", "Static vs continuous, in steps", "predict",
             "Predict how many engine steps a set of requests takes under static and continuous batching; "
             "checked against the engine's scheduler run to completion.", check_steps),
]
