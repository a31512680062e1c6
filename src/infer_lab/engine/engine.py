"""The engine: requests in, one scheduled forward pass per ``step()``, tokens out.

Public API (small on purpose; an HTTP server drives it from a background thread)::

    engine = Engine.from_loaded(lm, EngineConfig(kv_mode="paged", prefix_cache="radix"))
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=64), on_token=callback)
    while engine.has_unfinished():
        engine.step()              # one forward pass for every scheduled request
    engine.cancel(rid)             # any time, from any thread: frees the request's KV at once
    engine.pause(rid); engine.resume(rid)   # out of the batch (slot and KV freed) and back
    outputs = engine.generate([ids1, ids2], SamplingParams(max_tokens=32))   # the whole loop

Thread safety: ``add_request``, ``cancel``, ``pause``, ``resume``, ``step`` and the read-only
helpers take one lock, so a server thread may call ``add_request``/``cancel`` while another
thread loops on ``step``.
Callbacks run in the thread that calls ``step``, *after* the lock is released, so a callback
may call ``cancel`` or ``add_request``. Callbacks must be quick (they delay the next step).

Each callback receives :class:`~.sequence.TokenEvent` objects: one per generated token, and a
final one with ``finished=True`` and ``finish_reason`` in ``stop | length | cancelled | error``.

Errors: bad input raises :class:`RequestRejected` (a ``ValueError``) from ``add_request`` and
changes nothing else. If a forward pass raises, only the requests in that step finish with
``finish_reason="error"`` and ``error`` saying why; the others carry on.

The engine is assembled from components (:mod:`.parts`): the execution of the forward pass
(:mod:`.executor`), the KV cache (:mod:`.kv_cache`: a block manager and a KV store), the scheduler,
the step loop (:mod:`.step_loop`), the sampler, the prefix cache and the speculative proposer.
This file is their lifecycle: it builds them, takes requests, and around each step holds the
lock, times and streams every new token, keeps the proposer in step with each request and logs
the step. ``Engine(model, config, parts=EngineParts(...))`` swaps any of them for another with the
same interface (the course's build track swaps in a learner's).
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch

from . import step_loop as library_step_loop
from .config import EngineConfig
from .cpu import prepack
from .executor import Executor, gemm_plan, use_prepacked_weights
from .kv_cache import ContiguousKVCache, NoKVCache, PagedKVCache
from .model import EngineModel
from .parts import EngineParts
from .prefix_cache import HashPrefixCache, PrefixCache, RadixPrefixCache
from .proposers import Proposer, check_same_tokenizer, make_proposer
from .sampling import Sampler, make_generator
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .sequence import RequestOutput, SamplingParams, Sequence, SequenceStatus, TokenEvent

__all__ = ["Engine", "RequestRejected", "StepRecord", "gemm_plan", "use_prepacked_weights"]


class RequestRejected(ValueError):
    """A request the engine cannot take (too long, empty, bad sampling settings); nothing changed."""


@dataclass
class StepRecord:
    """What one ``step()`` did: sizes in tokens/requests, time in seconds, KV in blocks."""

    step: int
    num_seqs: int
    num_tokens: int
    prefill_tokens: int
    decode_tokens: int
    idle_slots: int
    preempted: int
    duration_s: float
    kv_blocks_used: int
    failed: bool = False
    draft_s: float = 0.0  # of duration_s, the time the proposer took (speculative decoding)
    proposed: int = 0  # speculative guesses verified this step
    accepted: int = 0  # of which the target kept


class _RecordingScheduler:
    """Passes every call to the scheduler and keeps the last ``schedule()`` output, for the step's log."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.last: SchedulerOutput | None = None

    def schedule(self) -> SchedulerOutput:
        self.last = self.inner.schedule()
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Engine:
    """A mini serving engine over an :class:`EngineModel` (see the module docstring for the API)."""

    def __init__(
        self,
        model: EngineModel,
        config: EngineConfig | None = None,
        draft_model: EngineModel | None = None,
        parts: EngineParts | None = None,
    ):
        config = config or EngineConfig()
        config.validate()
        parts = parts or EngineParts()
        if parts.needs_paged_kv and config.kv_mode != "paged":
            raise ValueError(f"your {', '.join(parts.replaced())} work on paged KV: use kv_mode='paged'")
        self.config, self.parts = config, parts
        self.max_model_len = config.max_model_len or min(model.shape.max_position_embeddings, 2048)
        if self.max_model_len > model.shape.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's "
                f"{model.shape.max_position_embeddings} positions"
            )
        on_cuda = model.device.type == "cuda"
        if config.cuda_graphs and not on_cuda:
            raise ValueError(f"cuda_graphs need a CUDA device; the model is on {model.device}")
        static = config.static_decode
        custom_kv = parts.kv_store is not None or parts.forward is not None
        if static is None:
            static = on_cuda and config.kv_mode == "paged" and not custom_kv
        elif static and custom_kv:
            raise ValueError("static_decode runs the library's forward pass over its own KV store")
        self.executor = Executor(model, config, forward=parts.forward, static=static)
        self.kv = self._build_kv(static)
        self.executor.bind(self.kv, config.max_num_seqs, self.max_model_len)
        self.prefix_cache = self._build_prefix_cache()
        self.scheduler = _RecordingScheduler((parts.scheduler or Scheduler)(
            SchedulerConfig(policy=config.policy, max_num_seqs=config.max_num_seqs,
                            max_num_batched_tokens=config.max_num_batched_tokens,
                            chunked_prefill=config.chunked_prefill),
            self.kv))
        self.step_loop = parts.step_loop or library_step_loop
        self.sampler = (parts.sampler or Sampler)()
        self.proposer = self._build_proposer(draft_model)
        # Since start: guesses verified, guesses kept, verification passes (for /metrics).
        self.spec_totals = {"proposed_tokens": 0, "accepted_tokens": 0, "verify_passes": 0}
        self.eos_token_id = model.shape.eos_token_id
        self.requests: dict[str, Sequence] = {}
        self.paused: dict[str, Sequence] = {}  # out of the scheduler until resume()
        self.step_log: collections.deque[StepRecord] = collections.deque(maxlen=config.step_log_limit)
        self._ids = itertools.count()
        self._lock = threading.RLock()
        self._draft_s = 0.0
        self._all_threads = torch.get_num_threads()  # prompt steps; decode-only steps may use fewer

    def _build_kv(self, scratch_block: bool) -> Any:
        """The KV cache ``config.kv_mode`` names, over the (possibly replaced) block manager and store."""
        config, model, parts = self.config, self.model, self.parts
        shape = model.shape
        if config.kv_mode == "contiguous":
            return ContiguousKVCache(shape, config.max_num_seqs, self.max_model_len, model.dtype, model.device)
        if config.kv_mode != "paged":
            return NoKVCache()
        blocks_per_seq = math.ceil(self.max_model_len / config.block_size)
        num_blocks = config.num_blocks or config.max_num_seqs * blocks_per_seq
        if num_blocks < blocks_per_seq:
            raise ValueError(
                f"num_blocks={num_blocks} cannot hold even one request of max_model_len="
                f"{self.max_model_len} ({blocks_per_seq} blocks of {config.block_size}); "
                "raise num_blocks or lower max_model_len"
            )
        store = None
        if parts.kv_store is not None:
            if config.kv_dtype is not None:
                raise ValueError(f"kv_dtype={config.kv_dtype!r} quantizes the library's KV store; "
                                 "your store keeps the model's dtype")
            store = parts.kv_store(num_blocks, config.block_size, shape.layers, shape.kv_heads, shape.head_dim,
                                   model.dtype, model.device)
        blocks = parts.block_manager(num_blocks, config.block_size) if parts.block_manager is not None else None
        return PagedKVCache(shape, num_blocks, config.block_size, model.dtype, model.device,
                            scratch_block=scratch_block, kv_dtype=config.kv_dtype, block_manager=blocks, store=store)

    def _build_prefix_cache(self) -> PrefixCache | None:
        kind = self.config.prefix_cache
        if kind == "hash":
            return HashPrefixCache(self.kv)
        if kind == "radix":
            cache = (self.parts.prefix_cache or RadixPrefixCache)(self.kv)
            self.kv.prefix_cache = cache  # the KV cache asks this very object (a replacement may wrap its own)
            return cache
        return None

    def _build_proposer(self, draft_model: EngineModel | None) -> Proposer | None:
        config = self.config
        if draft_model is not None:
            pack = self.executor.prepacked_weights and prepack.supported(draft_model.device, draft_model.dtype)
            draft_model = draft_model.prepacked() if pack else draft_model.plain
        pool_blocks = self.kv.num_blocks if isinstance(self.kv, PagedKVCache) else (
            config.max_num_seqs * math.ceil(self.max_model_len / config.block_size))
        if self.parts.proposer is not None and config.speculative and config.speculative.startswith("ngram"):
            arg = config.speculative.partition(":")[2]
            return self.parts.proposer(int(arg) if arg else 3)
        return make_proposer(config, self.model, pool_blocks, draft_model)

    @property
    def model(self) -> EngineModel:
        """The model the engine runs (cast, quantized or prepacked for its config): the executor's."""
        return self.executor.model

    @model.setter
    def model(self, model: EngineModel) -> None:
        self.executor.model = model

    # Read-only views the rest of the library uses.
    @property
    def gemm_plan(self) -> Any:
        return self.executor.gemm_plan

    @property
    def prepacked_weights(self) -> bool:
        return self.executor.prepacked_weights

    @property
    def compile_s(self) -> float | None:
        return self.executor.compile_s

    @property
    def decode_runner(self) -> Any:
        return self.executor.decode_runner

    @property
    def one_token_fns(self) -> Any:
        return self.executor.one_token_fns

    @one_token_fns.setter
    def one_token_fns(self, fns: Any) -> None:
        self.executor.one_token_fns = fns

    @property
    def layer_fns(self) -> Any:
        return self.executor.layer_fns

    @classmethod
    def from_loaded(cls, lm: Any, config: EngineConfig | None = None, draft: Any = None,
                    parts: EngineParts | None = None) -> Engine:
        """An engine over an :class:`infer_lab.models.LoadedModel`: the way to build one.

        The weights are shared with ``lm``, not copied (its projections were fused at load).
        ``draft`` is a second loaded model for ``speculative="draft"``; its tokenizer must be
        ``lm``'s (checked: a different tokenizer is refused with the differences). ``parts``
        replaces components with others of the same interface (:class:`~.parts.EngineParts`).
        """
        draft_model = None
        if draft is not None:
            check_same_tokenizer(lm.tokenizer, draft.tokenizer)
            draft_model = EngineModel.from_hf(draft.model)
        return cls(EngineModel.from_hf(lm.model), config, draft_model, parts)

    # ---------------------------------------------------------------------------------------
    # Requests

    def add_request(
        self,
        prompt_ids: Seq[int] | torch.Tensor,
        params: SamplingParams | None = None,
        on_token: Callable[[TokenEvent], Any] | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request and return its id. Raises :class:`RequestRejected` on bad input.

        Args:
            prompt_ids: the prompt's token ids (a list, or a 1-D / (1, n) tensor).
            params: sampling and stopping settings (default: greedy, 16 tokens).
            on_token: called with a :class:`TokenEvent` per generated token and once at the end.
            request_id: your own id (must be unused); default ``"req-<n>"``.
        """
        params = params or SamplingParams()
        try:
            params.validate()
        except ValueError as exc:
            raise RequestRejected(str(exc)) from None
        ids = _as_id_list(prompt_ids)
        vocab = self.model.shape.vocab
        if not ids:
            raise RequestRejected("the prompt is empty: give at least one token id")
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestRejected(f"token ids must be in [0, {vocab}); got {min(ids)}..{max(ids)}")
        if len(ids) >= self.max_model_len:
            raise RequestRejected(
                f"the prompt has {len(ids)} tokens but the engine's max context is "
                f"{self.max_model_len} tokens (prompt + at least one new token)"
            )
        with self._lock:
            rid = request_id or f"req-{next(self._ids)}"
            if rid in self.requests:
                raise RequestRejected(f"request id {rid!r} is already in use")
            seq = Sequence(
                request_id=rid,
                prompt_ids=ids,
                params=params,
                arrival_s=time.perf_counter(),
                on_token=on_token,
            )
            if not params.greedy:
                seq.generator = make_generator(params.seed)
            self.requests[rid] = seq
            self.scheduler.add(seq)
        return rid

    def cancel(self, request_id: str) -> bool:
        """Stop a request now and free its KV memory; False if it is unknown or already finished."""
        with self._lock:
            seq = self.requests.get(request_id)
            if seq is None or seq.is_finished:
                return False
            self.paused.pop(request_id, None)
            self._end(seq, "cancelled")
            events = self._observe([seq], [len(seq.output_ids)], None, time.perf_counter())
        _dispatch(events)
        return True

    def pause(self, request_id: str) -> bool:
        """Take a request out of the batch until :meth:`resume`; False if it is unknown, finished
        or already paused.

        Its batch slot and KV blocks go back at once (to the prefix cache first, if there is
        one): preemption by recompute, asked for from outside. A server pauses a stream whose
        client has stopped reading, so that it holds nothing others need. The request keeps its
        tokens and its sampling generator, so its answer is the one it would have been.
        """
        with self._lock:
            seq = self.requests.get(request_id)
            if seq is None or seq.is_finished or request_id in self.paused:
                return False
            self.scheduler.remove(seq)
            self.kv.free(seq, cache_prefix=True)
            seq.num_computed = 0
            seq.status = SequenceStatus.WAITING
            seq.num_preemptions += 1  # the prefix cache counts a prompt's hit on first admission only
            if self.proposer is not None:
                self.proposer.release(seq)
            self.paused[request_id] = seq
            return True

    def resume(self, request_id: str) -> bool:
        """A paused request joins the back of the queue; when admitted it recomputes its prompt
        and the tokens it already generated in one prefill, then goes on. False if not paused."""
        with self._lock:
            seq = self.paused.pop(request_id, None)
            if seq is None:
                return False
            self.scheduler.add(seq)
            return True

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running (a paused one is neither)."""
        with self._lock:
            return self.scheduler.has_unfinished()

    def output(self, request_id: str) -> RequestOutput:
        """The request's tokens so far (and its timings and finish reason, once finished)."""
        with self._lock:
            return RequestOutput.from_sequence(self.requests[request_id])

    def release(self, request_id: str) -> RequestOutput:
        """Forget a finished request and return its output.

        The engine keeps finished requests so that :meth:`output` works after a run; a server
        that runs for days releases each one when it completes, so memory stays bounded.
        Raises ``KeyError`` for an unknown id and ``ValueError`` while the request still runs.
        """
        with self._lock:
            seq = self.requests[request_id]
            if not seq.is_finished:
                raise ValueError(f"request {request_id!r} is still running: cancel it first")
            del self.requests[request_id]
            return RequestOutput.from_sequence(seq)

    # ---------------------------------------------------------------------------------------
    # The step

    def step(self) -> list[TokenEvent]:
        """One step of the step loop (schedule, guess, forward, sample), then stream what it produced.

        Returns the events of this step. A step that raises fails its requests (every unfinished
        one, if it raised before scheduling) with the reason, and the engine goes on.
        """
        with self._lock:
            live = [s for s in self.requests.values() if not s.is_finished]
            before = [len(s.output_ids) for s in live]
            self.scheduler.last, self._draft_s = None, 0.0
            t0 = time.perf_counter()
            raised = False
            try:
                self.step_loop.step(self)
            except Exception as exc:  # a failing step must not take the engine (or its other clients) down
                raised = True
                why = f"engine step failed: {type(exc).__name__}: {exc}"
                batch = self.scheduler.last
                for seq in [item.seq for item in batch.scheduled] if batch is not None else live:
                    if not seq.is_finished:
                        self._end(seq, "error", why)
            now = time.perf_counter()
            batch = self.scheduler.last
            events = self._observe(live, before, batch, now)
            if batch is not None and batch.scheduled:
                failed = raised or any(item.seq.finish_reason == "error" for item in batch.scheduled)
                self._log(batch, now - t0, failed, self._draft_s)
        _dispatch(events)
        return [event for _, event in events]

    def execute(self, batch: SchedulerOutput) -> torch.Tensor:
        """The forward pass over a scheduled step (:meth:`.executor.Executor.execute`): logits to sample.

        On a CPU with ``decode_threads`` set, a step that only decodes runs on that many threads and a
        step with a prompt chunk on all of them (the count this thread had when the engine was built).
        """
        wanted = self._threads_for(batch)
        if wanted is not None and wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)
        return self.executor.execute(batch)

    def _threads_for(self, batch: SchedulerOutput) -> int | None:
        if self.config.decode_threads is None or self.model.device.type != "cpu":
            return None
        decoding_only = all(item.num_real_tokens == 1 and item.start > 0 for item in batch.scheduled)
        return min(self.config.decode_threads, self._all_threads) if decoding_only else self._all_threads

    def propose(self, batch: SchedulerOutput) -> None:
        """Speculative decoding: ask the proposer for guesses for every decoding request and make room.

        A request may get up to ``num_speculative_tokens`` guesses, fewer near its ``max_tokens``
        or the context limit, and none when its KV blocks cannot grow (so a guess never preempts
        anyone). Nothing happens when speculation is off.
        """
        if self.proposer is None:
            return
        t0 = time.perf_counter()
        k_max = self.config.num_speculative_tokens
        budget = (self.config.max_num_batched_tokens - batch.num_tokens
                  if self.config.chunked_prefill else None)
        decoding = [s for s in batch.scheduled if s.num_new_tokens == 1 and s.completes_context
                    and s.seq.prefill_done]
        ks = []
        for item in decoding:
            seq = item.seq
            k = min(k_max, seq.params.max_tokens - len(seq.output_ids) - 1,
                    self.max_model_len - seq.num_tokens - 1)
            if budget is not None:
                k = min(k, budget)
                budget -= max(k, 0)
            ks.append(max(k, 0))
        proposals = self.proposer.propose([s.seq for s in decoding], ks)
        for item, proposal in zip(decoding, proposals, strict=True):
            drafts = list(proposal.tokens)
            if not drafts or not self.kv.can_allocate(item.seq, 1 + len(drafts)):
                continue
            self.kv.allocate(item.seq, 1 + len(drafts))
            item.drafts, item.draft_probs = drafts, proposal.probs
            item.num_new_tokens = 1 + len(drafts)
        self._draft_s += time.perf_counter() - t0

    def _end(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        """Finish ``seq`` through the step loop's ``finish``; through the library's if that raises or
        leaves it unfinished (a client must not wait for a request that can never end)."""
        try:
            self.step_loop.finish(self, seq, reason, error)
        except Exception as exc:  # noqa: BLE001  (a replaced step loop's fault)
            error = f"{error or reason}; finishing it also failed: {type(exc).__name__}: {exc}"
        if not seq.is_finished:
            try:
                library_step_loop.finish(self, seq, reason, error)
            except Exception:  # noqa: BLE001  (its KV is past saving; the request itself must end)
                seq.status, seq.finish_reason, seq.error = SequenceStatus.FINISHED, reason, error

    def _observe(self, seqs: list[Sequence], before: list[int], batch: SchedulerOutput | None,
                 now: float) -> list[tuple[Callable[[TokenEvent], Any], TokenEvent]]:
        """What a step (or a cancel) changed in ``seqs``: time and stream each new token, send the final
        event of each request that finished, count speculative guesses, keep the proposer in step."""
        drafted = {id(item.seq): item for item in batch.scheduled if item.drafts} if batch is not None else {}
        events = []
        for seq, n0 in zip(seqs, before, strict=True):
            new = seq.output_ids[n0:]
            if new:
                if seq.first_token_s is None:
                    seq.first_token_s = now
                seq.token_times_s.extend([now] * len(new))
                seq.num_target_passes += 1
            item = drafted.get(id(seq))
            if item is not None and new:  # verified: every token but the target's own was a kept guess
                item.accepted = min(len(item.drafts), len(new) - 1)
                seq.num_proposed += len(item.drafts)
                seq.num_accepted += item.accepted
                self.spec_totals["proposed_tokens"] += len(item.drafts)
                self.spec_totals["accepted_tokens"] += item.accepted
                self.spec_totals["verify_passes"] += 1
            if seq.on_token is not None:
                for i, token in enumerate(new):
                    last = seq.is_finished and i == len(new) - 1
                    events.append((seq.on_token, TokenEvent(
                        seq.request_id, token, n0 + i, finished=last,
                        finish_reason=seq.finish_reason if last else None, time_s=now)))
                if seq.is_finished and not new:
                    events.append((seq.on_token, TokenEvent(
                        seq.request_id, None, len(seq.output_ids), finished=True,
                        finish_reason=seq.finish_reason, error=seq.error, time_s=now)))
            if self.proposer is not None:
                if seq.is_finished:
                    self.proposer.release(seq)
                elif new:
                    self.proposer.rollback(seq, seq.num_computed)  # forget guesses the target did not keep
        return events

    def _log(self, sched: SchedulerOutput, duration_s: float, failed: bool, draft_s: float = 0.0) -> None:
        prefill = sum(
            s.num_real_tokens
            for s in sched.scheduled
            if s.num_real_tokens > 1 or not s.seq.prefill_done
        )
        used = self.kv.num_used_blocks() if isinstance(self.kv, PagedKVCache) else 0
        self.step_log.append(
            StepRecord(
                step=len(self.step_log),
                num_seqs=len(sched.scheduled),
                num_tokens=sched.num_tokens,
                prefill_tokens=prefill,
                decode_tokens=sched.num_tokens - prefill,
                idle_slots=sched.idle_slots,
                preempted=len(sched.preempted),
                duration_s=duration_s,
                kv_blocks_used=used,
                failed=failed,
                draft_s=draft_s,
                proposed=sum(len(s.drafts) for s in sched.scheduled),
                accepted=sum(s.accepted for s in sched.scheduled),
            )
        )

    # ---------------------------------------------------------------------------------------
    # Whole runs

    def generate(
        self,
        prompts: Seq[Seq[int] | torch.Tensor],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        arrival_steps: Seq[int] | None = None,
        on_token: Callable[[TokenEvent], Any] | None = None,
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion and return their outputs in order.

        Args:
            prompts: token-id lists (or tensors), one per request.
            params: one :class:`SamplingParams` for all, or one per prompt.
            arrival_steps: optional step number at which each request arrives (staggered arrivals).
            on_token: streaming callback for every request.
        """
        per = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        arrivals = list(arrival_steps) if arrival_steps is not None else [0] * len(prompts)
        if len(per) != len(prompts) or len(arrivals) != len(prompts):
            raise ValueError("params and arrival_steps need one entry per prompt")
        order = sorted(range(len(prompts)), key=lambda i: arrivals[i])
        ids: dict[int, str] = {}
        step, k = 0, 0
        while k < len(order) or self.has_unfinished():
            while k < len(order) and arrivals[order[k]] <= step:
                i = order[k]
                ids[i] = self.add_request(prompts[i], per[i], on_token)
                k += 1
            self.step()
            step += 1
        return [self.output(ids[i]) for i in range(len(prompts))]

    def blocks_in_use_by_requests(self) -> int:
        """Blocks referenced by live requests (0 after a run: anything else is a leak)."""
        with self._lock:
            return sum(len(s.block_table) for s in self.requests.values())

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (their blocks go back to the pool)."""
        with self._lock:
            if self.prefix_cache is not None:
                self.prefix_cache.clear()


def _as_id_list(prompt_ids: Seq[int] | torch.Tensor) -> list[int]:
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]
        if prompt_ids.dim() != 1:
            raise RequestRejected(
                f"prompt_ids must be 1-D (or 1 x n), got shape {tuple(prompt_ids.shape)}"
            )
        return [int(t) for t in prompt_ids.tolist()]
    try:
        return [int(t) for t in prompt_ids]
    except (TypeError, ValueError):
        raise RequestRejected("prompt_ids must be a sequence of integer token ids") from None


def _dispatch(events: list[tuple[Callable[[TokenEvent], Any], TokenEvent]]) -> None:
    for callback, event in events:
        callback(event)
