"""The OpenAI-compatible HTTP API (FastAPI), independent of which backend generates.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /version``, ``GET /metrics``. Streaming is Server-Sent Events: one
``data: {json}`` line per chunk, then ``data: [DONE]``; with ``stream_options.include_usage``
a last chunk with empty ``choices`` carries ``usage`` (and ``server_timing``, the server's own
clock). Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``
and never stops the server.

One client must never stall the others, so nothing slow runs on the event loop:

- the request bodies are declared (:mod:`.schemas`) and capped in size (413), and only JSON
  is accepted (415): a body without ``Content-Type: application/json`` is not guessed at;
- tokenizing and the chat template run in a small thread pool (the tokenizer releases the GIL);
- text is decoded and stop strings matched incrementally (:class:`.text.TextStream`);
- cancelling or submitting only queues a command for the backend's own thread.

With an API key, ``/v1/*`` and ``/version`` (it shows versions, config and device) need
``Authorization: Bearer <key>``; ``/health`` is always open, and ``/metrics`` is open unless
``protect_metrics`` (as in vLLM: a Prometheus scraper usually sends no key).
"""

import asyncio
import functools
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from .backends import FINISH_CANCELLED, Backend, GenerationRequest, SamplingParams
from .metrics import ServerMetrics
from .schemas import (
    SEED_MAX,
    SEED_MIN,
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    request_models,
    validation_message,
)
from .text import TextStream

DEFAULT_MAX_BODY_BYTES = 2 * 2**20  # 2 MiB: far more text than any context holds


@dataclass
class ServerConfig:
    """Settings of one server. ``max_model_len`` is prompt + answer tokens, at most.

    ``vocab_size``: token ids in a prompt must be in ``[0, vocab_size)`` (default: the
    tokenizer's size). ``max_body_bytes``: larger request bodies get a 413.
    ``protect_metrics``: ``/metrics`` needs the API key too. ``tokenizer_threads``: threads
    that tokenize and apply the chat template, off the event loop.
    """

    model_name: str
    max_model_len: int
    default_max_tokens: int = (
        256  # chat requests without max_tokens (completions default to 16, as OpenAI)
    )
    api_key: str | None = None
    protect_metrics: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    tokenizer_threads: int = 2
    vocab_size: int | None = None


