"""Metrics of a simulated run: TTFT and ITL percentiles, throughput and goodput per GPU.

Definitions (the ones vLLM's benchmarks and the DistServe paper use):

- TTFT: first token time minus arrival.
- ITL: every gap between two consecutive tokens of a request, pooled over all requests; its
  p99 is the tail that prefill interference inflates.
- TPOT: a request's mean time per output token after the first, (finish - first) / (n - 1).
- Goodput: requests per second that meet BOTH SLOs (TTFT <= ``ttft_ms`` and TPOT <=
  ``tpot_ms``), over the makespan; per GPU it divides by the cluster's GPUs.
- Throughput: output tokens per second over the makespan (first arrival to last token).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..timing import Stats
from ..timing import summarize as summarize_samples
from .sim import SimResult


@dataclass(frozen=True)
class SLO:
    """Latency objectives in milliseconds; ``None`` means no limit."""

    ttft_ms: float | None = 2000.0
    tpot_ms: float | None = 50.0

    def met(self, ttft_s: float, tpot_s: float | None) -> bool:
        if self.ttft_ms is not None and ttft_s * 1e3 > self.ttft_ms:
            return False
        if self.tpot_ms is not None and tpot_s is not None and tpot_s * 1e3 > self.tpot_ms:
            return False
        return True


def stats(values: list[float]) -> Stats | None:
    """Count, mean, spread and p50/p90/p99 of ``values`` (``timing.summarize``); None for no values."""
    return summarize_samples(values) if values else None


LATENCIES = ("ttft_ms", "itl_ms", "tpot_ms", "kv_transfer_ms")  # the report's timing.Stats fields, in ms


@dataclass(frozen=True)
class ClusterReport:
    """The summary of one run. Latencies are ``timing.Stats`` in ms (``None`` when no request had
    one: no transfers in a colocated run), rates per second."""

    mode: str
    layout: str
    n_gpus: int
    requests: int
    completed: int
    makespan_s: float
    ttft_ms: Stats | None
    itl_ms: Stats | None  # every gap between two tokens of a request, pooled over requests
    tpot_ms: Stats | None
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    goodput_rps: float
    goodput_rps_per_gpu: float
    slo_attainment: float
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    kv_bytes_transferred: int
    kv_transfer_ms: Stats | None
    utilization: dict[str, float]
    usd_per_hour: float
    goodput_per_usd_hour: float | None

    def as_dict(self) -> dict[str, Any]:
        """Flat, as the load generator writes its rows: ``ttft_ms_p50``, ``itl_ms_max``, ... (``None`` where a
        latency had no samples, e.g. ``kv_transfer_ms_*`` of a colocated run)."""
        flat = asdict(self)
        for name in LATENCIES:
            flat.pop(name)
            stats = getattr(self, name)
            flat.update(stats.as_dict(prefix=f"{name}_") if stats is not None
                        else {f"{name}_{k}": None for k in Stats.__dataclass_fields__})
        return flat


def summarize(result: SimResult, slo: SLO | None = None) -> ClusterReport:
    """TTFT/ITL/TPOT percentiles, throughput and goodput of a run against ``slo``."""
    slo = slo or SLO()
    reqs = result.requests
    ttft = [r.ttft_s * 1e3 for r in reqs]
    itl = [g * 1e3 for r in reqs for g in r.itl_s]
    tpot = [r.tpot_s * 1e3 for r in reqs if r.tpot_s is not None]
    good = sum(slo.met(r.ttft_s, r.tpot_s) for r in reqs)
    span = result.makespan_s if result.makespan_s > 0 else float("nan")
    tokens = sum(r.output_tokens for r in reqs)
    busy: dict[str, list[float]] = {}
    for i in result.instances:
        busy.setdefault(i.role, []).append(i.busy_s / span if span == span else 0.0)
    usd = sum(i.usd_per_hour for i in result.instances)
    goodput = good / span
    transfers = [r.kv_transfer_s * 1e3 for r in reqs if r.kv_bytes_transferred]
    return ClusterReport(
        mode=result.mode,
        layout=result.layout,
        n_gpus=result.n_gpus,
        requests=result.n_arrived,
        completed=len(reqs),
        makespan_s=result.makespan_s,
        ttft_ms=stats(ttft),
        itl_ms=stats(itl),
        tpot_ms=stats(tpot),
        output_tokens_per_s=tokens / span,
        output_tokens_per_s_per_gpu=tokens / span / result.n_gpus,
        goodput_rps=goodput,
        goodput_rps_per_gpu=goodput / result.n_gpus,
        slo_attainment=good / len(reqs) if reqs else 0.0,
        slo_ttft_ms=slo.ttft_ms,
        slo_tpot_ms=slo.tpot_ms,
        kv_bytes_transferred=result.kv_bytes_transferred,
        kv_transfer_ms=stats(transfers),
        utilization={role: sum(v) / len(v) for role, v in busy.items()},
        usd_per_hour=usd,
        goodput_per_usd_hour=goodput * 3600 / usd if usd else None,
    )


def table(reports: list[ClusterReport]) -> str:
    """A plain-text comparison table of runs (one line each)."""
    head = (
        f"{'layout':>34s} {'GPUs':>4s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'ITL p50':>8s} "
        f"{'ITL p99':>8s} {'TPOT p50':>9s} {'tok/s/GPU':>10s} {'good/s/GPU':>11s} {'SLO met':>8s}"
    )
    lines = [head]
    for r in reports:
        lines.append(
            f"{r.layout:>34s} {r.n_gpus:4d} {_ms(r.ttft_ms, 'p50'):>9s} {_ms(r.ttft_ms, 'p99'):>9s} "
            f"{_ms(r.itl_ms, 'p50'):>8s} {_ms(r.itl_ms, 'p99'):>8s} {_ms(r.tpot_ms, 'p50'):>9s} "
            f"{r.output_tokens_per_s_per_gpu:10,.0f} {r.goodput_rps_per_gpu:11.3f} {r.slo_attainment:8.0%}"
        )
    return "\n".join(lines)


def _ms(value: Stats | None, which: str) -> str:
    return "-" if value is None else f"{getattr(value, which):,.1f}"
