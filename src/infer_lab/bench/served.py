"""One engine configuration served over HTTP on this machine, measured by the load generator.

The measurement behind every engine comparison of chapter 13, as one function:
:func:`serve_and_load` builds the server (:func:`infer_lab.server.build_app`: our engine with the
given :class:`~infer_lab.engine.EngineConfig` switches, or the HF baseline), runs it in a thread on
127.0.0.1, drives it with :mod:`infer_lab.loadgen` at each concurrency (one warm-up request first,
the same seeded workload every time, so every configuration gets the same prompts), and stops it.

Fairness is the load generator's: the same workload, concurrency, warm-up and repeats for every
configuration; percentiles (ms), never a single request; token counts from the server's ``usage``.
:func:`server_counters` reads what the server itself counted (``/metrics``, scraped during the
run): the prefix cache's hit rate (a share of prompt tokens) and the peak KV blocks in use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..loadgen import SLO, ClientConfig, LoadPoint, RunConfig, run_benchmark_sync
from ..server import ServerThread, build_app


def serve_and_load(
    lm: Any,
    engine: str,
    options: dict[str, Any],
    workload: str,
    concurrencies: Sequence[int],
    *,
    requests: int,
    output_tokens: int,
    repeats: int = 1,
    max_model_len: int = 512,
    max_num_seqs: int = 16,
    timeout_s: float = 300.0,
    slo_ttft_ms: float | None = None,
    workload_options: dict[str, Any] | None = None,
    parts: Any = None,
    before_load: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Serve ``lm`` with ``engine`` (``"ours"`` or ``"hf"``) and ``options`` (EngineConfig switches)
    and run ``requests`` requests of ``output_tokens`` tokens (EOS ignored) at each concurrency.

    ``max_num_seqs`` (our engine's batch slots) is set unless ``options`` sets it; ``slo_ttft_ms``
    is the TTFT objective goodput counts against. ``parts`` replaces components of our engine
    (:func:`infer_lab.server.build_app`). ``before_load(url)`` runs once the server
    answers and before the load; what it returns is kept as ``results["before_load"]``. Returns
    loadgen's results dict: ``pooled`` (one row per concurrency, percentiles pooled over repeats),
    ``rows``, ``server``, ``config``.
    """
    engine_options = dict(options)
    if engine == "ours":
        engine_options.setdefault("max_num_seqs", max_num_seqs)
    app = build_app(lm, engine, max_model_len=max_model_len, parts=parts, **engine_options)
    with ServerThread(app) as srv:
        first = before_load(srv.url) if before_load is not None else None
        cfg = RunConfig(
            ClientConfig(srv.url, lm.name, timeout_s=timeout_s, ignore_eos=True),
            workload,
            [LoadPoint(concurrency=c) for c in concurrencies],
            requests=requests,
            warmup=1,
            repeats=repeats,
            slo=SLO(ttft_ms=slo_ttft_ms),
            workload_options={**(workload_options or {}), "output_tokens": output_tokens},
        )
        results = run_benchmark_sync(cfg, quiet=True)
    if before_load is not None:
        results["before_load"] = first
    return results


def server_counters(results: dict[str, Any]) -> dict[str, float | None]:
    """What the server counted during a :func:`serve_and_load` run: ``prefix_hit_rate`` (share of
    prompt tokens found in the prefix cache, at the end) and ``kv_blocks_used_max`` (peak KV blocks:
    the server's own high-water mark, its warm-up included, where it reports one; else the highest
    value the scrapes saw, which can miss a peak shorter than the scrape interval)."""
    scraped = [r.get("server_metrics", {}) for r in results.get("rows", [])]
    peaks = [max(s.get("kv_blocks_used_max", 0), s.get("kv_blocks_used_peak", 0)) for s in scraped]
    return {
        "prefix_hit_rate": scraped[-1].get("prefix_hit_rate") if scraped else None,
        "kv_blocks_used_max": max(peaks, default=None),
    }
