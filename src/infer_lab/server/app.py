"""The OpenAI-compatible HTTP API (FastAPI), independent of which backend generates.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /version``, ``GET /metrics``. Streaming is Server-Sent Events: one
``data: {json}`` line per chunk, then ``data: [DONE]``; with ``stream_options.include_usage``
a last chunk with empty ``choices`` carries ``usage``. Every error is an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}`` and never stops the server.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from .backends import FINISH_CANCELLED, Backend, GenerationRequest, SamplingParams
from .metrics import ServerMetrics
from .text import TextStream


@dataclass
class ServerConfig:
    """Settings of one server. ``max_model_len`` is prompt + answer tokens, at most."""

    model_name: str
    max_model_len: int
    default_max_tokens: int = (
        256  # chat requests without max_tokens (completions default to 16, as OpenAI)
    )
    api_key: str | None = None


class APIError(Exception):
    """An error to send back as an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type_,
            param,
            code,
        )

    def response(self) -> JSONResponse:
        return JSONResponse(
            status_code=self.status,
            content={
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            },
        )


# ---------------------------------------------------------------------------------------------
# Request bodies (unknown extra fields are accepted and ignored, as most servers do)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension: keep going past the end-of-sequence token


class CompletionBody(_Common):
    prompt: str | list[int] | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.get("text", "") for part in self.content if part.get("type") == "text")


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    param = ".".join(str(p) for p in err.get("loc", ())) or None
    return (
        f"invalid request: {param}: {err.get('msg')}"
        if param
        else f"invalid request: {err.get('msg')}",
        param,
    )


# ---------------------------------------------------------------------------------------------
# The app


def create_app(backend: Backend, tokenizer: Any, config: ServerConfig) -> FastAPI:
    """An OpenAI-compatible app serving ``backend``; the backend starts and stops with the app."""
    from contextlib import asynccontextmanager

    metrics = ServerMetrics(backend.stats)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        backend.start()
        yield
        # Uvicorn has already finished or cancelled the in-flight responses when we get here.
        backend.shutdown()

    app = FastAPI(
        title="infer-lab OpenAI-compatible server", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.backend, app.state.metrics, app.state.config = backend, metrics, config

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        metrics.errors.labels(status=str(exc.status)).inc()
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        metrics.errors.labels(status=str(exc.status_code)).inc()
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(
            exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind
        ).response()

    app.add_middleware(_BearerAuth, api_key=config.api_key, metrics=metrics)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        from .. import __version__

        return {"version": f"infer-lab {__version__}", **backend.info()}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
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

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionBody)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = list(prompt)
        return await _serve(request, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _parse(request, ChatBody)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        except Exception as exc:  # the template itself rejected the conversation
            raise APIError(
                400, f"chat template failed on these messages: {exc}", param="messages"
            ) from exc
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        return await _serve(request, body, list(ids), chat=True)

    async def _parse(request: Request, model: type[BaseModel]):
        raw = await request.body()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise APIError(400, "request body must be a JSON object")
        try:
            body = model.model_validate(data)
        except ValidationError as exc:
            message, param = _validation_message(exc)
            raise APIError(400, message, param=param) from exc
        if body.model != config.model_name:
            raise APIError(
                404,
                f"the model {body.model!r} does not exist; this server serves "
                f"{config.model_name!r} (see GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        if body.n != 1:
            raise APIError(400, f"n={body.n} is not supported: only n=1", param="n")
        return body

    async def _serve(request: Request, body: _Common, prompt_ids: list[int], chat: bool):
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
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            ignore_eos=body.ignore_eos,
        )
        run = _Run(backend, metrics, tokenizer, prompt_ids, params, stop)
        try:
            run.submit()
        except ValueError as exc:  # the engine refused the request (its own limits)
            raise APIError(400, f"request rejected by the engine: {exc}") from exc
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
        }

    return app


async def _sse(
    run: _Run, meta: dict[str, Any], chat: bool, include_usage: bool
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
        yield f"data: {json.dumps({**meta, 'object': obj, 'choices': [], 'usage': run.usage()})}\n\n"
    yield "data: [DONE]\n\n"


class _BearerAuth:
    """Require ``Authorization: Bearer <key>`` on ``/v1/`` routes when a key is set.

    A plain ASGI middleware on purpose: Starlette's ``BaseHTTPMiddleware`` would hide client
    disconnects from the endpoints, and a server must notice them to free KV memory.
    """

    def __init__(self, app: Any, api_key: str | None, metrics: ServerMetrics):
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.api_key and scope["type"] == "http" and scope["path"].startswith("/v1/"):
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            if header != f"Bearer {self.api_key}":
                self.metrics.errors.labels(status="401").inc()
                why = "missing API key" if not header else "invalid API key"
                response = APIError(
                    401,
                    f"{why}: send the header 'Authorization: Bearer <key>'",
                    "authentication_error",
                    code="invalid_api_key",
                ).response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _cancel_when_disconnected(request: Request, run: _Run, poll_s: float = 0.25) -> None:
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
    ):
        self.backend, self.metrics = backend, metrics
        self.request = GenerationRequest(uuid.uuid4().hex[:24], prompt_ids, params)
        self.text = TextStream(tokenizer, stop)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self._last_token_s: float | None = None
        self._abandoned = False

    def usage(self) -> dict[str, int]:
        n_prompt = len(self.request.prompt_ids)
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": n_prompt + self.completion_tokens,
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

    def abandon(self) -> None:
        """Cancel the backend request if it has not finished (the client is gone); else do nothing."""
        if self.finish_reason is None and not self._abandoned:
            self._abandoned = True
            self.backend.cancel(self.request.request_id)
            self.metrics.requests.labels(finished_reason=FINISH_CANCELLED).inc()

    async def events(self) -> AsyncIterator[tuple[str, str | None]]:
        """(new text, finish reason or None) pairs until the request ends; cancels it if abandoned."""
        inbox = self._inbox
        done = False
        try:
            while True:
                kind, (value, at) = await inbox.get()
                if kind == "token":
                    self._observe_token(at)
                    delta = self.text.add(value)
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
            self.metrics.ttft.observe(at - self.request.arrival_s)
        else:
            self.metrics.itl.observe(at - self._last_token_s)
        self._last_token_s = at

    def _finish(self, reason: str, at: float) -> None:
        self.finish_reason = reason
        self.metrics.e2e.observe(at - self.request.arrival_s)
        self.metrics.requests.labels(finished_reason=reason).inc()
