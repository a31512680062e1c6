"""Chapter 11's exercises: the chunks of a long prompt under a token budget, the worst step, and (build)
the split of the step's token budget among the running requests inside the engine."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from . import Exercise, build
from .checking import plain, short_repr
from .engine_sim import advance, paged_cache, scheduler, sequence

NUMBER = "11"
SLUG = "chunked_prefill"
TITLE = "11 · Chunked prefill"


def long_prompt_steps(prompt_len: int, num_decoding: int, budget: int | None) -> list[tuple[int, int]]:
    """(tokens of the long prompt, tokens of the whole step) for each step from its arrival to its first token.

    ``num_decoding`` short requests are decoding when the prompt arrives; ``budget`` None means
    no chunking. The engine's scheduler decides every step.
    """
    kv = paged_cache((prompt_len + 64 * (num_decoding + 1)) // 16 + 8, 16)
    sched = scheduler(kv, "continuous", num_decoding + 1, budget)
    for i in range(num_decoding):
        sched.add(sequence(f"decoder{i}", 2, max_tokens=100_000))
    advance(sched, sched.schedule())  # their prefill: from now on they decode
    long = sequence("long", prompt_len, max_tokens=1)
    sched.add(long)
    steps = []
    while not long.output_ids:
        out = sched.schedule()
        steps.append((sum(i.num_new_tokens for i in out.scheduled if i.seq is long), out.num_tokens))
        advance(sched, out)
        if len(steps) > prompt_len:
            raise RuntimeError("the long prompt never finished its prefill")
    return steps


CHUNK_CASES = ((1000, 4, 256), (300, 0, 128), (100, 8, 512), (2048, 16, 512), (255, 1, 128))


def check_chunks(fns, r) -> None:
    for prompt, decoding, budget in CHUNK_CASES:
        case = f"a {prompt}-token prompt arrives while {decoding} requests decode, budget {budget} tokens/step"
        got = r.call(fns.chunk_sizes, prompt, budget, decoding, case=case)
        expected = [n for n, _ in long_prompt_steps(prompt, decoding, budget)]
        got = list(got) if isinstance(got, (list, tuple)) else got
        r.equal(case, got, expected, hint="each step the decoding requests take one token each of the budget "
                                         "first; the prompt gets what is left, its last chunk the remainder")


WORST_CASES = ((1000, 4, 256), (3000, 12, 512), (100, 8, 512), (50, 2, 64))


def check_worst_step(fns, r) -> None:
    for prompt, decoding, budget in WORST_CASES:
        for chunked in (False, True):
            how = f"chunked, budget {budget}" if chunked else "no chunking"
            case = f"{how}: a {prompt}-token prompt among {decoding} decoding requests"
            got = r.call(fns.worst_step_tokens, prompt, decoding, budget, chunked, case=case)
            expected = max(total for _, total in long_prompt_steps(prompt, decoding, budget if chunked else None))
            r.close(case, got, expected, unit="tokens",
                    wrong={"the prompt alone: the decoding requests run in the same step": prompt}
                    if not chunked else {"the budget: a prompt shorter than the budget needs no chunks": budget})


EXERCISES = [
    Exercise("chunk_sizes", "The chunks of a long prompt", "predict",
             "Predict the chunk sizes a long prompt is cut into while other requests decode; checked against "
             "the engine's scheduler with chunked prefill.", check_chunks),
    Exercise("worst_step_tokens", "The worst step, with and without chunks", "predict",
             "Predict the most tokens any one step computes while a long prompt is prefilled, with and "
             "without chunking (what the decoders' ITL spike scales with); checked against the scheduler.",
             check_worst_step),
]


# ---------------------------------------------------------------------------------------------
# Build it: your split of the step's token budget among the running requests, inside the engine

SPLIT_BUDGET = 16  # tokens per step: the long prompt's chunks are what the decodes leave of it
SHORT_PROMPTS = (3, 4, 5)  # tokens: three requests that decode while the long prompt is prefilled
SPLIT_NEW_TOKENS = 5  # per request: the short ones decode through all of the long prompt's chunks


def _split_config():
    return build.engine_config(chunked_prefill=True, max_num_batched_tokens=SPLIT_BUDGET, max_num_seqs=4)


@lru_cache(maxsize=1)
def _split_prompts() -> tuple[tuple[int, ...], ...]:
    """Three short prompts, then a 52-token one: it is admitted last, so it is cut into chunks
    while the three others decode."""
    lm = build.loaded()
    shorts = tuple(tuple(lm.random_ids(1, n, seed=100 + n)[0].tolist()) for n in SHORT_PROMPTS)
    return shorts + (build.repetitive_prompt(),)


def split_mistake(tokens: list[int], budget: int | None, got: Any) -> tuple[str, bool] | None:
    """What is wrong with one split of the budget (None: nothing), and whether it is over the budget.

    The message names the running requests, the budget and the answer, and a hint that matches
    the mistake; a split that leaves part of the budget unused is not a mistake.
    """
    where = f"running requests with {tokens} tokens to compute (oldest first), budget {budget}"
    if not isinstance(got, list) or len(got) != len(tokens) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in got):
        return (f"{where}: return one whole number of tokens per running request (a list of {len(tokens)}), "
                f"got {short_repr(got, 60)}", False)
    you = f"{where}: you gave {got}"
    below = [i for i, n in enumerate(got) if n < 0]
    if below:
        return (f"{you}; request {below[0]} gets {got[below[0]]} tokens, below zero: a count is 0 or more "
                "(is the budget spent before the request is cut to it?)", False)
    more = [i for i, (n, t) in enumerate(zip(got, tokens, strict=True)) if n > t]
    if more:
        return f"{you}; request {more[0]} has only {tokens[more[0]]} tokens to compute", False
    if budget is None:
        if got != list(tokens):
            return (f"{you}: with no budget (None: chunked prefill is off) every running request computes "
                    "all it has, however long", False)
        return None
    if sum(got) <= budget:
        return None
    i = next(k for k in range(len(got)) if sum(got[:k + 1]) > budget)  # the first request past the budget
    n, left = got[i], budget - sum(got[:i])
    if n == left + 1:
        hint = f"request {i} got {n} tokens with {left} left of the budget: one too many"
    elif n == tokens[i] and n > 1:
        hint = (f"request {i}, a prompt being prefilled, got its whole remainder of {n} tokens with only {left} "
                "left of the budget: cut it to a chunk of what is left, the rest follows in later steps")
    elif n == min(tokens[i], budget):
        hint = (f"request {i} was cut to the whole budget of {budget}, not to the {left} tokens the requests "
                "before it left: take each request's tokens off the budget as you go")
    else:
        hint = f"request {i} got {n} tokens with {left} left of the budget"
    return f"{you}, {sum(got)} tokens, over the budget of {budget}: {hint}", True


def check_split_engine(fns, r) -> None:
    r.call(fns.split_budget, [1], SPLIT_BUDGET, case="setup")
    prompts = _split_prompts()
    long_prompt = list(prompts[-1])
    # per step: (is it the long prompt, is it still prefilling) for each running request, their tokens, your split
    calls: list[tuple[list[tuple[bool, bool]], list[int], Any]] = []
    broken: list[str] = []
    over: list[str] = []

    def plug(engine):
        sched = engine.scheduler

        def split(tokens, budget):
            tokens = list(tokens)
            running = [(list(s.prompt_ids) == long_prompt, s.num_computed < len(s.prompt_ids))
                       for s in sched.running]
            try:
                got = plain(fns.split_budget(list(tokens), budget))
            except Exception as exc:
                broken.append(f"running requests with {tokens} tokens to compute, budget {budget}: your "
                              f"split_budget() raised {type(exc).__name__}: {exc}")
                raise
            calls.append((running, tokens, got))
            wrong = split_mistake(tokens, budget, got)
            if wrong is not None:
                (over if wrong[1] else broken).append(f"step {len(calls) - 1}, {wrong[0]}")
            return got

        sched.split_rule = split

    case = (f"chunked prefill with your split_budget(): a {len(long_prompt)}-token prompt behind "
            f"{len(prompts) - 1} short requests that decode, {SPLIT_NEW_TOKENS} greedy tokens each, a budget of "
            f"{SPLIT_BUDGET} tokens per step")
    run = build.run_engine(_split_config(), prompts, plug, new_tokens=SPLIT_NEW_TOKENS)
    stalled = [k for k, (_, t, g) in enumerate(calls) if isinstance(g, list) and sum(t) > 0 and not any(
        isinstance(n, int) and n > 0 for n in g)]
    if broken or over:
        hint = (broken or over)[0]
    elif stalled and not run.finished:
        k = stalled[0]
        hint = (f"from step {k} on your split gave every running request 0 tokens (they had {calls[k][1]} to "
                f"compute, budget {SPLIT_BUDGET}): nobody computes, so nothing moves")
    else:
        hint = ""
    build.compare(r, case, run, build.reference(prompts, SPLIT_NEW_TOKENS), hint=hint)
    r.record("invariant: one count per running request, none below zero or over what the request has",
             not broken, broken[0] if broken else f"held in all {len(calls)} steps")
    if not run.finished:
        return
    too_many = [(k, n) for k, n in enumerate(run.step_tokens) if n > SPLIT_BUDGET]
    if too_many:
        k, n = too_many[0]
        detail = f"step {k} computed {n} tokens, over the budget of {SPLIT_BUDGET}" + (f"; {over[0]}" if over else "")
    else:
        detail = over[0] if over else f"the largest step had {max(run.step_tokens)} tokens"
    r.record(f"invariant: no step over the budget of {SPLIT_BUDGET} tokens", not too_many and not over, detail)
    calls = [c for c in calls if isinstance(c[2], list) and len(c[2]) == len(c[1])]
    chunks = [g[i] for running, _, g in calls for i, (long, prefilling) in enumerate(running)
              if long and prefilling and g[i] > 0]
    first = len(long_prompt) - sum(chunks)
    r.record("the long prompt was cut into chunks", first > 0 and len(chunks) >= 2,
             f"a first chunk of {first} tokens at admission, then {chunks} from your split")
    starved = []
    for k, (running, tokens, got) in enumerate(calls):
        for i, ((_, prefilling), n) in enumerate(zip(running, got, strict=True)):
            waited = [j for j in range(i) if not running[j][1] and tokens[j] > 0 and got[j] < 1]
            if prefilling and n > 0 and waited:
                starved.append(f"step {k}: request {i} got a chunk of {n} tokens of its prompt while "
                               f"{len(waited)} older request(s) that decode got nothing: a decode waits behind "
                               "a prompt, the stall chunked prefill is there to end; serve the running requests "
                               "oldest first")
                break
    r.record("no decode starves: an older request that decodes gets its token whenever a prompt gets a chunk",
             not starved, starved[0] if starved else "held in every step")
    build.pool_back(r, "invariant: the pool is full again after the run", run)
    for tokens in ([1, 1, 40], [52], [1, 9, 1]):
        case = f"chunking off (budget None): running requests with {tokens} tokens to compute"
        try:
            got = plain(fns.split_budget(list(tokens), None))
        except Exception as exc:
            r.record(case, False, f"split_budget() raised {type(exc).__name__}: {exc}. Hint: None means chunked "
                                  "prefill is off, there is no budget: every running request computes all it has")
            continue
        wrong = split_mistake(tokens, None, got)
        r.record(case, wrong is None, wrong[0] if wrong else f"{got}: all of it")


def install_split(engine: Any, fns: Any) -> None:
    """The capstone: your split_budget() as a serving engine's split of the step's token budget."""
    engine.scheduler.split_rule = lambda tokens, budget: plain(fns.split_budget(list(tokens), budget))


EXERCISES.append(
    Exercise("split_engine", "The chunked-prefill split inside the engine's scheduler", "build",
             "Your split_budget() decides, every step, how many tokens each running request computes under "
             "the step's token budget, so a long prompt is cut into chunks beside the decodes; checked by "
             "serving a long prompt among decoding requests with the engine on the embedded model, token for "
             "token against transformers, with the budget, the chunks, the decodes and the pool checked.",
             check_split_engine, functions=("split_budget",),
             symbol="src/infer_lab/engine/scheduler.py::Scheduler.split_rule",
             timeout_s=build.BUILD_TIMEOUT_S, install=install_split))
