"""Chapter 11's exercises: the chunks of a long prompt under a token budget, the worst step, and (build)
the split of the step's token budget among the running requests inside the engine."""

from __future__ import annotations

from . import Exercise
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