class APIError(Exception):
    """An error to send back as an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )
        self.headers = headers

    def response(self) -> JSONResponse:
        def clean(text: str | None) -> str | None:  # a lone surrogate cannot be sent as UTF-8
            return None if text is None else text.encode("utf-8", "backslashreplace").decode()

        return JSONResponse(
            status_code=self.status,
            headers=self.headers,
            content={
                "error": {
                    "message": clean(self.message),
                    "type": self.type,
                    "param": clean(self.param),
                    "code": self.code,
                }
            },
        )


_ERRORS = {
    status: {"model": ErrorResponse, "description": why}
    for status, why in (
        (400, "invalid request (bad field, context too long, lone surrogate, ...)"),
        (401, "missing or wrong API key (when the server has one)"),
        (404, "unknown model"),
        (413, "request body over the server's limit"),
        (415, "Content-Type is not application/json"),
        (500, "generation failed"),
    )
}
# With stream=true: Server-Sent Events (before OpenAPI 3.2, "schema" describes each event).
_SSE = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {
                    "type": "string",
                    "description": "one chunk as JSON (or an error object), or [DONE] at the end",
                }
            },
        }
    }
}


def create_app(backend: Backend, tokenizer: Any, config: ServerConfig) -> FastAPI:
    """An OpenAI-compatible app serving ``backend``; the backend starts and stops with the app."""
    metrics = ServerMetrics(backend.stats)
    CompletionRequest, ChatCompletionRequest = request_models(
        config.model_name, config.max_model_len, config.vocab_size or len(tokenizer)
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        backend.start()
        app.state.tokenizer_pool = ThreadPoolExecutor(
            config.tokenizer_threads, thread_name_prefix="tokenizer"
        )
        yield
        # Uvicorn has already finished or cancelled the in-flight responses when we get here.
        await asyncio.to_thread(backend.shutdown)
        app.state.tokenizer_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="infer-lab OpenAI-compatible server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.backend, app.state.metrics, app.state.config = backend, metrics, config
    _install_error_handlers(app, metrics)
    app.add_middleware(_Gate, config=config, metrics=metrics)
    app.openapi = functools.partial(_openapi, app, config)

    async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        pool = app.state.tokenizer_pool
        return await asyncio.get_running_loop().run_in_executor(
            pool, functools.partial(fn, *args, **kwargs)
        )

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/version", responses={401: _ERRORS[401]})
    async def version():
        from .. import __version__

        return {"version": f"infer-lab {__version__}", **backend.info()}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(
            metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    @app.get("/v1/models", responses={401: _ERRORS[401]})
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": config.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "infer-lab",
                    "max_model_len": config.max_model_len,
                }
            ],
        }

    @app.post(
        "/v1/completions",
        dependencies=[Depends(_require_json)],
        responses={200: {"model": CompletionResponse, "content": _SSE}, **_ERRORS},
    )
    async def completions(request: Request, body: CompletionRequest):  # type: ignore[valid-type]
        _check_model(body, config)
        text = body.prompt_text()
        if text is None:
            ids = list(body.prompt)
        else:
            ids = await off_loop(_encode, tokenizer, text)
        return await _serve(request, body, ids, chat=False)

    @app.post(
        "/v1/chat/completions",
        dependencies=[Depends(_require_json)],
        responses={200: {"model": ChatCompletionResponse, "content": _SSE}, **_ERRORS},
    )
    async def chat_completions(request: Request, body: ChatCompletionRequest):  # type: ignore[valid-type]
        _check_model(body, config)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            ids = await off_loop(_apply_chat_template, tokenizer, messages)
        except Exception as exc:  # the template itself rejected the conversation
            raise APIError(
                400, f"chat template failed on these messages: {exc}", param="messages"
            ) from exc
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        return await _serve(request, body, ids, chat=True)

    async def _serve(request: Request, body: Any, prompt_ids: list[int], chat: bool):
        limit = config.max_model_len
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        if len(prompt_ids) >= limit:
            raise APIError(
                400,
                f"the prompt has {len(prompt_ids)} tokens, over this model's context limit of "
                f"{limit} tokens (prompt + answer)",
                param="messages" if chat else "prompt",
                code="context_length_exceeded",
            )
        max_tokens = body.max_tokens
        if max_tokens is None:
            max_tokens = min(config.default_max_tokens if chat else 16, limit - len(prompt_ids))
        if len(prompt_ids) + max_tokens > limit:
            raise APIError(
                400,
                f"max_tokens={max_tokens} is too large: the prompt has {len(prompt_ids)} tokens "
                f"and the context limit is {limit}, so at most {limit - len(prompt_ids)}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        temperature, top_p = body.sampling()
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=body.seed,
            ignore_eos=body.ignore_eos,
        )
        received_s = getattr(request.state, "received_s", None) or time.perf_counter()
        run = _Run(backend, metrics, tokenizer, prompt_ids, params, body.stop_strings(), received_s)
        run.submit()
        meta = {
            "id": ("chatcmpl-" if chat else "cmpl-") + run.request.request_id,
            "created": int(time.time()),
            "model": config.model_name,
        }
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _sse(run, meta, chat, include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                # Runs after the stream ends or the client leaves, even before the first chunk.
                background=BackgroundTask(run.abandon),
            )
        parts = []
        watcher = asyncio.create_task(_cancel_when_disconnected(request, run))
        try:
            async for delta, finish in run.events():
                parts.append(delta)
                if finish:
                    break
        finally:
            watcher.cancel()
        if run.error:
            raise APIError(500, f"generation failed: {run.error}", "server_error")
        text = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": run.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            **meta,
            "object": "chat.completion" if chat else "text_completion",
            "choices": [choice],
            "usage": run.usage(),
            "server_timing": run.timing(),
        }

    return app


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _apply_chat_template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(out["input_ids"])


def _check_model(body: Any, config: ServerConfig) -> None:
    if body.model != config.model_name:
        raise APIError(
            404,
            f"the model {body.model!r} does not exist; this server serves "
            f"{config.model_name!r} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )


async def _require_json(request: Request) -> None:
    """415 for a body that is not declared as JSON: we do not guess what a client meant."""
    given = request.headers.get("content-type")
    media = (given or "").split(";", 1)[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return
    raise APIError(
        415,
        "send the body as JSON with the header 'Content-Type: application/json' "
        f"({'got ' + repr(given) if given else 'no Content-Type was sent'})",
        code="unsupported_media_type",
    )


def _install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def counted(error: APIError) -> JSONResponse:
        metrics.errors.labels(status=str(error.status)).inc()
        return error.response()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return counted(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = validation_message(list(exc.errors()))
        return counted(APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return counted(
            APIError(
                exc.status_code,
                f"{request.method} {request.url.path}: {exc.detail}",
                kind,
                code="request_too_large" if exc.status_code == 413 else None,
                headers=dict(exc.headers or {}),  # 405 keeps its Allow header
            )
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        # A bug, not the client's fault: still an OpenAI body, and counted.
        return counted(
            APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
        )


def _openapi(app: FastAPI, config: ServerConfig) -> dict[str, Any]:
    """FastAPI's schema, less its 422 (we answer 400), plus the bearer scheme when a key is set."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=__doc__.split("\n\n")[0],
        routes=app.routes,
    )
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            operation.get("responses", {}).pop("422", None)
            if config.api_key and _needs_key(path, config):
                operation["security"] = [{"bearer": []}]
    components = schema.setdefault("components", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(name, None)
    # FastAPI writes bounds as floats, and 2**63 - 1 is no float: restore the exact seed range.
    for body in components.get("schemas", {}).values():
        for option in body.get("properties", {}).get("seed", {}).get("anyOf", []):
            if option.get("type") == "integer":
                option.update(minimum=SEED_MIN, maximum=SEED_MAX)
    if config.api_key:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    app.openapi_schema = schema
    return schema


def _needs_key(path: str, config: ServerConfig) -> bool:
    return (
        path.startswith("/v1/")
        or path == "/version"
        or (config.protect_metrics and path == "/metrics")
    )


class _BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int):
        super().__init__(
            413,
            f"the request body is over this server's limit of {limit} bytes "
            "(infer-lab serve --max-body-bytes)",
        )


