"""Chapter 09's exercises: the continuous-batching admit rule, and static vs continuous step counts."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ...engine.sequence import SequenceStatus
from . import Exercise, build
from .checking import plain, short_repr
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


# ---------------------------------------------------------------------------------------------
# Build it: your admission rule inside the engine's continuous-batching scheduler

BUDGET = 24  # tokens per step (chunked prefill)
SCHED_BLOCKS = 20  # blocks of 4 (80 tokens): too few for 4 running requests, so the scheduler preempts


def _sched_config():
    return build.engine_config(chunked_prefill=True, max_num_batched_tokens=BUDGET, num_blocks=SCHED_BLOCKS,
                               max_num_seqs=4, max_model_len=64)


@lru_cache(maxsize=1)
def _mixed_prompts() -> tuple[tuple[int, ...], ...]:
    """The 4 chat prompts and 2 random-id prompts (9 and 50 tokens): 6 requests of mixed lengths."""
    lm = build.loaded()
    extra = tuple(tuple(lm.random_ids(1, n, seed=n)[0].tolist()) for n in (9, 50))
    return build.chat_prompts() + extra


@lru_cache(maxsize=1)
def _reference_steps() -> int:
    """Engine steps the engine's own admission rule takes on the same workload."""
    return build.run_engine(_sched_config(), _mixed_prompts()).steps


def check_scheduler_engine(fns, r) -> None:
    r.call(fns.admit_tokens, 5, None, lambda n: True, case="setup")
    broken: list[str] = []

    def admit(tokens, budget, fits):
        asked: list[int] = []

        def fits_logged(n):
            asked.append(n)
            return fits(n)

        got = plain(fns.admit_tokens(tokens, budget, fits_logged))
        if broken:
            return got
        where = f"head of the queue with {tokens} tokens to compute, {budget} tokens left of the step's budget"
        chunk = tokens if budget is None else min(tokens, budget)
        if not isinstance(got, int) or got < 0:
            broken.append(f"{where}: return a number of tokens (0 to wait), got {short_repr(got, 40)}")
        elif got > tokens:
            broken.append(f"{where}: you scheduled {got} tokens, more than the request has")
        elif budget is not None and got > budget:
            broken.append(f"{where}: you scheduled {got} tokens, over the budget: cut the chunk to what is left "
                          "of the budget")
        elif got and not fits(got):
            broken.append(f"{where}: you admitted {got} tokens whose KV does not fit in the free blocks "
                          f"(fits({got}) is False): return 0 so the request waits")
        elif got == 0 and chunk > 0 and fits(chunk):
            why = (f" (you asked fits({asked[0]}), but the chunk to schedule is {chunk} tokens)"
                   if asked and chunk not in asked else "")
            broken.append(f"{where}: the request waited although a chunk of {chunk} tokens fits{why}")
        elif 0 < got < chunk:
            broken.append(f"{where}: you scheduled {got} tokens although {chunk} fit the budget and the blocks: "
                          "a chunk takes all the budget leaves")
        return got

    def plug(engine):
        engine.scheduler.admit_rule = admit

    prompts = _mixed_prompts()
    case = (f"continuous batching with your admit_tokens(): {len(prompts)} requests of {min(map(len, prompts))} to "
            f"{max(map(len, prompts))} tokens, {build.NEW_TOKENS} greedy tokens each, a budget of {BUDGET} "
            f"tokens per step, {SCHED_BLOCKS} blocks of 4, 4 slots")
    run = build.run_engine(_sched_config(), prompts, plug)
    build.compare(r, case, run, hint=broken[0] if broken else "")
    r.record("invariant: every admission is a chunk within the budget whose blocks are free, and nobody who "
             "fits is left waiting", not broken, broken[0] if broken else "held at every admission")
    if not run.finished:
        return
    over = [(i, n) for i, n in enumerate(run.step_tokens) if n > BUDGET]
    r.record(f"invariant: no step over the budget of {BUDGET} tokens", not over,
             f"the largest step had {max(run.step_tokens)} tokens" if not over else
             f"step {over[0][0]} scheduled {over[0][1]} tokens")
    ref = _reference_steps()
    r.record("steps no more than the engine's own scheduler", run.steps <= ref,
             f"{run.steps} steps (the engine's own rule: {ref}; {run.preemptions} preemption(s) on the way)"
             + ("" if run.steps <= ref else ": your rule leaves requests waiting that could run"))
    build.pool_back(r, "invariant: the pool is full again after the run", run)


def install_admission(engine: Any, fns: Any) -> None:
    """The capstone: your admit_tokens() as a serving engine's admission rule."""
    engine.scheduler.admit_rule = lambda tokens, budget, fits: plain(fns.admit_tokens(tokens, budget, fits))


EXERCISES.append(
    Exercise("scheduler_engine", "Admission inside the engine's scheduler", "build",
             "Your admit_tokens() decides, every step, how much of the request at the head of the queue joins the "
             "batch under a token budget and the free KV blocks; checked by serving mixed requests with the "
             "engine on the embedded model (preemptions included), token for token against transformers, with "
             "the budget, the step count and the pool checked.", check_scheduler_engine,
             functions=("admit_tokens",), symbol="src/infer_lab/engine/scheduler.py::Scheduler.admit_rule",
             timeout_s=build.BUILD_TIMEOUT_S, install=install_admission))
