"""A load generator for any OpenAI-compatible server (ours, vLLM, SGLang): workloads, load
patterns, metrics with percentiles, ``/metrics`` scraping, results JSON and plots.

Typical use::

    from infer_lab.loadgen import ClientConfig, LoadPoint, RunConfig, run_benchmark_sync
    cfg = RunConfig(ClientConfig("http://127.0.0.1:8000", "smollm2-135m"), "shared-prefix",
                    [LoadPoint(concurrency=c) for c in (1, 4, 16)], requests=64)
    results = run_benchmark_sync(cfg)
"""

from .client import ClientConfig, RequestRecord, stream_request
from .metrics import SLO, summarize_records
from .report import format_table, results_table, save_plots, write_results
from .runner import (
    LoadPoint,
    RunConfig,
    arrival_gaps,
    run_benchmark,
    run_benchmark_sync,
    run_sessions,
)
from .scrape import MetricsScraper, parse_metrics, server_info
from .workloads import WORKLOADS, Session, Turn, build_workload

__all__ = [
    "ClientConfig",
    "RequestRecord",
    "stream_request",
    "SLO",
    "summarize_records",
    "format_table",
    "results_table",
    "save_plots",
    "write_results",
    "LoadPoint",
    "RunConfig",
    "arrival_gaps",
    "run_benchmark",
    "run_benchmark_sync",
    "run_sessions",
    "MetricsScraper",
    "parse_metrics",
    "server_info",
    "WORKLOADS",
    "Session",
    "Turn",
    "build_workload",
]
