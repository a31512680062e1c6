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

A client must not hold what others need, so the work a request may cost is bounded:

- connections that never finish their headers or body are closed (:mod:`.guard`);
- a prompt whose byte length already proves it cannot fit is refused before tokenizing
  (no token of the vocabulary is longer than its longest piece, :func:`longest_token_bytes`),
  and at most ``tokenizer_queue`` prompts wait for the tokenizer (503 past that);
- at most ``max_queued`` requests wait for an engine slot (503 with ``Retry-After`` past
  that), and a request that gets no first token within ``queue_timeout_s`` gets a 503 too;
- a streaming client that stops reading holds no batch slot and no KV memory: once
  ``stream_buffer_tokens`` tokens wait for it (the connection takes no more bytes, see
  :mod:`.guard`), its request is paused (preempted: slot and blocks go back) and resumes, after
  a recompute, when the client has read what was waiting. So a slow reader is paced, never
  cancelled, and a non-reader costs nobody else anything; one that reads nothing for
  ``send_timeout_s`` has its connection closed and its request cancelled (``client_too_slow``);
- past the shutdown timeout, streams end with an error event and the others get a 503 body.

Parameters the server does not implement (``tools``, ``response_format``, ``echo``, ...) and
unknown ones are refused with a 400 that names them, never accepted and ignored; the sampling
parameters it does not implement are accepted only at the value that changes nothing
(``repetition_penalty`` 1.0, ``top_k`` 0 or -1, ...: :data:`.schemas.NEUTRAL_ONLY`), as
``vllm bench serve`` sends them.

