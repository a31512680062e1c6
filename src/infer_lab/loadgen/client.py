"""One streaming call to an OpenAI-compatible server, timed chunk by chunk (httpx, async).

Times are wall-clock seconds from ``time.perf_counter``. TTFT is measured to the first chunk
that carries text; inter-token gaps are the times between text-carrying chunks. Token counts
come from the server's ``usage`` (we ask for it with ``stream_options.include_usage``); only
when a server sends no usage do we fall back, to ``max_tokens`` when it stopped for length and
else to counting chunks, and the record says which.

Two clocks: ours starts when the request is sent; a server's starts when its engine gets the
request, after parsing and tokenizing. When the server reports its own clock (infer-lab's
``server_timing`` in the last chunk) the record keeps both, so the gap is visible.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


@dataclass
class RequestRecord:
    """What happened to one request. Times in seconds; ``ok`` False means it failed (see ``error``)."""

    session_id: str
    turn: int
    start_s: float  # perf_counter at send
    ok: bool = False
    error: str | None = None
    status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)  # perf_counter of each text chunk
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: str = "none"  # "usage" (from the server) | "max_tokens" or "chunks" (fallbacks) | "none"
    finish_reason: str | None = None
    text: str = ""
    server_ttft_s: float | None = None  # the server's own TTFT (from its engine's arrival)
    server_preprocess_s: float | None = None  # server: first byte -> engine (parse, tokenize)

    @property
    def ttft_gap_s(self) -> float | None:
        """Our TTFT minus the server's: network, parsing, tokenizing, anything before its clock."""
        if self.ttft_s is None or self.server_ttft_s is None:
            return None
        return self.ttft_s - self.server_ttft_s

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive text chunks (seconds)."""
        t = self.chunk_times_s
        return [b - a for a, b in zip(t[:-1], t[1:], strict=True)]

    @property
    def tpot_s(self) -> float | None:
        """(E2E − TTFT) / (output tokens − 1); None when fewer than 2 tokens or the request failed."""
        if not self.ok or self.completion_tokens is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)

    @property
    def end_s(self) -> float | None:
        return None if self.e2e_s is None else self.start_s + self.e2e_s

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("chunk_times_s")
        d.update(tpot_s=self.tpot_s, ttft_gap_s=self.ttft_gap_s, n_chunks=len(self.chunk_times_s))
        return d


@dataclass
class ClientConfig:
    """How the load generator talks to the server (recorded in full in the results JSON)."""

    base_url: str
    model: str
    endpoint: str = "chat"  # "chat" -> /v1/chat/completions, "completions" -> /v1/completions
    api_key: str | None = None
    timeout_s: float = 120.0  # per request, from send to the last byte
    temperature: float = 0.0
    ignore_eos: bool = False  # vLLM/SGLang/ours extension: always produce max_tokens
    extra_body: dict[str, Any] = field(default_factory=dict)

    def url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/").removesuffix("/v1") + path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _payload(
    cfg: ClientConfig,
    messages: list[dict[str, str]],
    max_tokens: int,
    prompt_ids: list[int] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": cfg.model,
        "max_tokens": max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if prompt_ids is not None:
        if cfg.endpoint != "completions":
            raise ValueError("token-id prompts need the completions endpoint")
        body["prompt"] = prompt_ids
    elif cfg.endpoint == "chat":
        body["messages"] = messages
    else:
        body["prompt"] = "\n".join(m["content"] for m in messages)
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    body.update(cfg.extra_body)
    return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    ch = choices[0]
    if "delta" in ch:
        return (ch.get("delta") or {}).get("content") or ""
    return ch.get("text") or ""


async def stream_request(
    client: httpx.AsyncClient,
    cfg: ClientConfig,
    messages: list[dict[str, str]],
    max_tokens: int,
    session_id: str = "",
    turn: int = 0,
    prompt_ids: list[int] | None = None,
) -> RequestRecord:
    """Send one streaming request and time it. Never raises: failures are recorded on the record.

    The whole request, connection included, is bounded by ``cfg.timeout_s``. ``prompt_ids``
    replaces the messages by a token-id prompt (completions endpoint).
    """
    rec = RequestRecord(session_id=session_id, turn=turn, start_s=time.perf_counter())
    try:
        body = _payload(cfg, messages, max_tokens, prompt_ids)
        await asyncio.wait_for(_stream_into(client, cfg, body, rec), timeout=cfg.timeout_s)
    except asyncio.TimeoutError:
        rec.ok, rec.error = False, f"timeout after {cfg.timeout_s:g} s"
    except httpx.HTTPError as exc:
        rec.ok, rec.error = False, f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:  # a malformed stream must not stop the run
        rec.ok, rec.error = False, f"{type(exc).__name__}: {exc}"[:300]
    return rec


async def _stream_into(
    client: httpx.AsyncClient, cfg: ClientConfig, body: dict[str, Any], rec: RequestRecord
) -> None:
    parts: list[str] = []
    saw_done = False
    asked = body.get("max_tokens")
    async with client.stream("POST", cfg.url(), json=body, headers=cfg.headers()) as resp:
        rec.status = resp.status_code
        if resp.status_code != 200:
            body = (await resp.aread()).decode(errors="replace")
            rec.error = f"HTTP {resp.status_code}: {body[:200]}"
            return
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                saw_done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                rec.error = f"server error in stream: {str(chunk['error'])[:200]}"
                return
            now = time.perf_counter()
            text = _chunk_text(chunk)
            if text:
                if rec.ttft_s is None:
                    rec.ttft_s = now - rec.start_s
                rec.chunk_times_s.append(now)
                parts.append(text)
            for ch in chunk.get("choices") or []:
                if ch.get("finish_reason"):
                    rec.finish_reason = ch["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                rec.prompt_tokens = usage.get("prompt_tokens")
                rec.completion_tokens = usage.get("completion_tokens")
                rec.usage_source = "usage"
            timing = chunk.get("server_timing")
            if isinstance(timing, dict):
                rec.server_ttft_s = timing.get("ttft_s")
                rec.server_preprocess_s = timing.get("preprocess_s")
    rec.e2e_s = time.perf_counter() - rec.start_s
    rec.text = "".join(parts)
    if not saw_done:
        rec.error = "stream ended without data: [DONE]"
        return
    if rec.usage_source != "usage" and rec.finish_reason == "length" and asked:
        # No usage streamed (llama-cpp-python 0.3.36 sends it only unstreamed): "length" means it made
        # max_tokens, while its chunks can be fewer (a token that completes no character sends none).
        rec.completion_tokens, rec.usage_source = asked, "max_tokens"
    elif rec.usage_source != "usage":
        rec.completion_tokens, rec.usage_source = len(rec.chunk_times_s), "chunks"
    if rec.ttft_s is None:  # an empty answer: the first token is the end of the stream
        rec.ttft_s = rec.e2e_s
    rec.ok = True
