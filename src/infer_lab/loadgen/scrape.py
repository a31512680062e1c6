"""Scrape a server's Prometheus ``/metrics`` during a run, under our names and vLLM's / SGLang's.

Each engine names the same quantities differently; :data:`METRIC_NAMES` maps them to ours:
``running`` and ``waiting`` requests, ``kv_usage`` (fraction of KV blocks in use, 0..1) and the
prefix-cache ``hits`` / ``queries`` counters (their ratio is the hit rate) or a ready-made
``hit_rate`` gauge, and the server's TTFT histogram (its mean over a run is the server's own
TTFT, to set beside the client's). A server without ``/metrics`` simply gives no samples.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

# Our name -> sample names that carry it, first match wins (Prometheus text names, counters with _total).
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "running": (
        "infer_lab:num_requests_running",
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
    ),
    "waiting": (
        "infer_lab:num_requests_waiting",
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
    ),
    "kv_usage": (
        "infer_lab:kv_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
    ),
    "kv_blocks_used": ("infer_lab:kv_blocks_used",),
    "kv_blocks_peak": ("infer_lab:kv_blocks_used_peak",),
    "kv_blocks_total": ("infer_lab:kv_blocks_total",),
    "hits": (
        "infer_lab:prefix_cache_hits_total",
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
    ),
    "queries": (
        "infer_lab:prefix_cache_queries_total",
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
    ),
    "hit_rate": ("sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"),
    # The server's own TTFT histogram (its clock starts at its engine): mean = sum / count.
    "ttft_sum": (
        "infer_lab:time_to_first_token_seconds_sum",
        "vllm:time_to_first_token_seconds_sum",
        "sglang:time_to_first_token_seconds_sum",
    ),
    "ttft_count": (
        "infer_lab:time_to_first_token_seconds_count",
        "vllm:time_to_first_token_seconds_count",
        "sglang:time_to_first_token_seconds_count",
    ),
    "generation_tokens": (
        "infer_lab:generation_tokens_total",
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
    ),
}


def parse_metrics(text: str) -> dict[str, float]:
    """Our names -> values from Prometheus text (labels summed, e.g. over vLLM's ``model_name``)."""
    from prometheus_client.parser import text_string_to_metric_families  # optional: [serve] extra

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    out: dict[str, float] = {}
    for ours, names in METRIC_NAMES.items():
        for name in names:
            if name in values:
                out[ours] = values[name]
                break
    return out


async def scrape_once(
    client: httpx.AsyncClient, base_url: str, timeout_s: float = 2.0, api_key: str | None = None
) -> dict[str, float] | None:
    """One scrape; None when the server has no usable ``/metrics``."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = await client.get(url, timeout=timeout_s, headers=headers)
        if resp.status_code != 200:
            return None
        return parse_metrics(resp.text)
    except (httpx.HTTPError, ValueError):
        return None


class MetricsScraper:
    """Samples ``/metrics`` every ``interval_s`` in the background while a run is going."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        interval_s: float = 0.5,
        timeout_s: float = 2.0,
        api_key: str | None = None,
    ):
        self.client, self.base_url, self.interval_s, self.timeout_s = (
            client,
            base_url,
            interval_s,
            timeout_s,
        )
        self.api_key = api_key  # for a server that protects /metrics
        self.samples: list[dict[str, float]] = []
        self._task: asyncio.Task | None = None
        self._t0 = 0.0

    async def _loop(self) -> None:
        while True:
            values = await scrape_once(self.client, self.base_url, self.timeout_s, self.api_key)
            if values is not None:
                values["t_s"] = time.perf_counter() - self._t0
                self.samples.append(values)
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> MetricsScraper:
        self._t0 = time.perf_counter()
        self.before = await scrape_once(self.client, self.base_url, self.timeout_s, self.api_key)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.after = await scrape_once(self.client, self.base_url, self.timeout_s, self.api_key)

    def summary(self) -> dict[str, Any]:
        """Peak running/waiting/KV usage during the run and the prefix-cache hit rate over it."""
        if self.before is None and not self.samples:
            return {"available": False}
        out: dict[str, Any] = {"available": True, "n_samples": len(self.samples)}
        for key in ("running", "waiting", "kv_usage", "kv_blocks_used"):
            vals = [s[key] for s in self.samples if key in s]
            if vals:
                out[f"{key}_max"] = max(vals)
        if self.after and "kv_blocks_total" in self.after:
            out["kv_blocks_total"] = self.after["kv_blocks_total"]
        if self.after and "kv_blocks_peak" in self.after:  # the server's own high-water mark
            out["kv_blocks_used_peak"] = self.after["kv_blocks_peak"]
        before, after = self.before or {}, self.after or {}
        if "hits" in after and "queries" in after:
            d_hits = after["hits"] - before.get("hits", 0.0)
            d_queries = after["queries"] - before.get("queries", 0.0)
            out["prefix_hit_rate"] = d_hits / d_queries if d_queries > 0 else None
        elif "hit_rate" in after:
            out["prefix_hit_rate"] = after["hit_rate"]
        if "ttft_sum" in after and "ttft_count" in after:
            n = after["ttft_count"] - before.get("ttft_count", 0.0)
            total = after["ttft_sum"] - before.get("ttft_sum", 0.0)
            out["server_ttft_ms_mean"] = total / n * 1e3 if n > 0 else None
        if "generation_tokens" in after:
            out["server_generation_tokens"] = after["generation_tokens"] - before.get(
                "generation_tokens", 0.0
            )
        return out


async def server_info(
    client: httpx.AsyncClient, base_url: str, api_key: str | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    """What the server says about itself: ``/version`` (ours, vLLM), ``/get_server_info`` (SGLang), models."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    info: dict[str, Any] = {"url": root}
    for path in ("/version", "/get_server_info"):
        try:
            resp = await client.get(root + path, timeout=timeout_s, headers=headers)
            if resp.status_code == 200:
                data = resp.json()
                info["version"] = data.get("version", data) if isinstance(data, dict) else data
                info["version_source"] = path
                if isinstance(data, dict):
                    info.update({k: data[k] for k in ("engine", "device") if k in data})
                break
        except (httpx.HTTPError, ValueError):
            continue
    try:
        resp = await client.get(root + "/v1/models", timeout=timeout_s, headers=headers)
        if resp.status_code == 200:
            info["models"] = [m.get("id") for m in resp.json().get("data", [])]
    except (httpx.HTTPError, ValueError):
        pass
    return info
