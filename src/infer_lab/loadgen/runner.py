"""Drive a workload against a server: fixed-concurrency (closed loop) or arrival-rate (open loop).

- **Closed loop, concurrency C**: C simulated users; each takes the next session, runs its calls
  one after another, then takes the next session. The server never sees more than C requests.
- **Open loop, rate λ**: sessions *arrive* at random times, whatever the server's state:
  exponential gaps (Poisson process) or gamma gaps with shape ``1/burstiness`` (burstiness > 1
  gives clumps, < 1 gives a more regular stream), both with mean ``1/λ``. This is how real
  traffic behaves, and the only way to see queueing delay build up.

Every point starts with warm-up calls that are not recorded, and can be repeated; each repeat
is summarized separately and all repeats are pooled too.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import platform
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from .. import __version__
from .client import ClientConfig, RequestRecord, stream_request
from .metrics import SLO, summarize_records
from .scrape import MetricsScraper, server_info
from .workloads import Session, build_workload, count_calls, describe


@dataclass
class LoadPoint:
    """One load level: exactly one of ``concurrency`` (closed loop) or ``rate_per_s`` (open loop)."""

    concurrency: int | None = None
    rate_per_s: float | None = None
    burstiness: float = 1.0  # gamma shape = 1/burstiness; 1.0 is Poisson

    def __post_init__(self):
        if (self.concurrency is None) == (self.rate_per_s is None):
            raise ValueError("a load point needs exactly one of concurrency or rate_per_s")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate_per_s}")
        if self.burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency={self.concurrency}"
        return f"rate={self.rate_per_s:g}/s" + (
            f" (burstiness {self.burstiness:g})" if self.burstiness != 1 else ""
        )

    @property
    def load(self) -> float:
        """The x value of the load plots: concurrency, or requests/s."""
        return float(self.concurrency if self.concurrency is not None else self.rate_per_s)


@dataclass
class RunConfig:
    """Everything about a run except the server: recorded in full in the results JSON."""

    client: ClientConfig
    workload: str
    points: list[LoadPoint]
    requests: int = 100
    warmup: int = 2
    repeats: int = 1
    seed: int = 0
    slo: SLO = field(default_factory=SLO)
    scrape_interval_s: float = 0.5
    workload_options: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["client"].get("api_key"):
            d["client"]["api_key"] = "***"
        return d


def arrival_gaps(n: int, rate_per_s: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """``n`` inter-arrival gaps (s) with mean ``1/rate``: exponential, or gamma(shape=1/burstiness)."""
    rng = random.Random(seed)
    if burstiness == 1.0:
        return [rng.expovariate(rate_per_s) for _ in range(n)]
    shape = 1.0 / burstiness
    return [rng.gammavariate(shape, 1.0 / (rate_per_s * shape)) for _ in range(n)]


async def _run_session(
    client: httpx.AsyncClient, cfg: ClientConfig, session: Session, records: list[RequestRecord]
) -> None:
    answers: list[str] = []
    for i, turn in enumerate(session.turns):
        rec = await stream_request(
            client,
            cfg,
            session.messages_for(i, answers),
            turn.max_tokens,
            session.session_id,
            i,
            prompt_ids=turn.prompt_ids,
        )
        records.append(rec)
        if not rec.ok:  # the rest of a conversation makes no sense without this answer
            return
        answers.append(rec.text)


async def run_sessions(
    client: httpx.AsyncClient,
    cfg: ClientConfig,
    sessions: list[Session],
    point: LoadPoint,
    seed: int = 0,
) -> list[RequestRecord]:
    """Run all sessions at one load point and return one record per call made."""
    records: list[RequestRecord] = []
    if point.concurrency is not None:
        queue: asyncio.Queue[Session] = asyncio.Queue()
        for s in sessions:
            queue.put_nowait(s)

        async def user() -> None:
            while True:
                try:
                    s = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await _run_session(client, cfg, s, records)

        await asyncio.gather(*(user() for _ in range(min(point.concurrency, len(sessions)))))
        return records
    tasks = []
    for s, gap in zip(
        sessions, arrival_gaps(len(sessions), point.rate_per_s, point.burstiness, seed), strict=True
    ):
        await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(_run_session(client, cfg, s, records)))
    await asyncio.gather(*tasks)
    return records


def client_environment() -> dict[str, Any]:
    """Where the load came from: date, client library versions, platform."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "infer_lab": __version__,
        "httpx": httpx.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _log(msg: str) -> None:
    print(f"[loadgen] {msg}", file=sys.stderr, flush=True)