class _Gate:
    """Before any route: start the request's clock, check the API key, cap the body size.

    A plain ASGI middleware on purpose: Starlette's ``BaseHTTPMiddleware`` would hide client
    disconnects from the endpoints, and a server must notice them to free KV memory.
    """

    def __init__(self, app: Any, config: ServerConfig, metrics: ServerMetrics):
        self.app, self.config, self.metrics = app, config, metrics
        self._key = config.api_key.encode() if config.api_key else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["received_s"] = time.perf_counter()
        headers = dict(scope.get("headers") or [])
        error = self._refusal(scope["path"], headers)
        if error is not None:
            self.metrics.errors.labels(status=str(error.status)).inc()
            await error.response()(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _refusal(self, path: str, headers: dict[bytes, bytes]) -> APIError | None:
        if self._key and _needs_key(path, self.config) and not self._key_ok(headers):
            why = "missing API key" if b"authorization" not in headers else "invalid API key"
            return APIError(
                401,
                f"{why}: send the header 'Authorization: Bearer <key>'",
                "authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            return APIError(400, "the Content-Length header is not a number")
        if length > self.config.max_body_bytes:
            exc = _BodyTooLarge(self.config.max_body_bytes)
            return APIError(413, str(exc.detail), code="request_too_large")
        return None

    def _key_ok(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        # Constant time, so the key cannot be guessed byte by byte from response times.
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    def _limited(self, receive: Any) -> Any:
        """``receive`` that fails with a 413 once the body (chunked, no length) grows too large."""
        limit, seen = self.config.max_body_bytes, 0

        async def receive_within_limit() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge(limit)
            return message

        return receive_within_limit


async def _sse(
    run: "_Run", meta: dict[str, Any], chat: bool, include_usage: bool
) -> AsyncIterator[str]:
    """SSE lines of one streamed request. Cancellation (client gone) cancels the engine request."""
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta: str | None, finish: str | None, first: bool = False) -> str:
        if chat:
            d: dict[str, Any] = (
                {"role": "assistant", "content": delta or ""}
                if first
                else ({"content": delta} if delta else {})
            )
            choice = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
        payload = {**meta, "object": obj, "choices": [choice]}
        if include_usage:
            payload["usage"] = None
        return f"data: {json.dumps(payload)}\n\n"

    if chat:
        yield chunk("", None, first=True)
    async for delta, finish in run.events():
        if run.error:
            err = {
                "error": {
                    "message": f"generation failed: {run.error}",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            }
            yield f"data: {json.dumps(err)}\n\n"
            break
        if delta or finish:
            yield chunk(delta, finish)
        if finish:
            break
    if include_usage and not run.error:
        last = {**meta, "object": obj, "choices": [], "usage": run.usage()}
        last["server_timing"] = run.timing()
        yield f"data: {json.dumps(last)}\n\n"
    yield "data: [DONE]\n\n"


async def _cancel_when_disconnected(request: Request, run: "_Run", poll_s: float = 0.25) -> None:
    """A non-streaming client that hangs up gets its request cancelled instead of computed in vain."""
    while run.finish_reason is None:
        if await request.is_disconnected():
            run.abandon()
            return
        await asyncio.sleep(poll_s)


class _Run:
    """One request in flight: submits to the backend and turns its callbacks into (text, finish) events."""

    def __init__(
        self,
        backend: Backend,
        metrics: ServerMetrics,
        tokenizer: Any,
        prompt_ids: list[int],
        params: SamplingParams,
        stop: list[str],
        received_s: float,
    ):
        self.backend, self.metrics = backend, metrics
        self.request = GenerationRequest(uuid.uuid4().hex[:24], prompt_ids, params)
        self.received_s = received_s
        self.text = TextStream(tokenizer, stop)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self._first_token_s: float | None = None
        self._last_token_s: float | None = None
        self._finished_s: float | None = None
        self._abandoned = False

    def usage(self) -> dict[str, int]:
        n_prompt = len(self.request.prompt_ids)
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": n_prompt + self.completion_tokens,
        }

    def timing(self) -> dict[str, float | None]:
        """The server's clock for this request (see :class:`.schemas.ServerTiming`), seconds."""
        arrival = self.request.arrival_s

        def since_arrival(t: float | None) -> float | None:
            return None if t is None else t - arrival

        return {
            "preprocess_s": arrival - self.received_s,
            "ttft_s": since_arrival(self._first_token_s),
            "e2e_s": since_arrival(self._finished_s),
        }

    def submit(self) -> None:
        """Hand the request to the backend; its callbacks land in this run's queue (thread-safe)."""
        loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        inbox = self._inbox

        def on_token(token_id: int) -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, ("token", (token_id, time.perf_counter())))

        def on_finish(reason: str) -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, ("finish", (reason, time.perf_counter())))

        self.backend.submit(self.request, on_token, on_finish)
        self.metrics.prompt_tokens.inc(len(self.request.prompt_ids))
        self.metrics.preprocess.observe(self.request.arrival_s - self.received_s)

    def abandon(self) -> None:
        """Cancel the backend request if it has not finished (the client is gone); else do nothing."""
        if self.finish_reason is None and not self._abandoned:
            self._abandoned = True
            self.backend.cancel(self.request.request_id)  # only queues a command: never blocks
            self.metrics.requests.labels(finished_reason=FINISH_CANCELLED).inc()

    async def events(self) -> AsyncIterator[tuple[str, str | None]]:
        """(new text, finish reason or None) pairs until the request ends; cancels it if abandoned."""
        inbox = self._inbox
        done = False
        try:
            pending: list[tuple[str, tuple[Any, float]]] = []
            while True:
                kind, (value, at) = pending.pop(0) if pending else await inbox.get()
                if kind == "token":
                    self._observe_token(at)
                    delta = self.text.add(value)
                    # Tokens of the same engine step (speculative decoding accepts several) go
                    # out in one chunk, as vLLM sends them: one SSE event per step.
                    while not self.text.stopped and not inbox.empty():
                        nxt = inbox.get_nowait()
                        if nxt[0] != "token":
                            pending.append(nxt)
                            break
                        self._observe_token(nxt[1][1])
                        delta += self.text.add(nxt[1][0])
                    if self.text.stopped:  # a stop string ended the answer: the engine can stop too
                        self.backend.cancel(self.request.request_id)
                        self._finish("stop", at)
                        done = True
                        yield delta, "stop"
                        return
                    if delta:
                        yield delta, None
                    continue
                done = True
                if value.startswith("error"):
                    self.error = value
                    self._finish("error", at)
                    yield "", "error"
                    return
                self._finish(value, at)
                yield self.text.flush(), value
                return
        finally:
            if (
                not done
            ):  # the client went away (or shutdown cancelled us): free the engine's resources
                self.abandon()

    def _observe_token(self, at: float) -> None:
        self.completion_tokens += 1
        self.metrics.generation_tokens.inc()
        if self._last_token_s is None:
            self._first_token_s = at
            self.metrics.ttft.observe(at - self.request.arrival_s)
        else:
            self.metrics.itl.observe(at - self._last_token_s)
        self._last_token_s = at

    def _finish(self, reason: str, at: float) -> None:
        self.finish_reason = reason
        self._finished_s = at
        self.metrics.e2e.observe(at - self.request.arrival_s)
        self.metrics.requests.labels(finished_reason=reason).inc()