``usage.completion_tokens`` counts every generated token, including the EOS (or other stop
token) that ended the answer, which is not sent as text, and, when a stop string ended it, the
tokens up to the one that completed the stop string: as vLLM 0.32 and OpenAI count. With
``return_token_ids`` (vLLM's extension) the response carries those ids (``token_ids``) and the
prompt's (``prompt_token_ids``), in the places vLLM 0.32 puts them.

With an API key, ``/v1/*``, ``/version`` and ``/openapi.json`` (it names the model, maybe a
local path) need ``Authorization: Bearer <key>``; ``/health`` is always open, and
``/metrics`` is open unless ``protect_metrics`` (as in vLLM: a Prometheus scraper usually
sends no key).
"""

import asyncio
import functools
import hmac
import json
import logging
import math
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pydantic_core
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .. import __version__
from .backends import FINISH_CANCELLED, Backend, GenerationRequest, SamplingParams
from .logprobs import chat_logprobs, completion_logprobs, score_tokens
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

logger = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 2 * 2**20  # 2 MiB: far more text than any context holds


@dataclass
class ServerConfig:
    """Settings of one server. ``max_model_len`` is prompt + answer tokens, at most.

    ``vocab_size``: token ids in a prompt must be in ``[0, vocab_size)`` (default: the
    tokenizer's size). ``max_body_bytes``: larger request bodies get a 413.
    ``protect_metrics``: ``/metrics`` needs the API key too. ``tokenizer_threads``: threads
    that tokenize and apply the chat template, off the event loop; ``tokenizer_queue``: prompts
    that may wait for them (more get a 503). ``max_queued``: requests that may wait for an
    engine slot (more get a 503 with ``Retry-After``); ``queue_timeout_s``: seconds a request
    may wait for its first token. ``stream_buffer_tokens``: tokens a stream may hold for a
    client whose connection takes no more bytes before its request is paused (its batch slot
    and KV blocks freed until the client has read them). ``send_timeout_s``: seconds a
    response may wait for a client that accepts no byte before its connection is closed (a
    paused stream is then cancelled). ``header_timeout_s``, ``body_timeout_s``,
    ``max_connections``: see :mod:`.guard`.
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
    tokenizer_queue: int = 256
    vocab_size: int | None = None
    max_queued: int = 512
    queue_timeout_s: float = 300.0
    stream_buffer_tokens: int = 16
    retry_after_s: int = 1
    send_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int | None = None

    def __post_init__(self) -> None:
        for name in ("tokenizer_threads", "tokenizer_queue", "stream_buffer_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queued < 0:
            raise ValueError(f"max_queued must be >= 0, got {self.max_queued}")
        for name in ("queue_timeout_s", "header_timeout_s", "body_timeout_s", "send_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


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
        self.status, self.message, self.type, self.param = status, message, type_, param
        self.code = code or _DEFAULT_CODES.get(status, "error")
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


# error.code is always a string, as OpenAI's (clients switch on it).
_DEFAULT_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
    415: "unsupported_media_type",
    500: "internal_error",
    503: "server_overloaded",
}
OVERLOADED = 503

_ERRORS = {
    status: {"model": ErrorResponse, "description": why}
    for status, why in (
        (400, "invalid request (bad field, context too long, lone surrogate, ...)"),
        (401, "missing or wrong API key (when the server has one)"),
        (404, "unknown model"),
        (413, "request body over the server's limit"),
        (415, "Content-Type is not application/json"),
        (500, "generation failed"),
        (503, "overloaded (queue full, tokenizer busy, no slot in time) or shutting down; "
         "see Retry-After"),
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


def longest_token_bytes(tokenizer: Any) -> int | None:
    """Bytes of the vocabulary's longest piece, as UTF-8: no token covers more text than that.

    So a text of ``b`` bytes is at least ``ceil(b / longest)`` tokens, and a prompt too long
    for the context can be refused from its length alone, before tokenizing. The pieces'
    UTF-8 length is an upper bound of the bytes they decode to (byte-level BPE writes a byte
    as a 1-2 byte character, SentencePiece a space as U+2581, 3 bytes). None when the
    tokenizer has no vocabulary to read, or normalizes text (a normalizer may shorten it).
    """
    try:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and backend.normalizer is not None:
            return None
        vocab = tokenizer.get_vocab()
        added = getattr(tokenizer, "get_added_vocab", dict)()
        return max(len(piece.encode("utf-8")) for piece in [*vocab, *added]) or None
    except Exception:  # no vocabulary to read: tokenize everything (still off the loop)
        return None


def create_app(backend: Backend, tokenizer: Any, config: ServerConfig) -> FastAPI:
    """An OpenAI-compatible app serving ``backend``; the backend starts and stops with the app."""
    metrics = ServerMetrics(backend.stats)
    CompletionRequest, ChatCompletionRequest = request_models(
        config.model_name, config.max_model_len, config.vocab_size or len(tokenizer)
    )
    longest = longest_token_bytes(tokenizer)
    runs: set[_Run] = set()  # in flight, so a shutdown past its timeout can end them
    tokenizing = [0]  # prompts in or waiting for the tokenizer pool

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
    app.router.route_class = _FastJSONRoute
    app.state.backend, app.state.metrics, app.state.config = backend, metrics, config
    app.state.draining = False
    metrics.add_live(
        lambda: {
            "queue_limit": float(config.max_queued),
            "tokenizer_queue": float(tokenizing[0]),
            "tokenizer_queue_limit": float(config.tokenizer_queue),
        }
    )
    _install_error_handlers(app, metrics)
    app.add_middleware(_Gate, config=config, metrics=metrics)
    app.openapi = functools.partial(_openapi, app, config)

    def begin_shutdown(timeout_s: float) -> None:
        """Called on the event loop when the server starts stopping: in ``timeout_s`` seconds,
        whatever still runs is ended with an error the client can read (not a bare 500)."""
        if app.state.draining:
            return
        app.state.draining = True

        def stop_the_rest() -> None:
            for run in list(runs):
                run.stop_for_shutdown()

        asyncio.get_running_loop().call_later(max(0.0, timeout_s), stop_the_rest)

    app.state.begin_shutdown = begin_shutdown

    def overloaded(reason: str, message: str) -> APIError:
        metrics.rejected.labels(reason=reason).inc()
        return APIError(
            OVERLOADED,
            message,
            "server_error",
            code=reason,
            headers={"Retry-After": str(config.retry_after_s)},
        )

    async def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if tokenizing[0] >= config.tokenizer_queue:
            raise overloaded(
                "tokenizer_busy",
                f"{tokenizing[0]} prompts are already waiting for the tokenizer "
                f"(limit {config.tokenizer_queue}); retry later",
            )
        tokenizing[0] += 1
        try:
            pool = app.state.tokenizer_pool
            return await asyncio.get_running_loop().run_in_executor(
                pool, functools.partial(fn, *args, **kwargs)
            )
        finally:
            tokenizing[0] -= 1

    def refuse_if_it_cannot_fit(n_bytes: int, param: str) -> None:
        if longest is None:
            return
        at_least = math.ceil(n_bytes / longest)
        if at_least >= config.max_model_len:
            raise APIError(
                400,
                f"the prompt is {n_bytes} bytes, so at least {at_least} tokens (no token of "
                f"this model covers more than {longest} bytes), over this model's context "
                f"limit of {config.max_model_len} tokens (prompt + answer)",
                param=param,
                code="context_length_exceeded",
            )

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        return {"status": "ok"}

    @app.get("/version", responses={401: _ERRORS[401]})
    async def version():
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
            refuse_if_it_cannot_fit(len(text.encode("utf-8")), "prompt")
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
        refuse_if_it_cannot_fit(sum(len(m["content"].encode("utf-8")) for m in messages), "messages")
        try:
            ids = await off_loop(_apply_chat_template, tokenizer, messages)
        except APIError:
            raise
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
            raise APIError(400, "the prompt is empty once tokenized: the model's tokenizer maps its text to no "
                           "token, so there is nothing to continue from", param="prompt")
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
        try:
            top_k = body.top_logprobs_wanted()
        except ValueError as exc:
            raise APIError(400, f"invalid request: {exc}", param="top_logprobs") from None
        if top_k is not None and body.stream:
            raise APIError(
                400,
                "logprobs with stream=true is not implemented: ask without streaming",
                param="logprobs",
                code="unsupported_parameter",
            )
        if top_k is not None and getattr(getattr(backend, "lm", None), "model", None) is None:
            raise APIError(400, "this backend cannot compute logprobs", param="logprobs",
                           code="unsupported_parameter")
        if app.state.draining:
            raise APIError(
                OVERLOADED, "the server is shutting down", "server_error",
                code="server_shutting_down",
            )
        waiting = backend.stats().get("waiting", 0.0)
        if waiting >= config.max_queued:
            raise overloaded(
                "queue_full",
                f"{int(waiting)} requests already wait for a slot (limit {config.max_queued}); "
                f"retry in {config.retry_after_s} s",
            )
        temperature, top_p = body.sampling()
        received_s = getattr(request.state, "received_s", None) or time.perf_counter()
        n = body.n

        def new_run(i: int) -> _Run:
            seed = body.seed
            if seed is not None and i:  # each choice its own sample, still reproducible
                seed = seed + i if seed + i <= SEED_MAX else seed - i
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                ignore_eos=body.ignore_eos,
            )
            run = _Run(
                backend, metrics, tokenizer, prompt_ids, params, body.stop_strings(), received_s,
                stream_buffer=config.stream_buffer_tokens if body.stream else None,
            )
            run.submit()
            runs.add(run)
            return run

        started: list[_Run] = []
        try:
            # The first choice alone first: once its prompt is in the KV cache, an engine with a
            # prefix cache gives the other n - 1 the same blocks instead of computing them again.
            started.append(new_run(0))
            await _wait_started(request, started[:1])
            started += [new_run(i) for i in range(1, n)]
            await _wait_started(request, started[1:])
            return await _respond(request, body, started, chat, top_k)
        except BaseException:
            for run in started:
                run.abandon()
                runs.discard(run)
            raise

    async def _logprobs(run: "_Run", chat: bool, top_k: int | None) -> dict[str, Any] | None:
        if top_k is None:
            return None
        lm = backend.lm  # type: ignore[attr-defined]
        answer = run.token_ids  # the EOS that ended it too: as many entries as usage counts
        scores = await off_loop(
            score_tokens, lm.model, run.request.prompt_ids, answer, top_k, lm.device
        )
        if chat:
            return chat_logprobs(tokenizer, answer, scores)
        return completion_logprobs(tokenizer, answer, scores, top_k)

    async def _wait_started(request: Request, group: list["_Run"]) -> None:
        """Wait for each run's first token; a 503 if one gets none within the queue timeout."""
        if not group:
            return
        deadline = time.monotonic() + config.queue_timeout_s
        watcher = asyncio.create_task(_cancel_when_disconnected(request, group))
        try:
            for run in group:
                if not await run.wait_for_first_event(max(0.0, deadline - time.monotonic())):
                    run.abandon("queue_timeout")
                    raise overloaded(
                        "queue_timeout",
                        f"no engine slot freed within {config.queue_timeout_s:g} s "
                        "(infer-lab serve --queue-timeout); retry later",
                    )
        finally:
            watcher.cancel()

    async def _respond(
        request: Request, body: Any, group: list["_Run"], chat: bool, top_k: int | None
    ):
        first = group[0]
        meta = {
            "id": ("chatcmpl-" if chat else "cmpl-") + first.request.request_id,
            "created": int(time.time()),
            "model": config.model_name,
        }
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)

            def finished() -> None:
                for run in group:
                    run.abandon()
                    runs.discard(run)

            return StreamingResponse(
                _sse(group, meta, chat, include_usage, request.is_disconnected,
                     return_token_ids=bool(body.return_token_ids)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                # Runs after the stream ends or the client leaves, even before the first chunk.
                background=BackgroundTask(finished),
            )
        texts: dict[int, list[str]] = {i: [] for i in range(len(group))}
        watcher = asyncio.create_task(_cancel_when_disconnected(request, group))
        try:
            async for i, delta, _finish, _ids in _merged_events(group):
                texts[i].append(delta)
        finally:
            watcher.cancel()
            for run in group:
                runs.discard(run)
        if any(run.shut_down for run in group):
            raise APIError(
                OVERLOADED,
                "the server shut down before this answer was finished "
                "(infer-lab serve --shutdown-timeout)",
                "server_error",
                code="server_shutting_down",
            )
        failed = next((run.error for run in group if run.error), None)
        if failed:
            raise APIError(500, f"generation failed: {failed}", "server_error")
        choices = []
        for i, run in enumerate(group):
            text = "".join(texts[i])
            choice: dict[str, Any] = {"index": i, "finish_reason": run.finish_reason,
                                      "logprobs": await _logprobs(run, chat, top_k)}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            if body.return_token_ids:  # vLLM's fields: the prompt's per choice in completions
                if not chat:
                    choice["prompt_token_ids"] = list(run.request.prompt_ids)
                choice["token_ids"] = run.token_ids
            choices.append(choice)
        response = {
            **meta,
            "object": "chat.completion" if chat else "text_completion",
            "choices": choices,
            "usage": _usage(group),
            "server_timing": first.timing(),
        }
        if body.return_token_ids and chat:  # ... and once, at the top, in chat
            response["prompt_token_ids"] = list(first.request.prompt_ids)
        return response

    return app


def _usage(group: list["_Run"]) -> dict[str, int]:
    """The prompt counted once (as OpenAI does for n > 1), the completions summed."""
    prompt = len(group[0].request.prompt_ids)
    completion = sum(run.completion_tokens for run in group)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


async def _merged_events(
    group: list["_Run"],
) -> AsyncIterator[tuple[int, str, str | None, list[int]]]:
    """(choice index, new text, finish or None, new token ids) of all runs, in arrival order,
    until all end."""
    if len(group) == 1:
        async for delta, finish, ids in group[0].events():
            yield 0, delta, finish, ids
            if finish:
                return
        return
    # Bounded: a pump waits while the client is not reading, so its run's own queue fills and
    # the run is paused (an unbounded queue here would hide a non-reader from its runs).
    merged: asyncio.Queue[tuple[int, str, str | None, list[int]] | None] = asyncio.Queue(maxsize=1)

    async def pump(i: int, run: "_Run") -> None:
        try:
            async for delta, finish, ids in run.events():
                await merged.put((i, delta, finish, ids))
                if finish:
                    return
        finally:
            await merged.put(None)

    tasks = [asyncio.create_task(pump(i, run)) for i, run in enumerate(group)]
    try:
        ended = 0
        while ended < len(group):
            item = await merged.get()
            if item is None:
                ended += 1
                continue
            yield item
    finally:
        for task in tasks:
            task.cancel()  # a pump cancelled mid-stream abandons its run (events' finally)


class _FastJSONRequest(Request):
    """A request whose JSON body is parsed by pydantic's Rust parser (jiter): about half the
    time of ``json.loads`` on a 1.8 MB body, time during which the event loop serves nobody.
    A body it refuses (invalid JSON, lone surrogates, UTF-16) goes to ``json.loads``, so the
    errors and the accepted inputs stay exactly what they were."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body, cache_strings="keys")
            except ValueError:
                self._json = json.loads(body)
        return self._json


class _FastJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def with_fast_json(request: Request) -> Any:
            return await handler(_FastJSONRequest(request.scope, request.receive))

        return with_fast_json


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
        if isinstance(exc.__cause__, ClientDisconnect):
            # The client hung up (or was timed out) before its body was in: no client error
            # to count, and nobody to answer.
            metrics.client_gone.labels(stage="body").inc()
            return JSONResponse(status_code=400, content={})
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
    with warnings.catch_warnings():  # GET and HEAD /health share one function, so one id
        warnings.filterwarnings("ignore", message="Duplicate Operation ID")
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=__doc__.split("\n\n")[0],
            routes=app.routes,
        )
    for path, item in schema.get("paths", {}).items():
        item.pop("head", None)  # HEAD is GET without a body: nothing more to document
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
        or path in ("/version", "/openapi.json")
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
    group: list["_Run"],
    meta: dict[str, Any],
    chat: bool,
    include_usage: bool,
    client_gone: Callable[[], Awaitable[bool]],
    return_token_ids: bool = False,
) -> AsyncIterator[str]:
    """SSE lines of one streamed request (n choices, each chunk names its index).
    Cancellation (client gone) cancels every engine request of it.

    ``client_gone``: true once the client has disconnected (asked only while a run is paused:
    a chunk "sent" to a closed connection must not resume it). ``return_token_ids``: as vLLM,
    each chunk's choice has the ``token_ids`` it adds (a token that completes no text yet gets
    a chunk with empty text), and the prompt's ids come once: ``prompt_token_ids`` in the first
    chunk of each choice (completions) or of the role chunks (chat)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    prompt_ids_sent: set[int] = set()

    def chunk(
        i: int, delta: str | None, finish: str | None, ids: list[int], first: bool = False
    ) -> str:
        if chat:
            d: dict[str, Any] = (
                {"role": "assistant", "content": delta or ""}
                if first
                else ({"content": delta} if delta else {})
            )
            choice = {"index": i, "delta": d, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": i, "text": delta or "", "finish_reason": finish, "logprobs": None}
        payload = {**meta, "object": obj, "choices": [choice]}
        if return_token_ids:
            if i not in prompt_ids_sent:
                prompt_ids_sent.add(i)
                where = payload if chat else choice  # where vLLM 0.32 puts them
                where["prompt_token_ids"] = list(group[i].request.prompt_ids)
            if not first:
                choice["token_ids"] = ids
        if include_usage:
            payload["usage"] = None
        return f"data: {json.dumps(payload)}\n\n"

    def error_event(message: str, code: str) -> str:
        err = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
        return f"data: {json.dumps(err)}\n\n"

    if chat:
        for i in range(len(group)):
            yield chunk(i, "", None, [], first=True)
    failed = False
    async for i, delta, finish, ids in _merged_events(group):
        run = group[i]
        problem = None
        if run.shut_down:
            problem = (
                "the server shut down before this answer was finished "
                "(infer-lab serve --shutdown-timeout)",
                "server_shutting_down",
            )
        elif run.error:
            problem = (f"generation failed: {run.error}", "internal_error")
        if problem is not None:
            if delta:
                yield chunk(i, delta, None, ids)
            yield error_event(*problem)
            failed = True
            break
        if delta or finish or (return_token_ids and ids):
            yield chunk(i, delta, finish, ids)
            # Asking for the next event resumes a paused run: not if the send that just
            # returned did so because the connection is gone (closed by the send timeout).
            if any(r.paused for r in group) and await client_gone():
                return
    if include_usage and not failed:
        last = {**meta, "object": obj, "choices": [], "usage": _usage(group)}
        last["server_timing"] = group[0].timing()
        yield f"data: {json.dumps(last)}\n\n"
    yield "data: [DONE]\n\n"


async def _cancel_when_disconnected(
    request: Request, group: list["_Run"], poll_s: float = 0.25
) -> None:
    """A client that hangs up before its answer gets its requests cancelled, not computed in vain."""
    while any(run.finish_reason is None for run in group):
        if await request.is_disconnected():
            for run in group:
                run.abandon()
            return
        await asyncio.sleep(poll_s)


CLIENT_TOO_SLOW = "client_too_slow"  # finish reason of a paused stream whose client then left


class _Run:
    """One request in flight: submits to the backend and turns its callbacks into (text, finish) events.

    ``stream_buffer``: for a stream, the tokens that may wait for a client that is not reading
    (its connection takes no more bytes, so the response cannot be written) before the request
    is paused: the backend frees its batch slot and KV memory. It resumes when the client has
    read what was waiting, so a slow reader is paced by its own reading and nobody else waits
    for it. Paused, it ends only when its client leaves (or is closed for reading nothing for
    the server's send timeout): then it counts as ``client_too_slow``.
    """

    def __init__(
        self,
        backend: Backend,
        metrics: ServerMetrics,
        tokenizer: Any,
        prompt_ids: list[int],
        params: SamplingParams,
        stop: list[str],
        received_s: float,
        stream_buffer: int | None = None,
    ):
        self.backend, self.metrics = backend, metrics
        self.request = GenerationRequest(uuid.uuid4().hex[:24], prompt_ids, params)
        self.received_s = received_s
        self.text = TextStream(tokenizer, stop)
        self.stream_buffer = stream_buffer
        self.completion_tokens = 0  # generated tokens, the EOS that ended the answer included
        self.stop_token_id: int | None = None  # that EOS (or other stop token), once it came
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.paused = False  # out of the batch until its client reads what waits for it
        self.shut_down = False  # ended by a shutdown past its timeout
        self._first_token_s: float | None = None
        self._last_token_s: float | None = None
        self._finished_s: float | None = None
        self._abandoned = False
        self._pending: list[tuple[str, tuple[Any, float]]] = []
        self._ids_given = 0  # token ids already handed out by events()

    @property
    def token_ids(self) -> list[int]:
        """The generated ids so far, as vLLM returns them: those of the text, then the EOS that
        ended the answer (if one did). After a stop string: up to the token that completed it."""
        stop = [] if self.stop_token_id is None else [self.stop_token_id]
        return self.text.token_ids + stop

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
        put = self._put

        def on_token(token_id: int) -> None:
            loop.call_soon_threadsafe(put, ("token", (token_id, time.perf_counter())))

        def on_finish(reason: str, stop_token_id: int | None = None) -> None:
            at = time.perf_counter()
            loop.call_soon_threadsafe(put, ("finish", ((reason, stop_token_id), at)))

        self.backend.submit(self.request, on_token, on_finish)
        self.metrics.prompt_tokens.inc(len(self.request.prompt_ids))
        self.metrics.preprocess.observe(self.request.arrival_s - self.received_s)

    def _put(self, item: tuple[str, Any]) -> None:
        """On the event loop: queue an event; pause a stream whose client stopped reading."""
        self._inbox.put_nowait(item)
        if (
            self.stream_buffer is not None
            and not self.paused
            and not self._abandoned
            and item[0] == "token"
            and self._inbox.qsize() >= self.stream_buffer
        ):
            # Nobody takes the tokens out: the response cannot be written because the client
            # takes no more bytes. Generating on would only hold a slot and KV blocks.
            self.paused = True
            self.backend.pause(self.request.request_id)  # only queues a command: never blocks
            self.metrics.stream_pauses.inc()
            logger.debug(
                "request %s paused: its client read nothing while %d tokens waited "
                "(%d generated)", self.request.request_id, self._inbox.qsize(),
                self.completion_tokens + self._inbox.qsize(),
            )

    def _resume_if_paused(self) -> None:
        """Called when everything that waited for the client has been handed to the connection."""
        if self.paused and not self._abandoned and self.finish_reason is None:
            self.paused = False
            self.backend.resume(self.request.request_id)

    def abandon(self, reason: str | None = None) -> None:
        """Cancel the backend request if it has not finished (the client is gone, or waited too
        long); else do nothing. Counted once, under ``reason``: by default ``client_too_slow``
        for a stream paused because its client stopped reading, else ``cancelled``."""
        if self.finish_reason is None and not self._abandoned:
            if reason is None:
                reason = CLIENT_TOO_SLOW if self.paused else FINISH_CANCELLED
            self._abandoned = True
            self.backend.cancel(self.request.request_id)  # only queues a command: never blocks
            self.metrics.requests.labels(finished_reason=reason).inc()
            if reason == CLIENT_TOO_SLOW:
                logger.info(
                    "request %s cancelled (client_too_slow): its client stopped reading, then "
                    "left or was closed for reading nothing; %d tokens generated, %d never sent",
                    self.request.request_id, self.completion_tokens + self._inbox.qsize(),
                    self._inbox.qsize(),
                )

    def stop_for_shutdown(self) -> None:
        """The shutdown timeout has passed: cancel, and end the response with an error."""
        if self.finish_reason is None:
            self.shut_down = True
            self.abandon("shutdown")
            self._inbox.put_nowait(("shutdown", (None, time.perf_counter())))

    async def wait_for_first_event(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the first token (or the end); False if none came."""
        if self._pending:
            return True
        try:
            item = await asyncio.wait_for(self._inbox.get(), timeout_s)
        except TimeoutError:
            return False
        self._pending.append(item)
        return True

    async def events(self) -> AsyncIterator[tuple[str, str | None, list[int]]]:
        """(new text, finish reason or None, new token ids) until the request ends; cancels it if
        abandoned. Each generated id comes once, with the text it completed (maybe none yet)."""
        inbox = self._inbox
        pending = self._pending
        done = False
        try:
            while True:
                if not pending and inbox.empty():
                    self._resume_if_paused()  # the client has taken all that waited: go on
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
                        yield delta, "stop", self._new_ids()
                        return
                    yield delta, None, self._new_ids()
                    continue
                done = True
                if kind == "shutdown" or self.shut_down:
                    self._finish("shutdown", at, count=False)
                    yield "", "error", []
                    return
                reason, stop_token_id = value
                if reason.startswith("error"):
                    self.error = reason
                    self._finish("error", at)
                    yield "", "error", []
                    return
                rest = self.text.flush()
                if stop_token_id is not None and not self.text.stopped:
                    # The EOS that ended the answer was generated: it counts, as vLLM and OpenAI
                    # count it, and its id is returned; it is not text.
                    self.stop_token_id = stop_token_id
                    self._observe_token(at)
                self._finish(reason, at, count=not self._abandoned)
                yield rest, reason, self._new_ids()
                return
        finally:
            if (
                not done
            ):  # the client went away (or shutdown cancelled us): free the engine's resources
                self.abandon()

    def _new_ids(self) -> list[int]:
        """The generated ids not handed out yet by :meth:`events`."""
        ids = self.token_ids
        new, self._ids_given = ids[self._ids_given :], len(ids)
        return new

    def _observe_token(self, at: float) -> None:
        self.completion_tokens += 1
        self.metrics.generation_tokens.inc()
        if self._last_token_s is None:
            self._first_token_s = at
            self.metrics.ttft.observe(at - self.request.arrival_s)
        else:
            self.metrics.itl.observe(at - self._last_token_s)
        self._last_token_s = at

    def _finish(self, reason: str, at: float, count: bool = True) -> None:
        self.finish_reason = reason
        self.paused = False  # a pause that came too late: the request had finished
        self._finished_s = at
        self.metrics.e2e.observe(at - self.request.arrival_s)
        if count:  # an abandoned request was counted when it was abandoned
            self.metrics.requests.labels(finished_reason=reason).inc()
