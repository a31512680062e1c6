"""Serving metrics from request records: one definition, used by the CLI, the notebook and the tests.

- **TTFT**: send → first text chunk, per request. When the server reports its own clock
  (infer-lab's ``server_timing``), **server TTFT** (its engine's arrival → first token) and the
  **TTFT gap** (ours − the server's: network, parsing, tokenizing) are reported beside it.
- **ITL (token-weighted)**: every gap between consecutive text chunks of every request, pooled.
  A long answer contributes many samples, so ITL describes what a *token* experiences.
- **TPOT (request-weighted)**: per request ``(E2E − TTFT) / (output tokens − 1)``, one sample
  per request, so TPOT describes what a *user* experiences. Tools use these names
  inconsistently (guidellm's "ITL" is this TPOT); we report both, separately.
- **Tokens per chunk**: output tokens / text chunks. Under speculative decoding one chunk
  carries every token a verification pass accepted, so the chunk-gap ITL grows toward the
  engine's step time while TPOT falls: the two diverge, and tokens per chunk says by how much.
- **E2E**: send → last byte.
- **Request throughput**: completed requests / wall time of the run (first send → last finish).
- **Output-token throughput**: output tokens (from ``usage``) / the same wall time.
- **Goodput**: completed requests per second that met *every* SLO given (TTFT, TPOT, E2E in ms).

Every latency gets p50, p90 and p99 (``infer_lab.harness.summarize``). Times in the output are
milliseconds (keys end in ``_ms``) and rates are per second.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..harness import summarize
from .client import RequestRecord


@dataclass(frozen=True)
class SLO:
    """Latency objectives in milliseconds; None means "no objective on this metric"."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, rec: RequestRecord) -> bool:
        """True when a successful request meets every objective that is set."""
        if not rec.ok:
            return False
        if self.ttft_ms is not None and rec.ttft_s * 1e3 > self.ttft_ms:
            return False
        if self.tpot_ms is not None and rec.tpot_s is not None and rec.tpot_s * 1e3 > self.tpot_ms:
            return False
        return not (self.e2e_ms is not None and rec.e2e_s * 1e3 > self.e2e_ms)

    def is_set(self) -> bool:
        return any(v is not None for v in asdict(self).values())


def _percentiles(prefix: str, samples_s: list[float]) -> dict[str, float | None]:
    if not samples_s:
        return {f"{prefix}_ms_{k}": None for k in ("mean", "p50", "p90", "p99")}
    s = summarize(samples_s)
    return {
        f"{prefix}_ms_mean": s.mean * 1e3,
        f"{prefix}_ms_p50": s.p50 * 1e3,
        f"{prefix}_ms_p90": s.p90 * 1e3,
        f"{prefix}_ms_p99": s.p99 * 1e3,
    }


def summarize_records(
    records: list[RequestRecord], slo: SLO | None = None, duration_s: float | None = None
) -> dict[str, Any]:
    """Aggregate metrics of one measured run (see the module docstring for the definitions).

    ``duration_s`` defaults to first send → last finish over the records.
    """
    slo = slo or SLO()
    ok = [r for r in records if r.ok]
    if duration_s is None:
        ends = [r.end_s for r in ok]
        duration_s = (max(ends) - min(r.start_s for r in records)) if ends else 0.0
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    row: dict[str, Any] = {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration_s,
        "prompt_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput_per_s": len(ok) / duration_s if duration_s > 0 else None,
        "output_tokens_per_s": out_tokens / duration_s if duration_s > 0 else None,
        "usage_from_server": all(r.usage_source == "usage" for r in ok) if ok else None,
    }
    row.update(_percentiles("ttft", [r.ttft_s for r in ok]))
    row.update(
        _percentiles("server_ttft", [r.server_ttft_s for r in ok if r.server_ttft_s is not None])
    )
    row.update(_percentiles("ttft_gap", [r.ttft_gap_s for r in ok if r.ttft_gap_s is not None]))
    row.update(_percentiles("itl", [gap for r in ok for gap in r.itl_s]))
    row.update(_percentiles("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]))
    chunks = sum(len(r.chunk_times_s) for r in ok)
    row["tokens_per_chunk"] = out_tokens / chunks if chunks else None
    row.update(_percentiles("e2e", [r.e2e_s for r in ok]))
    tpot_p50 = row["tpot_ms_p50"]
    # What one user sees while streaming: tokens per second of their own answer.
    row["tokens_per_s_per_user"] = 1e3 / tpot_p50 if tpot_p50 else None
    if slo.is_set():
        good = sum(slo.met_by(r) for r in ok)
        row["slo_met"] = good
        row["goodput_per_s"] = good / duration_s if duration_s > 0 else None
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = (r.error or "unknown")[:80]
            errors[key] = errors.get(key, 0) + 1
    row["errors"] = errors
    return row
