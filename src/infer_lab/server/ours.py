"""Adapter from the server's backend interface to the from-scratch engine (:mod:`infer_lab.engine`).

One background thread owns the engine. HTTP handlers never call it: ``submit``, ``cancel``,
``pause`` and ``resume`` only put a command in the thread's inbox, which the thread applies
between two engine steps.
The engine takes its lock for a whole forward pass, so an event loop that waited on that lock
would stall every client for a step or more (many more when cancellations pile up); with the
inbox the loop never waits. The engine's callbacks run in the stepping thread.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any

import torch

from .backends import FINISH_CANCELLED, GenerationRequest, OnFinish, OnToken, eos_token_ids

logger = logging.getLogger(__name__)


class EngineNotAvailableError(RuntimeError):
    """The from-scratch engine cannot be imported here."""


@dataclasses.dataclass
class _Add:
    request: GenerationRequest
    on_token: OnToken
    on_finish: OnFinish


@dataclasses.dataclass
class _Cancel:
    request_id: str


@dataclasses.dataclass
class _Pause:
    request_id: str


@dataclasses.dataclass
class _Resume:
    request_id: str


class OursBackend:
    """Our engine (paged KV, continuous batching, prefix caching, chunked prefill) behind the server.

    ``engine_options`` are fields of :class:`infer_lab.engine.EngineConfig` (``kv_mode``,
    ``block_size``, ``num_blocks``, ``max_model_len``, ``policy``, ``max_num_seqs``,
    ``chunked_prefill``, ``max_num_batched_tokens``, ``prefix_cache``). ``parts``
    (:class:`infer_lab.engine.EngineParts`) replaces components of the engine with others of the
    same interface: ``infer-lab serve --engine mine`` serves the learner's this way.
    """

    engine_name = "ours"

    def __init__(self, lm: Any, parts: Any = None, **engine_options: Any):
        try:
            from ..engine import Engine, EngineConfig  # optional: --engine hf serves without it
        except ImportError as exc:
            raise EngineNotAvailableError(
                f"the from-scratch engine cannot be imported ({exc}); serve with --engine hf"
            ) from exc
        known = {f.name for f in dataclasses.fields(EngineConfig)}
        unknown = sorted(set(engine_options) - known)
        if unknown:
            raise ValueError(
                f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        self.lm = lm
        # A server runs for days: keep a bounded window of step records.
        self.config = EngineConfig(**{"step_log_limit": 10_000, **engine_options})
        self.engine = Engine.from_loaded(lm, self.config, parts=parts)
        self.max_model_len = self.engine.max_model_len
        # The engine stops on the model's EOS; chat models often end turns with another id too.
        self.stop_ids = tuple(
            sorted(eos_token_ids(lm.model, lm.tokenizer) - {self.engine.eos_token_id})
        )
        self._all_stop_ids = set(self.stop_ids) | {self.engine.eos_token_id}
        # Commands from the event loop; deque append/popleft are atomic, so no lock is needed.
        self._inbox: collections.deque[_Add | _Cancel | _Pause | _Resume] = collections.deque()
        self._applying = False  # the step thread has taken commands out and is applying them
        self._work = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._caller_runs_loop = False  # run_loop() on the caller's thread instead of a thread of its own
        self._loop_done = threading.Event()
        self.step_errors = 0
        self.finished_counts: dict[str, int] = {}  # finish reason -> requests, as the hf backend

    # ---------------------------------------------------------------------------------------
    # Called from the event loop: never blocks.

    def start(self) -> None:
        if self._caller_runs_loop:
            return  # the thread that called run_loop() steps the engine
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="engine-step", daemon=True)
            self._thread.start()

    def submit(self, request: GenerationRequest, on_token: OnToken, on_finish: OnFinish) -> None:
        """Queue a request for the step thread (the server has validated it already)."""
        self._inbox.append(_Add(request, on_token, on_finish))
        self._work.set()

    def cancel(self, request_id: str) -> None:
        """Ask the step thread to cancel the request before its next step."""
        self._inbox.append(_Cancel(request_id))
        self._work.set()

    def pause(self, request_id: str) -> None:
        """Ask the step thread to take the request out of the batch (slot and KV blocks freed)
        before its next step, until :meth:`resume`; see :meth:`infer_lab.engine.Engine.pause`."""
        self._inbox.append(_Pause(request_id))
        self._work.set()

    def resume(self, request_id: str) -> None:
        """Ask the step thread to put a paused request back in the queue (it recomputes its
        context when admitted)."""
        self._inbox.append(_Resume(request_id))
        self._work.set()

    def stats(self) -> dict[str, float]:
        # Read without the engine lock: a scrape may see numbers a step old, never blocks.
        sched = self.engine.scheduler
        queued = sum(isinstance(cmd, _Add) for cmd in list(self._inbox))
        running, waiting = getattr(sched, "running", None), getattr(sched, "waiting", None)
        if running is None or waiting is None:  # a scheduler without the two lists: count by status instead
            from ..engine.sequence import SequenceStatus  # optional: the engine, as in __init__

            try:
                statuses = [s.status for s in list(self.engine.requests.values())]
            except RuntimeError:  # the engine thread changed the dict meanwhile: a scrape is a step old anyway
                statuses = []
            running = [x for x in statuses if x is SequenceStatus.RUNNING]
            waiting = [x for x in statuses if x is SequenceStatus.WAITING]
        out = {
            "running": float(len(running)),
            "waiting": float(len(waiting) + queued),
            "paused": float(len(self.engine.paused)),
        }
        kv = self.engine.kv
        if hasattr(kv, "num_used_blocks"):  # paged KV (through its interface: the block manager may be a learner's)
            out["kv_blocks_used"], out["kv_blocks_total"] = float(kv.num_used_blocks()), float(kv.num_blocks)
            out["kv_blocks_used_peak"] = float(kv.peak_blocks_used)
        if self.engine.proposer is not None:
            out.update({f"spec_{k}": float(v) for k, v in self.engine.spec_totals.items()})
        if self.engine.prefix_cache is not None:
            st = self.engine.prefix_cache.stats
            out["prefix_cache_queries"], out["prefix_cache_hits"] = (
                float(st.queried_tokens),
                float(st.hit_tokens),
            )
        return out

    def info(self) -> dict[str, Any]:
        return {
            "engine": "ours",
            "model": self.lm.name,
            "device": self.lm.describe(),
            "torch": torch.__version__,
            "engine_config": dataclasses.asdict(self.config),
            "max_model_len": self.max_model_len,
        }

    def is_idle(self) -> bool:
        """True when no command is queued and the engine has nothing to run (tests, shutdown);
        paused requests are not work to run."""
        # Read in this order: a command leaves the inbox only after _applying is set.
        return not self._inbox and not self._applying and not self.engine.has_unfinished()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Cancel everything (queued or running) and stop the step thread; blocks up to ``timeout_s``."""
        self._stopping = True
        self._work.set()
        if self._caller_runs_loop:
            self._loop_done.wait(timeout_s)
        elif self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        else:  # never started: nothing else touches the engine
            self._cancel_everything()

    def step_on_caller(self) -> None:
        """Have :meth:`run_loop`, called later from the thread of the caller's choice, step the engine
        instead of a thread the backend starts itself."""
        self._caller_runs_loop = True

    def run_loop(self) -> None:
        """Step the engine on this thread until :meth:`shutdown` (after :meth:`step_on_caller`).

        ``infer-lab serve`` calls it from the process's main thread, the one that loaded the model:
        libgomp keeps one pool of worker threads per thread that starts parallel regions, and while
        two pools exist on a 2-core machine it counts more threads than cores and stops spinning
        between regions (each small GEMM then waits for a woken thread). One thread starting them
        keeps the decode step as fast as the engine alone.
        """
        self._loop_done.clear()
        try:
            self._loop()
        finally:
            self._loop_done.set()

    # ---------------------------------------------------------------------------------------
    # The step thread: the only one that calls the engine.

    def _loop(self) -> None:
        while not self._stopping:
            self._apply_inbox()
            if self.engine.has_unfinished():
                try:
                    self.engine.step()
                except Exception:  # the engine already failed the affected requests; keep serving
                    self.step_errors += 1
                    logger.exception("engine step raised (error %d); serving on", self.step_errors)
            else:
                self._work.wait(0.05)
                self._work.clear()
        self._cancel_everything()

    def _apply_inbox(self) -> None:
        self._applying = True
        while self._inbox:
            cmd = self._inbox.popleft()
            if isinstance(cmd, _Cancel):
                self.engine.cancel(cmd.request_id)  # False (a no-op) once it has finished
            elif isinstance(cmd, _Pause):
                self.engine.pause(cmd.request_id)  # False (a no-op) once it has finished
            elif isinstance(cmd, _Resume):
                self.engine.resume(cmd.request_id)  # False (a no-op) unless it is paused
            else:
                self._add(cmd)
        self._applying = False

    def _add(self, cmd: _Add) -> None:
        from ..engine import SamplingParams  # optional: the engine, as in __init__

        request, on_token, on_finish = cmd.request, cmd.on_token, cmd.on_finish
        p = request.params
        params = SamplingParams(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            ignore_eos=p.ignore_eos,
            stop_token_ids=() if p.ignore_eos else self.stop_ids,
        )
        stop_ids = set() if p.ignore_eos else self._all_stop_ids

        def callback(event) -> None:
            ends_on_stop_token = (
                event.finished and event.finish_reason == "stop" and event.token_id in stop_ids
            )
            if event.token_id is not None and not ends_on_stop_token:
                on_token(event.token_id)
            if event.finished:
                reason = event.finish_reason or "stop"
                self.engine.release(event.request_id)  # a long-running server keeps nothing
                self._count(reason)
                on_finish(
                    f"error: {event.error}" if reason == "error" else reason,
                    event.token_id if ends_on_stop_token else None,
                )

        try:
            self.engine.add_request(
                request.prompt_ids, params, on_token=callback, request_id=request.request_id
            )
        except ValueError as exc:  # the server validates first, so this is a bug: say so, go on
            logger.error("engine rejected request %s: %s", request.request_id, exc)
            self._count("error")
            on_finish(f"error: the engine rejected the request: {exc}")

    def _cancel_everything(self) -> None:
        while self._inbox:  # requests that never reached the engine are cancelled, not run
            cmd = self._inbox.popleft()
            if isinstance(cmd, _Add):
                self._count(FINISH_CANCELLED)
                cmd.on_finish(FINISH_CANCELLED)
        for rid, seq in list(self.engine.requests.items()):
            if not seq.is_finished:
                self.engine.cancel(rid)

    def _count(self, reason: str) -> None:
        self.finished_counts[reason] = self.finished_counts.get(reason, 0) + 1