async def run_benchmark(
    cfg: RunConfig, sessions_for_repeat=None, quiet: bool = False
) -> dict[str, Any]:
    """Warm up, then run every load point ``repeats`` times; returns the results dict (JSON-ready).

    ``sessions_for_repeat(repeat)`` builds the workload (default: :func:`build_workload` with the
    run's seed + repeat, so repeats use different prompts of the same shape).
    """
    opts = dict(cfg.workload_options)

    def default_sessions(repeat: int) -> list[Session]:
        return build_workload(cfg.workload, cfg.requests, seed=cfg.seed + repeat, **opts)

    make = sessions_for_repeat or default_sessions
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(cfg.client.timeout_s, connect=min(10.0, cfg.client.timeout_s))
    results: dict[str, Any] = {
        "config": cfg.as_dict(),
        "client_environment": client_environment(),
        "rows": [],
        "pooled": [],
        "requests": [],
    }
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        side_timeout = min(
            2.0, cfg.client.timeout_s
        )  # /version and /metrics must never stall a run
        results["server"] = await server_info(
            client, cfg.client.base_url, cfg.client.api_key, side_timeout
        )
        if cfg.warmup > 0:
            warm = build_workload(
                "random", cfg.warmup, seed=10_000 + cfg.seed, input_words=32, output_tokens=8
            )
            warm_records = await run_sessions(
                client, cfg.client, warm, LoadPoint(concurrency=len(warm))
            )
            n_bad = sum(not r.ok for r in warm_records)
            if not quiet:
                _log(f"warm-up: {len(warm_records)} requests, {n_bad} failed")
        for point in cfg.points:
            pooled: list[RequestRecord] = []
            for repeat in range(cfg.repeats):
                sessions = make(repeat)
                if not quiet:
                    _log(
                        f"{point.label} repeat {repeat + 1}/{cfg.repeats}: {count_calls(sessions)} calls ..."
                    )
                async with MetricsScraper(
                    client,
                    cfg.client.base_url,
                    cfg.scrape_interval_s,
                    side_timeout,
                    cfg.client.api_key,
                ) as scraper:
                    t0 = time.perf_counter()
                    records = await run_sessions(
                        client, cfg.client, sessions, point, seed=cfg.seed + repeat
                    )
                    wall = time.perf_counter() - t0
                row = summarize_records(records, cfg.slo, duration_s=wall)
                row.update(
                    point=point.label,
                    load=point.load,
                    concurrency=point.concurrency,
                    rate_per_s=point.rate_per_s,
                    repeat=repeat,
                    workload=cfg.workload,
                    workload_shape=describe(sessions),
                    server_metrics=scraper.summary(),
                )
                results["rows"].append(row)
                results["requests"].extend(
                    {**r.as_dict(), "point": point.label, "repeat": repeat} for r in records
                )
                pooled.extend(records)
                if not quiet:
                    _log(
                        f"  {row['completed']}/{row['requests']} ok, {row['output_tokens_per_s'] or 0:.1f} "
                        f"output tok/s, TTFT p50 {row['ttft_ms_p50'] or float('nan'):.0f} ms"
                    )
            prow = summarize_records(
                pooled,
                cfg.slo,
                duration_s=sum(
                    r["duration_s"] for r in results["rows"] if r["point"] == point.label
                ),
            )
            prow.update(
                point=point.label,
                load=point.load,
                concurrency=point.concurrency,
                rate_per_s=point.rate_per_s,
                repeats=cfg.repeats,
                workload=cfg.workload,
            )
            results["pooled"].append(prow)
    return results


def off_the_event_loop(fn: Callable[[], Any]) -> Any:
    """``fn()``, in a worker thread when this thread runs an event loop (a marimo or Jupyter kernel does).

    ``asyncio.run`` refuses to start inside a running loop; in its own thread ``fn`` gets a loop
    of its own. Exceptions propagate.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer-lab-loadgen") as pool:
        return pool.submit(fn).result()


def run_benchmark_sync(
    cfg: RunConfig, quiet: bool = False, sessions_for_repeat=None
) -> dict[str, Any]:
    """:func:`run_benchmark` from synchronous code (CLI, notebook cells, tests), inside a kernel's
    running event loop too."""
    return off_the_event_loop(
        lambda: asyncio.run(run_benchmark(cfg, sessions_for_repeat=sessions_for_repeat, quiet=quiet)))
