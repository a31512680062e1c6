"""What the HTTP server needs from an engine, and the one-request-at-a-time HF baseline.

A backend takes token ids and sampling parameters and calls back with each new token from
its own thread(s); the server turns those calls into text, SSE chunks and metrics. Two
backends implement it: :class:`HFBackend` (transformers, strictly one request at a time: the
"naive serving" baseline) and :class:`~infer_lab.server.ours.OursBackend` (the from-scratch
engine with paged KV, continuous batching and prefix caching).
"""

from __future__ import annotations

import inspect
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

# Finish reasons a backend reports: OpenAI's "stop" (end-of-sequence token) and "length"
# (max_tokens reached), plus "cancelled" (the server asked) and "error: <message>".
FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED = "stop", "length", "cancelled"


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. ``temperature == 0`` is greedy; ``seed`` makes sampling reproducible."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False


@dataclass
class GenerationRequest:
    """One request as a backend sees it: ids only, no text."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival_s: float = field(default_factory=time.perf_counter)


OnToken = Callable[[int], None]
OnFinish = Callable[[str], None]


class Backend(Protocol):
    """The engine interface of the server. Callbacks may be called from any thread."""

    engine_name: str

    def start(self) -> None:
        """Start background work (threads); called once before the first request."""

    def submit(self, request: GenerationRequest, on_token: OnToken, on_finish: OnFinish) -> None:
        """Queue a request. ``on_token(id)`` per generated token, then exactly one ``on_finish(reason)``."""

    def cancel(self, request_id: str) -> None:
        """Stop a request soon and free what it holds; ``on_finish("cancelled")`` follows unless it already finished."""

    def stats(self) -> dict[str, float]:
        """Live numbers for ``/metrics``: ``running``, ``waiting`` and, when the engine has them,
        ``kv_blocks_used``, ``kv_blocks_used_peak`` (most in use at once since the engine started),
        ``kv_blocks_total``, ``prefix_cache_hits``, ``prefix_cache_queries`` (tokens)."""

    def info(self) -> dict[str, Any]:
        """Engine name, version and settings, for ``/version`` and results files."""

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Cancel what is still running and stop the background threads."""


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """End-of-sequence ids from the generation config and the tokenizer (chat models often have two)."""
    ids: set[int] = set()
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen, getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """Pick the next token from ``logits`` (vocab,): greedy at temperature 0, else temperature + top-p."""
    if params.temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest set of tokens whose mass reaches top_p (the first token always stays).
        outside = sorted_probs.cumsum(0) - sorted_probs >= params.top_p
        sorted_probs[outside] = 0.0
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded by the request (or randomly when it gave no seed)."""
    return torch.Generator().manual_seed(
        seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    )


class HFBackend:
    """transformers with a DynamicCache, one request at a time in one worker thread.

    This is what serving looks like without an engine: a second request waits until the first
    has finished completely. It exists so that pain is measurable through the same API.
    """

    engine_name = "hf"

    def __init__(self, lm: Any):
        self.lm = lm
        self.eos_ids = eos_token_ids(lm.model, lm.tokenizer)
        self._queue: queue.Queue[tuple[GenerationRequest, OnToken, OnFinish] | None] = queue.Queue()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._running_id: str | None = None
        self._thread: threading.Thread | None = None
        self.finished_counts: dict[str, int] = {}
        # transformers renamed ``past_key_values`` to ``cache``; use whichever this version has.
        forward_args = inspect.signature(type(lm.model).forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._worker, name="hf-backend", daemon=True)
            self._thread.start()

    def submit(self, request: GenerationRequest, on_token: OnToken, on_finish: OnFinish) -> None:
        self._queue.put((request, on_token, on_finish))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._cancelled.add(request_id)

    def stats(self) -> dict[str, float]:
        return {"running": 1.0 if self._running_id else 0.0, "waiting": float(self._queue.qsize())}

    def info(self) -> dict[str, Any]:
        import transformers

        return {
            "engine": "hf",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "model": self.lm.name,
            "device": self.lm.describe(),
            "scheduling": "one request at a time",
        }

    def shutdown(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            if self._running_id:
                self._cancelled.add(self._running_id)
        while True:  # requests that never started are cancelled, not run
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._finish(item[2], FINISH_CANCELLED)
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _is_cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled

    def _finish(self, on_finish: OnFinish, reason: str) -> None:
        key = reason if not reason.startswith("error") else "error"
        self.finished_counts[key] = self.finished_counts.get(key, 0) + 1
        on_finish(reason)

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, on_token, on_finish = item
            if self._is_cancelled(request.request_id):
                self._finish(on_finish, FINISH_CANCELLED)
                continue
            self._running_id = request.request_id
            try:
                reason = self._generate(request, on_token)
            except Exception as exc:  # one broken request must not kill the server
                reason = f"error: {type(exc).__name__}: {exc}"
            finally:
                self._running_id = None
                with self._lock:
                    self._cancelled.discard(request.request_id)
            self._finish(on_finish, reason)

    @torch.inference_mode()
    def _generate(self, request: GenerationRequest, on_token: OnToken) -> str:
        from transformers import DynamicCache

        model, params = self.lm.model, request.params
        generator = make_generator(params.seed)
        cache_kwarg = {self._cache_arg: DynamicCache(config=model.config)}
        ids = torch.tensor([request.prompt_ids], device=self.lm.device)
        for _ in range(params.max_tokens):
            if self._is_cancelled(request.request_id):
                return FINISH_CANCELLED
            logits = model(ids, use_cache=True, logits_to_keep=1, **cache_kwarg).logits[0, -1]
            token = sample_next_token(logits.cpu(), params, generator)
            if token in self.eos_ids and not params.ignore_eos:
                return FINISH_STOP
            on_token(token)
            ids = torch.tensor([[token]], device=self.lm.device)
        return FINISH_LENGTH
