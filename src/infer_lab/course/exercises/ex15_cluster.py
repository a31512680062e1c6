"""Chapter 15's exercises: a cluster's rough capacity, and the step-cost line the simulator is checked on."""

from __future__ import annotations

import random

from ...cluster.costs import RooflineStepCost, StepBatch, fit_linear_step_cost
from ...cluster.scenarios import capacity_rps, kv_capacity_tokens
from ...cluster.workloads import get_workload
from . import Exercise

NUMBER = "15"
SLUG = "cluster"
TITLE = "15 · The cluster"

CAPACITY_CASES = (("llama-3-8b", "H100-SXM", 4, "chat"), ("llama-3-8b", "H100-SXM", 4, "summarize"),
                  ("llama-3-8b", "H200", 8, "story"), ("mistral-7b", "A100-80GB", 2, "chat"))
DECODE_BATCH = 64  # the simulator's default decode batch for the rough capacity


def check_capacity(fns, r) -> None:
    for model, gpu, n_gpus, workload in CAPACITY_CASES:
        shape = get_workload(workload)
        prompt, output = shape.prompt_tokens, shape.output_tokens
        cost = RooflineStepCost(model, gpu)
        batch = max(1, min(DECODE_BATCH, kv_capacity_tokens(model, gpu) // (prompt + output)))
        prefill_s = cost(StepBatch.prefill(prompt))
        step_s = cost(StepBatch.decode(batch, prompt + output // 2))
        case = (f"{model} on {n_gpus} x {gpu}, {workload} ({prompt} prompt / {output} output tokens): prefill "
                f"{prefill_s * 1e3:.3f} ms, a decode step of {batch} sequences {step_s * 1e3:.3f} ms")
        got = r.call(fns.colocated_capacity_rps, n_gpus, prefill_s, step_s, batch, output, case=case)
        expected = capacity_rps(model, gpu, n_gpus, prompt, output, decode_batch=DECODE_BATCH)
        r.close(case, got, expected, rel_tol=1e-6, unit="requests/s",
                wrong={"a whole decode step per token: the step serves the whole batch, so a request pays "
                       "1/batch of it": n_gpus / (prefill_s + output * step_s),
                       "one GPU: every GPU serves its own requests": expected / n_gpus,
                       "decode only: every request also pays its prefill": n_gpus * batch / (output * step_s)})


def _steps(a: float, b: float, tokens: list[int], noise: float, seed: int) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(t, (a + b * t) * (1 + rng.uniform(-noise, noise))) for t in tokens]


FIT_CASES = (("an exact line: 4 ms + 0.05 ms per token", 4e-3, 5e-5, [1, 3, 3, 40, 3, 2, 1], 0.0),
             ("a noisy CPU run (±10 % per step)", 30e-3, 0.4e-3, [37, 3, 3, 3, 18, 2, 2, 2, 1, 1], 0.10),
             ("a GPU's decode steps: a large fixed cost", 8e-3, 2e-6, [64, 64, 128, 512, 64, 96, 4096], 0.02))


def check_fit(fns, r) -> None:
    for name, a, b, tokens, noise, in FIT_CASES:
        steps = _steps(a, b, tokens, noise, seed=len(tokens))
        ref = fit_linear_step_cost([{"tokens": t, "seconds": s} for t, s in steps])
        ts, ss = [t for t, _ in steps], [s for _, s in steps]
        case = f"{name}: {len(steps)} steps"
        got = r.call(fns.step_cost_fit, ts, ss, case=case)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            r.record(case, False, f"return (a_s, b_s_per_token), got {got!r:.60}")
            continue
        through_origin = sum(t * s for t, s in steps) / sum(t * t for t in ts)
        r.close(case + ": a (the fixed cost of a step)", got[0], ref.a_s, rel_tol=1e-6, unit="s",
                wrong={"no intercept: a step with few tokens still reads every weight": 0.0})
        r.close(case + ": b (each computed token)", got[1], ref.b_s_per_token, rel_tol=1e-6, unit="s",
                wrong={"a line through the origin: fit the intercept too": through_origin,
                       "seconds per token averaged over steps: the fixed cost is spread into b":
                           sum(s / t for t, s in steps) / len(steps)})


EXERCISES = [
    Exercise("colocated_capacity_rps", "A cluster's rough capacity", "predict",
             "Predict the requests/s a colocated cluster sustains from a prefill's time and a decode step's; "
             "checked against cluster.scenarios.capacity_rps, which sets the simulated traces' rates.", check_capacity),
    Exercise("step_cost_fit", "The step-cost line", "implement",
             "Fit step time = a + b x tokens to an engine's steps by least squares, as the simulator's check does; "
             "checked against cluster.costs.fit_linear_step_cost.", check_fit),
]
