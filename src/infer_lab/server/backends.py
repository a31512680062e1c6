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


class OnFinish(Protocol):
    """``on_finish(reason, stop_token_id)``: called once when a request ends.

    ``stop_token_id``: the EOS (or other stop) token that ended it with ``"stop"``, None
    otherwise. It was generated, so it counts in ``usage.completion_tokens`` (as vLLM and
    OpenAI count), but it is not text, so it is never passed to ``on_token``.
    """

    def __call__(self, reason: str, stop_token_id: int | None = None) -> None: ...


class Backend(Protocol):
    """The engine interface of the server. Callbacks may be called from any thread."""

    engine_name: str

    def start(self) -> None:
        """Start background work (threads); called once before the first request."""

    def submit(self, request: GenerationRequest, on_token: OnToken, on_finish: OnFinish) -> None:
        """Queue a request. ``on_token(id)`` per generated token, then exactly one
        ``on_finish(reason, stop_token_id)`` (the EOS that ended it is passed there, not to
        ``on_token``)."""

    def cancel(self, request_id: str) -> None:
        """Stop a request soon and free what it holds; ``on_finish("cancelled")`` follows unless it already finished."""

    def pause(self, request_id: str) -> None:
        """Stop generating for a request soon and free its batch slot and KV memory, keeping its
        tokens and sampling state; no callback follows until :meth:`resume`. The server pauses
        a stream whose client has stopped reading. A no-op once it has finished."""

    def resume(self, request_id: str) -> None:
        """Queue a paused request again; it recomputes its context, then calls back as before.
        A no-op unless it is paused."""

    def stats(self) -> dict[str, float]:
        """Live numbers for ``/metrics``: ``running``, ``waiting``, ``paused`` and, when the engine has them,
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


@dataclass
class _HFJob:
    """A request of the HF backend, with what it has generated (kept while it is paused)."""

    request: GenerationRequest
    on_token: OnToken
    on_finish: OnFinish
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    stop_token_id: int | None = None  # the EOS that ended it


class HFBackend:
    """transformers with a DynamicCache, one request at a time in one worker thread.

    This is what serving looks like without an engine: a second request waits until the first
    has finished completely. It exists so that pain is measurable through the same API. A
    paused request (its client stopped reading) gives the worker up; resumed, it recomputes
    its prompt and what it had generated, with the same sampling generator.
    """

    engine_name = "hf"

    def __init__(self, lm: Any):
        self.lm = lm
        self.eos_ids = eos_token_ids(lm.model, lm.tokenizer)
        self._queue: queue.Queue[_HFJob | None] = queue.Queue()
        self._cancelled: set[str] = set()
        self._pausing: set[str] = set()  # asked to pause: the worker parks them at the next token
        self._paused: dict[str, _HFJob] = {}
        self._live: set[str] = set()  # submitted, not finished: what cancel and pause may name
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
        with self._lock:
            self._live.add(request.request_id)
        self._queue.put(_HFJob(request, on_token, on_finish))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            parked = self._paused.pop(request_id, None)
            self._pausing.discard(request_id)
            if parked is None and request_id in self._live:
                self._cancelled.add(request_id)
        if parked is not None:  # the worker no longer holds it: finish it here
            self._finish(parked, FINISH_CANCELLED)

    def pause(self, request_id: str) -> None:
        """The worker parks the request before its next token (it holds no cache while parked)."""
        with self._lock:
            if request_id in self._live and request_id not in self._paused:
                self._pausing.add(request_id)

    def resume(self, request_id: str) -> None:
        """A parked request joins the back of the queue; it recomputes its context when its turn comes."""
        with self._lock:
            self._pausing.discard(request_id)
            parked = self._paused.pop(request_id, None)
            if parked is not None:
                self._queue.put(parked)

    def stats(self) -> dict[str, float]:
        return {
            "running": 1.0 if self._running_id else 0.0,
            "waiting": float(self._queue.qsize()),
            "paused": float(len(self._paused)),
        }

    def info(self) -> dict[str, Any]:
        import transformers  # defers transformers

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
            parked, self._paused = list(self._paused.values()), {}
        for job in parked:
            self._finish(job, FINISH_CANCELLED)
        while True:  # requests that never started are cancelled, not run
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._finish(item, FINISH_CANCELLED)
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _is_cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled

    def _finish(self, job: _HFJob, reason: str) -> None:
        rid = job.request.request_id
        with self._lock:
            self._live.discard(rid)
            self._cancelled.discard(rid)
            self._pausing.discard(rid)
        key = reason if not reason.startswith("error") else "error"
        self.finished_counts[key] = self.finished_counts.get(key, 0) + 1
        job.on_finish(reason, job.stop_token_id)

    def _park_if_asked(self, job: _HFJob) -> bool:
        """True (and the job parked) when a pause was asked for; atomic with :meth:`resume`."""
        rid = job.request.request_id
        with self._lock:
            if rid not in self._pausing:
                return False
            self._pausing.discard(rid)
            self._paused[rid] = job
            return True

    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            rid = job.request.request_id
            if self._is_cancelled(rid):
                self._finish(job, FINISH_CANCELLED)
                continue
            self._running_id = rid
            try:
                reason = self._generate(job)
            except Exception as exc:  # one broken request must not kill the server
                reason = f"error: {type(exc).__name__}: {exc}"
            finally:
                self._running_id = None
            if reason is not None:  # None: parked, finished later by resume or cancel
                self._finish(job, reason)

    @torch.inference_mode()
    def _generate(self, job: _HFJob) -> str | None:
        """Generate until a stop; None when the job was parked (paused) on the way."""
        from transformers import DynamicCache  # defers transformers

        request = job.request
        model, params = self.lm.model, request.params
        if job.generator is None:
            job.generator = make_generator(params.seed)
        cache_kwarg = {self._cache_arg: DynamicCache(config=model.config)}
        # A resumed job recomputes its prompt and what it generated before, in one pass.
        ids = torch.tensor([request.prompt_ids + job.generated], device=self.lm.device)
        for _ in range(params.max_tokens - len(job.generated)):
            if self._is_cancelled(request.request_id):
                return FINISH_CANCELLED
            if self._park_if_asked(job):
                return None
            logits = model(ids, use_cache=True, logits_to_keep=1, **cache_kwarg).logits[0, -1]
            token = sample_next_token(logits.cpu(), params, job.generator)
            if token in self.eos_ids and not params.ignore_eos:
                job.stop_token_id = token
                return FINISH_STOP
            job.generated.append(token)
            job.on_token(token)
            ids = torch.tensor([[token]], device=self.lm.device)
        return FINISH_LENGTH
