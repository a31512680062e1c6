"""The simulator held against a real engine: one run of our engine, replayed by the simulator.

1. Our engine (:mod:`infer_lab.engine`, continuous batching, ``max_num_seqs`` slots) serves a
   batch of prompts: request 0 arrives first, the rest one step later, so slots free up and
   waiting requests join mid-run.
2. Its step log gives every step's tokens and duration; :func:`~.costs.fit_linear_step_cost`
   fits ``a + b x tokens`` to them (the log has no cached-token count, so no ``c`` term: at
   these short contexts attention is a small part of a step).
3. The simulator runs the same requests (the prompt lengths and the output lengths the engine
   actually produced) on one colocated instance with the engine's slots and a KV capacity
   large enough that, like the engine here, it never preempts.

The engine without chunked prefill admits whole prompts into a step *next to* the running
decodes; the simulator's matching scheduler is its chunked mode with a token budget no prompt
reaches (its plain colocated mode pauses decodes for a prefill step instead, like engines that
do not mix phases). :class:`SimVsEngine` says whether both ran the same steps with the same
tokens, and how far apart the totals are.

**Why the totals should agree closely.** A least-squares fit with an intercept has residuals
that sum to zero, so when both schedules are the same step for step the simulated busy time
equals the measured sum of step durations, whatever the noise on each step. What remains is
what the simulator does not model: the engine's bookkeeping between steps (scheduling,
Python), which the comparison with the engine's wall clock exposes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from .costs import LinearStepCost, StepBatch, fit_linear_step_cost
from .sim import InstanceSpec, simulate
from .workloads import TraceRequest

# Relative tolerances of simulated vs measured (see SimVsEngine.within for why these).
TOLERANCES = {"makespan": 0.10, "mean_itl": 0.15, "mean_first_token": 0.25}


class RecordingCost:
    """A step cost model that remembers every step it was asked about."""

    def __init__(self, inner):
        self.inner = inner
        self.batches: list[StepBatch] = []

    def __call__(self, batch: StepBatch) -> float:
        self.batches.append(batch)
        return self.inner(batch)


@dataclass(frozen=True)
class SimVsEngine:
    """One engine run and its simulation. Seconds; ``*_ratio`` is simulated / measured."""

    requests: int
    max_num_seqs: int
    fit: LinearStepCost
    engine_step_tokens: tuple[int, ...]
    sim_step_tokens: tuple[int, ...]
    engine_busy_s: float  # sum of the step log's durations
    engine_wall_s: float  # from the first step to the last token
    sim_makespan_s: float
    engine_mean_first_token_s: float  # since the start of the run
    sim_mean_first_token_s: float
    engine_mean_itl_s: float  # every gap between two tokens, pooled
    sim_mean_itl_s: float
    threads: int

    @property
    def same_schedule(self) -> bool:
        return self.engine_step_tokens == self.sim_step_tokens

    @property
    def busy_ratio(self) -> float:
        return self.sim_makespan_s / self.engine_busy_s

    @property
    def makespan_ratio(self) -> float:
        return self.sim_makespan_s / self.engine_wall_s

    @property
    def first_token_ratio(self) -> float:
        return self.sim_mean_first_token_s / self.engine_mean_first_token_s

    @property
    def itl_ratio(self) -> float:
        return self.sim_mean_itl_s / self.engine_mean_itl_s

    def ratios(self) -> dict[str, float]:
        return {"makespan": self.makespan_ratio, "mean_itl": self.itl_ratio,
                "mean_first_token": self.first_token_ratio}

    def within(self, tolerances: dict[str, float] | None = None) -> bool:
        """Same schedule step for step, and each ratio within its tolerance (:data:`TOLERANCES`).

        - makespan, 10 %: the simulated busy time equals the measured sum of step durations by
          construction, so only the engine's between-step bookkeeping separates it from the
          wall clock (well under 1 % of a step when measured here); 10 % leaves room for a
          loaded machine without hiding a wrong schedule, which would miss by whole steps.
        - mean ITL, 15 %: every decode gap is one step, and the fit's residuals cancel over the
          decode steps, except that the few mixed (prefill + decode) steps carry more weight.
        - mean first-token time, 25 %: it rests on two or three prefill steps, whose own
          residuals do not cancel; one noisy prefill step on a shared CPU moves it by 10-20 %.
        """
        limits = {**TOLERANCES, **(tolerances or {})}
        return self.same_schedule and all(abs(r - 1) <= limits[k] for k, r in self.ratios().items())


def compare_with_engine(lm: Any, prompts: list[list[int]], max_new_tokens: int = 8,
                        max_num_seqs: int = 4) -> SimVsEngine:
    """Serve ``prompts`` on our engine, fit its step costs, simulate the same requests, compare."""
    import torch  # defers torch

    from ..engine import Engine, EngineConfig, SamplingParams  # defers torch

    if len(prompts) <= max_num_seqs:
        raise ValueError(f"give more prompts than slots ({max_num_seqs}) so requests wait and join mid-run")
    engine = Engine.from_loaded(lm, EngineConfig(max_num_seqs=max_num_seqs, max_model_len=1024))
    params = SamplingParams(max_tokens=max_new_tokens)
    engine.generate([prompts[0]], params)  # warm-up, not measured
    engine.step_log.clear()
    first: dict[str, float] = {}
    last: list[float] = []

    def on_token(event):
        if event.token_id is not None:
            first.setdefault(event.request_id, event.time_s)
            last.append(event.time_s)

    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, arrival_steps=[0] + [1] * (len(prompts) - 1), on_token=on_token)
    wall = max(last) - t0
    steps = list(engine.step_log)
    fit = fit_linear_step_cost(steps, source=f"{lm.name}: {len(steps)} engine steps")
    recorder = RecordingCost(fit)
    trace = [TraceRequest(i, 0.0 if i == 0 else 1e-9, len(p), len(o.token_ids))
             for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    instance = InstanceSpec("colocated", recorder, n_gpus=1, kv_capacity_tokens=10**9, gpu="CPU",
                            max_num_seqs=max_num_seqs, max_num_batched_tokens=10**9, chunked_prefill=True)
    res = simulate([instance], trace)
    return SimVsEngine(
        requests=len(prompts),
        max_num_seqs=max_num_seqs,
        fit=fit,
        engine_step_tokens=tuple(s.num_tokens for s in steps),
        sim_step_tokens=tuple(b.tokens for b in recorder.batches),
        engine_busy_s=sum(s.duration_s for s in steps),
        engine_wall_s=wall,
        sim_makespan_s=res.makespan_s,
        engine_mean_first_token_s=statistics.mean(first[o.request_id] - t0 for o in outs),
        sim_mean_first_token_s=statistics.mean(r.first_token_s for r in res.requests),
        engine_mean_itl_s=statistics.mean(g for o in outs for g in o.itl_s),
        sim_mean_itl_s=statistics.mean(g for r in res.requests for g in r.itl_s),
        threads=torch.get_num_threads(),
    )
