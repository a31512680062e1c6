"""Arrival traces for the cluster simulator: who arrives when, with how many tokens in and out.

The load generator's workloads (:mod:`infer_lab.loadgen.workloads`) are text built from words,
because they go to real servers over HTTP; the simulator needs token counts and arrival times,
so its traces are defined here in tokens. Lengths are uniform within ``mean x (1 +- spread)``
(the same rule as the load generator's ``random`` workload) and arrivals are Poisson, or
gamma-distributed gaps for bursty traffic. Everything is seeded: the same arguments give the
same trace.

Three shapes, after the talk:

- ``summarize``: long documents in, a short summary out (prefill-heavy);
- ``story``: a short prompt in, a long story out (decode-heavy);
- ``chat``: in between, a ShareGPT-like mix.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from ..units import require_positive


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrives (s) and its token counts."""

    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class WorkloadShape:
    """Mean prompt and output tokens, their relative spread, and what the shape stands for."""

    name: str
    prompt_tokens: int
    output_tokens: int
    spread: float
    description: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


WORKLOADS: dict[str, WorkloadShape] = {
    w.name: w
    for w in (
        WorkloadShape(
            "summarize", 6000, 200, 0.5, "long document in, short summary out: prefill-heavy"
        ),
        WorkloadShape("story", 200, 1200, 0.5, "short prompt in, long story out: decode-heavy"),
        WorkloadShape("chat", 1200, 300, 0.8, "chat turns: medium prompt, medium answer"),
    )
}


def get_workload(name: str) -> WorkloadShape:
    """A workload shape by name; the error lists the known ones."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; use one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def _around(rng: random.Random, mean: int, spread: float) -> int:
    low, high = max(1, int(mean * (1 - spread))), max(1, int(mean * (1 + spread)))
    return rng.randint(low, high)


def make_trace(
    workload: str | WorkloadShape,
    n_requests: int,
    rate_per_s: float,
    seed: int = 0,
    burstiness: float = 1.0,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
) -> list[TraceRequest]:
    """``n_requests`` requests of a workload shape arriving at ``rate_per_s`` on average.

    ``burstiness`` 1 is Poisson; larger values give gamma gaps with the same mean and a
    coefficient of variation sqrt(burstiness) (bursts and lulls). ``prompt_tokens`` and
    ``output_tokens`` override the shape's means.
    """
    require_positive("n_requests", n_requests)
    require_positive("rate_per_s", rate_per_s)
    require_positive("burstiness", burstiness)
    shape = get_workload(workload) if isinstance(workload, str) else workload
    p_mean = prompt_tokens or shape.prompt_tokens
    o_mean = output_tokens or shape.output_tokens
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n_requests):
        if burstiness == 1.0:
            gap = rng.expovariate(rate_per_s)
        else:
            k = 1.0 / burstiness
            gap = rng.gammavariate(k, 1.0 / (rate_per_s * k))
        t += gap
        out.append(
            TraceRequest(
                i, t, _around(rng, p_mean, shape.spread), _around(rng, o_mean, shape.spread)
            )
        )
    return out


def describe_trace(trace: list[TraceRequest]) -> dict[str, Any]:
    """Size of a trace for a report: requests, duration, mean rate and token means."""
    if not trace:
        return {"requests": 0}
    n = len(trace)
    span = trace[-1].arrival_s - trace[0].arrival_s
    return {
        "requests": n,
        "arrival_span_s": span,
        "mean_rate_per_s": (n - 1) / span if span > 0 else None,
        "mean_prompt_tokens": sum(r.prompt_tokens for r in trace) / n,
        "mean_output_tokens": sum(r.output_tokens for r in trace) / n,
    }
