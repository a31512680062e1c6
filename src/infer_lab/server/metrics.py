"""Prometheus metrics of the server, named like vLLM's (``infer_lab:`` instead of ``vllm:``).

Each app gets its own registry, so several servers can live in one process (the tests do
that). Live engine numbers (running/waiting, KV blocks, prefix-cache counters) are read from
the backend at scrape time; latencies are histograms observed per request, in seconds.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "infer_lab:"
_TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
)
_ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
_E2E_BUCKETS = (
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
)


class _EngineCollector:
    """Reads the backend's (and the server's) live numbers when Prometheus scrapes."""

    def __init__(self, stats: Callable[[], dict[str, float]]):
        self._sources = [stats]

    def collect(self):
        s: dict[str, float] = {}
        for source in self._sources:
            s.update(source())
        yield GaugeMetricFamily(
            PREFIX + "num_requests_running",
            "Requests being generated now.",
            value=s.get("running", 0.0),
        )
        yield GaugeMetricFamily(
            PREFIX + "num_requests_waiting",
            "Requests queued, not started.",
            value=s.get("waiting", 0.0),
        )
        if "paused" in s:
            yield GaugeMetricFamily(
                PREFIX + "num_requests_paused",
                "Streams paused because their client stopped reading: they hold no batch slot "
                "and no KV blocks until it reads again.",
                value=s["paused"],
            )
        for key, name, doc in (
            ("queue_limit", "num_requests_waiting_limit",
             "Requests that may wait for a slot; more get a 503."),
            ("tokenizer_queue", "num_prompts_tokenizing", "Prompts in or waiting for the tokenizer."),
            ("tokenizer_queue_limit", "num_prompts_tokenizing_limit",
             "Prompts that may wait for the tokenizer; more get a 503."),
            ("connections_open", "connections_open", "Open HTTP connections."),
            ("connections_limit", "connections_limit",
             "Open connections allowed; past it the oldest idle or slow one is closed."),
        ):
            if key in s:
                yield GaugeMetricFamily(PREFIX + name, doc, value=s[key])
        if "connections_closed_header_timeout" in s:
            closed = CounterMetricFamily(
                PREFIX + "connections_closed",
                "Connections the server closed: headers or body not sent in time, a response "
                "the client accepted no byte of in time (send_timeout), "
                "or the oldest idle/slow one closed to stay under the cap.",
                labels=["reason"],
            )
            for reason in ("header_timeout", "body_timeout", "send_timeout", "evicted", "refused"):
                closed.add_metric([reason], s.get(f"connections_closed_{reason}", 0.0))
            yield closed
        if "kv_blocks_total" in s:
            used, total = s.get("kv_blocks_used", 0.0), s["kv_blocks_total"]
            yield GaugeMetricFamily(
                PREFIX + "kv_blocks_used", "KV-cache blocks in use.", value=used
            )
            yield GaugeMetricFamily(
                PREFIX + "kv_blocks_total", "KV-cache blocks in the pool.", value=total
            )
            if "kv_blocks_used_peak" in s:  # a scrape between two steps would miss a short peak
                yield GaugeMetricFamily(
                    PREFIX + "kv_blocks_used_peak",
                    "Most KV-cache blocks in use at once since the server started.",
                    value=s["kv_blocks_used_peak"],
                )
            yield GaugeMetricFamily(
                PREFIX + "kv_cache_usage_perc",
                "Fraction of KV blocks in use (0..1).",
                value=used / total if total else 0.0,
            )
        if "spec_proposed_tokens" in s:
            yield CounterMetricFamily(
                PREFIX + "spec_decode_num_draft_tokens",
                "Speculative tokens proposed and verified by the target.",
                value=s["spec_proposed_tokens"],
            )
            yield CounterMetricFamily(
                PREFIX + "spec_decode_num_accepted_tokens",
                "Speculative tokens the target kept.",
                value=s["spec_accepted_tokens"],
            )
            yield CounterMetricFamily(
                PREFIX + "spec_decode_num_verify_passes",
                "Target passes that verified speculative tokens.",
                value=s["spec_verify_passes"],
            )
        if "prefix_cache_queries" in s:
            yield CounterMetricFamily(
                PREFIX + "prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                value=s["prefix_cache_queries"],
            )
            yield CounterMetricFamily(
                PREFIX + "prefix_cache_hits",
                "Prompt tokens found in the prefix cache.",
                value=s.get("prefix_cache_hits", 0.0),
            )


class ServerMetrics:
    """All the server's metrics in one registry; ``render()`` gives the Prometheus text."""

    def __init__(self, stats: Callable[[], dict[str, float]]):
        self.registry = CollectorRegistry()
        self._live = _EngineCollector(stats)
        self.registry.register(self._live)
        r = self.registry
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Arrival to first token.",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Gap between consecutive tokens.",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Arrival to last token.",
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.preprocess = Histogram(
            PREFIX + "request_preprocess_seconds",
            "First byte of the request to the engine: body, validation, tokenization. "
            "The latency histograms start after it.",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.generation_tokens = Counter(
            PREFIX + "generation_tokens",
            "Tokens generated, the EOS that ended an answer included (as usage counts them).",
            registry=r,
        )
        self.prompt_tokens = Counter(
            PREFIX + "prompt_tokens", "Prompt tokens received.", registry=r
        )
        self.requests = Counter(
            PREFIX + "request_success",
            "Finished requests by finish reason: stop, length, error, or ended early: cancelled "
            "(client gone), client_too_slow (paused for not reading, then gone or closed by "
            "the send timeout), queue_timeout, shutdown.",
            ["finished_reason"],
            registry=r,
        )
        self.stream_pauses = Counter(
            PREFIX + "stream_pauses",
            "Times a stream was paused (batch slot and KV blocks freed) because its client "
            "took no more bytes; it resumes when the client has read what waited.",
            registry=r,
        )
        self.errors = Counter(
            PREFIX + "request_errors", "Rejected requests by HTTP status.", ["status"], registry=r
        )

        self.rejected = Counter(
            PREFIX + "request_rejected",
            "Requests refused with a 503 because the server was full: queue_full, "
            "queue_timeout, tokenizer_busy.",
            ["reason"],
            registry=r,
        )
        self.client_gone = Counter(
            PREFIX + "client_disconnects",
            "Clients that hung up before their request was read (stage=body); not errors.",
            ["stage"],
            registry=r,
        )

    def add_live(self, stats: Callable[[], dict[str, float]]) -> None:
        """Another source of live numbers read at scrape time (queue sizes, connections)."""
        self._live._sources.append(stats)

    def render(self) -> bytes:
        return generate_latest(self.registry)
