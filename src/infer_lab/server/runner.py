"""Build a server for a model and run it: in the foreground (``infer-lab serve``) or in a
background thread on a free port (tests, notebooks, the tour)."""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Any

from .app import DEFAULT_MAX_BODY_BYTES, ServerConfig, create_app
from .backends import HFBackend
from .ours import OursBackend

# ServerConfig fields build_app passes through (limits of the server, not of the engine).
SERVER_LIMITS = (
    "tokenizer_queue",
    "max_queued",
    "queue_timeout_s",
    "stream_buffer_tokens",
    "send_timeout_s",
    "header_timeout_s",
    "body_timeout_s",
    "max_connections",
)

ENGINES = ("ours", "hf")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def make_backend(lm: Any, engine: str = "hf", parts: Any = None, **engine_options: Any):
    """The backend for ``engine``: ``"hf"`` (one request at a time) or ``"ours"`` (the from-scratch engine).

    ``engine_options`` go to :class:`infer_lab.engine.EngineConfig` (``kv_mode``, ``block_size``,
    ``num_blocks``, ``max_num_seqs``, ``prefix_cache``, ``chunked_prefill``, ...). ``parts``
    (:class:`infer_lab.engine.EngineParts`) replaces components of our engine with others of the
    same interface (the course's build track serves the learner's engine this way).
    """
    if engine == "hf":
        if parts is not None:
            raise ValueError("the hf backend has no engine components to replace; use engine 'ours'")
        if engine_options:
            raise ValueError(
                f"the hf backend takes no engine options, got {sorted(engine_options)}"
            )

        return HFBackend(lm)
    if engine == "ours":
        return OursBackend(lm, parts=parts, **engine_options)
    raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")


def build_app(
    lm: Any,
    engine: str = "hf",
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    api_key: str | None = None,
    default_max_tokens: int = 256,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    protect_metrics: bool = False,
    parts: Any = None,
    **options: Any,
):
    """An app serving the loaded model ``lm`` (see :func:`infer_lab.models.load_model`).

    ``max_body_bytes``: larger request bodies get a 413. ``protect_metrics``: ``/metrics``
    needs the API key too (by default it is open, as in vLLM, for Prometheus scrapers).
    ``options`` named in :data:`SERVER_LIMITS` are :class:`.app.ServerConfig` fields (queue
    and connection limits, timeouts in seconds); the others go to the engine. ``parts``: see
    :func:`make_backend`.
    """
    limits = {k: options.pop(k) for k in SERVER_LIMITS if k in options}
    engine_options = options
    if lm.tokenizer is None:
        raise ValueError(
            f"{lm.name} has no tokenizer, so it cannot serve text; use a model with one"
        )
    limit = max_model_len or int(getattr(lm.config, "max_position_embeddings", 2048))
    if limit < 2:
        raise ValueError(f"max_model_len must be >= 2 tokens, got {limit}")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
    if engine == "ours" and max_model_len:
        engine_options.setdefault("max_model_len", max_model_len)
    backend = make_backend(lm, engine, parts=parts, **engine_options)
    # The engine may hold a shorter context than the model allows (ours defaults to 2048).
    limit = min(limit, getattr(backend, "max_model_len", limit))
    cfg = ServerConfig(
        model_name=served_model_name or lm.name,
        max_model_len=limit,
        api_key=api_key,
        default_max_tokens=default_max_tokens,
        vocab_size=int(getattr(lm.config, "vocab_size", 0)) or None,
        max_body_bytes=max_body_bytes,
        protect_metrics=protect_metrics,
        **limits,
    )
    return create_app(backend, lm.tokenizer, cfg)


def uvicorn_server(app: Any, host: str, port: int, shutdown_timeout_s: float, log_level: str):
    """A uvicorn server for an app of :func:`create_app`, with its connection guard.

    Past ``shutdown_timeout_s`` the app itself ends what still runs (error events, 503
    bodies); uvicorn gets two more seconds before it cancels the tasks, so its bare 500s and
    cut streams are not what a client sees.
    """
    import uvicorn  # optional: uvicorn ([serve])

    from .guard import GuardStats, accept_backlog, guarded_h11  # defers uvicorn (guard)

    # Any ASGI app may be served (tests serve fakes); ours also reports the guard on /metrics.
    state = getattr(app, "state", None)
    cfg = getattr(state, "config", None)
    if not isinstance(cfg, ServerConfig):
        cfg = ServerConfig(model_name="", max_model_len=2)
    stats = GuardStats()
    protocol = guarded_h11(
        cfg.header_timeout_s, cfg.body_timeout_s, cfg.max_connections, stats, cfg.send_timeout_s
    )
    metrics = getattr(state, "metrics", None)
    begin_shutdown = getattr(state, "begin_shutdown", None)
    if metrics is not None and state is not None:
        state.guard_stats = stats
        metrics.add_live(
            lambda: {
                "connections_open": float(stats.open),
                "connections_limit": float(protocol.max_open),
                "connections_closed_header_timeout": float(stats.header_timeouts),
                "connections_closed_body_timeout": float(stats.body_timeouts),
                "connections_closed_send_timeout": float(stats.send_timeouts),
                "connections_closed_evicted": float(stats.evicted),
                "connections_closed_refused": float(stats.refused),
            }
        )

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            if begin_shutdown is not None:
                begin_shutdown(shutdown_timeout_s)
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=protocol,
        backlog=accept_backlog(protocol.max_open),
        timeout_graceful_shutdown=shutdown_timeout_s + (2.0 if begin_shutdown else 0.0),
    )
    return Server(config)


class ServerThread:
    """Uvicorn serving ``app`` on 127.0.0.1 in a background thread; use as a context manager."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int | None = None,
        shutdown_timeout_s: float = 5.0,
    ):
        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn_server(app, self.host, self.port, shutdown_timeout_s, "warning")
        self.thread = threading.Thread(
            target=self.server.run, name=f"uvicorn-{self.port}", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url} within {timeout_s:g} s")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop: stop accepting, let responses finish (up to the shutdown timeout), then cancel."""
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def kill(self) -> None:
        """Abrupt stop: in-flight connections are dropped (what a crashed server looks like to clients)."""
        self.server.force_exit = True
        self.server.should_exit = True
        self.thread.join(10.0)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    lm: Any,
    engine: str = "hf",
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    shutdown_timeout_s: float = 30.0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    protect_metrics: bool = False,
    **engine_options: Any,
) -> None:
    """Serve in the foreground until Ctrl-C / SIGTERM; in-flight requests get ``shutdown_timeout_s`` to finish."""
    app = build_app(
        lm,
        engine,
        served_model_name,
        max_model_len,
        api_key,
        max_body_bytes=max_body_bytes,
        protect_metrics=protect_metrics,
        **engine_options,
    )
    server = uvicorn_server(app, host, port, shutdown_timeout_s, "info")
    backend = getattr(app.state, "backend", None)
    if not hasattr(backend, "step_on_caller"):
        server.run()
        return
    # Our engine steps on this (main) thread, the one that loaded the model (see OurBackend.run_loop);
    # HTTP runs in a thread, and Ctrl-C / SIGTERM here asks it for the graceful shutdown it would do.
    backend.step_on_caller()
    http = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        http.start()
        while http.is_alive() and not server.started:
            time.sleep(0.02)
        if http.is_alive():
            backend.run_loop()  # returns when the app's shutdown stops the backend
        http.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
