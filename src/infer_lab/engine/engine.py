"""The engine loop: requests in, one scheduled forward pass per ``step()``, tokens out.

Public API (small on purpose; an HTTP server drives it from a background thread)::

    engine = Engine.from_loaded(lm, EngineConfig(kv_mode="paged", prefix_cache="radix"))
    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=64), on_token=callback)
    while engine.has_unfinished():
        engine.step()              # one forward pass for every scheduled request
    engine.cancel(rid)             # any time, from any thread: frees the request's KV at once
    outputs = engine.generate([ids1, ids2], SamplingParams(max_tokens=32))   # the whole loop

Thread safety: ``add_request``, ``cancel``, ``step`` and the read-only helpers take one lock,
so a server thread may call ``add_request``/``cancel`` while another thread loops on ``step``.
Callbacks run in the thread that calls ``step``, *after* the lock is released, so a callback
may call ``cancel`` or ``add_request``. Callbacks must be quick (they delay the next step).

Each callback receives :class:`~.sequence.TokenEvent` objects: one per generated token, and a
final one with ``finished=True`` and ``finish_reason`` in ``stop | length | cancelled | error``.

Errors: bad input raises :class:`RequestRejected` (a ``ValueError``) from ``add_request`` and
changes nothing else. If a forward pass raises, only the requests in that step finish with
``finish_reason="error"`` and ``error`` saying why; the others carry on.
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from . import cpu_decode, gemm_choice, prepack
from .acceptance import Verdict, verify_greedy, verify_sampling
from .config import EngineConfig
from .gemm_choice import GemmPlan
from .graph_runner import DecodeBatch, StaticDecodeRunner
from .kv_cache import AttentionMetadata, ContiguousKVCache, NoKVCache, PagedKVCache
from .layers import LayerFunctions
from .model import EngineModel
from .prefix_cache import HashPrefixCache, PrefixCache, RadixPrefixCache
from .proposers import Proposer, check_same_tokenizer, make_proposer
from .sampling import filter_logits, make_generator, sample_token
from .scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from .sequence import RequestOutput, SamplingParams, Sequence, SequenceStatus, TokenEvent


def gemm_plan(config: EngineConfig, model: EngineModel) -> GemmPlan:
    """Which GEMM path an engine with ``config`` takes at each step size (see ``prepack_weights``).

    ``True``: prepacked at every size; ``False`` (or a model that cannot be packed): plain.
    ``None`` (auto): where prepacking applies (a CPU, fused projections, not compiled, fp32/bf16,
    a copy that fits in half the free memory), the plan measured on this machine
    (:func:`~.gemm_choice.plan_for`), else plain.
    """
    wanted = config.prepack_weights
    ok = prepack.supported(model.device, model.dtype)
    if wanted and not ok:
        raise ValueError(
            f"prepack_weights is a CPU optimization for fp32/bf16 weights with oneDNN; this model is "
            f"{model.dtype} on {model.device}" + ("" if prepack.available() else " (no oneDNN in this torch)")
        )
    if wanted is None:
        if not (ok and config.fuse_projections and not config.compile_layers
                and (model.is_prepacked or prepack.fits(model.gemm_weight_bytes()))):
            return GemmPlan.always(False)
        return gemm_choice.plan_for(model.plain.gemm_weights(), model.prepacked().gemm_weights())
    return GemmPlan.always(bool(wanted))


def use_prepacked_weights(config: EngineConfig, model: EngineModel) -> bool:
    """Whether an engine with ``config`` multiplies by prepacked weights at any step size."""
    return gemm_plan(config, model).any_prepacked


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


@dataclass
class _Pending:
    events: list[tuple[Callable[[TokenEvent], Any], TokenEvent]] = field(default_factory=list)


class Engine:
    """A mini serving engine over an :class:`EngineModel` (see the module docstring for the API)."""

    # Plug point (the course's build exercises swap in a learner's rule on one instance): greedy
    # speculative verification, ``(drafts, target_argmax) -> Verdict``; the default is the engine's own.
    verify_greedy: Callable[[list[int], list[int]], Verdict] = staticmethod(verify_greedy)

    def __init__(
        self,
        model: EngineModel,
        config: EngineConfig | None = None,
        draft_model: EngineModel | None = None,
    ):
        config = config or EngineConfig()
        config.validate()
        if config.dtype is not None:
            model = model.plain.cast({"fp32": torch.float32, "bf16": torch.bfloat16}[config.dtype])
        if config.weight_quant is not None:
            model = model.plain.quantized(config.weight_quant)
            self.gemm_plan = GemmPlan((1,), (False,), source=f"quantized weights ({config.weight_quant})")
        else:
            self.gemm_plan = gemm_plan(config, model)
        self.prepacked_weights = self.gemm_plan.any_prepacked
        model = model.prepacked() if self.prepacked_weights else model.plain
        if draft_model is not None:
            pack_draft = self.prepacked_weights and prepack.supported(draft_model.device, draft_model.dtype)
            draft_model = draft_model.prepacked() if pack_draft else draft_model.plain
        self.model = model
        self.config = config
        shape = model.shape
        self.max_model_len = config.max_model_len or min(shape.max_position_embeddings, 2048)
        if self.max_model_len > shape.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's "
                f"{shape.max_position_embeddings} positions"
            )
        on_cuda = model.device.type == "cuda"
        if config.cuda_graphs and not on_cuda:
            raise ValueError(f"cuda_graphs need a CUDA device; the model is on {model.device}")
        self.layer_fns = LayerFunctions(fused=config.fuse_projections, compiled=config.compile_layers)
        static = config.static_decode
        static = (on_cuda and config.kv_mode == "paged") if static is None else static
        # compiled_decode: steps of one token run cpu_decode's compiled halves on the plain weights.
        self.one_token_fns: LayerFunctions | None = None
        self.compile_s: float | None = None  # seconds its compilation (or disk-cache load) took
        if config.compiled_decode:
            why = cpu_decode.unsupported_reason(model.device, model.dtype)
            if why is None and static:
                why = "the static decode path runs its own fixed-shape step"
            if why is not None:
                raise ValueError(f"compiled_decode cannot run here: {why}")
            self.one_token_fns = cpu_decode.layer_functions()
            self.compile_s = cpu_decode.compile_for(model.plain)
        self.prefix_cache: PrefixCache | None = None
        if config.kv_mode == "paged":
            blocks_per_seq = math.ceil(self.max_model_len / config.block_size)
            num_blocks = config.num_blocks or config.max_num_seqs * blocks_per_seq
            if num_blocks < blocks_per_seq:
                raise ValueError(
                    f"num_blocks={num_blocks} cannot hold even one request of max_model_len="
                    f"{self.max_model_len} ({blocks_per_seq} blocks of {config.block_size}); "
                    "raise num_blocks or lower max_model_len"
                )
            self.kv = PagedKVCache(
                shape,
                num_blocks,
                config.block_size,
                model.dtype,
                model.device,
                scratch_block=static,
                kv_dtype=config.kv_dtype,
            )
            if config.prefix_cache == "hash":
                self.prefix_cache = HashPrefixCache(self.kv)
            elif config.prefix_cache == "radix":
                self.prefix_cache = RadixPrefixCache(self.kv)
        elif config.kv_mode == "contiguous":
            self.kv = ContiguousKVCache(
                shape, config.max_num_seqs, self.max_model_len, model.dtype, model.device
            )
        else:
            self.kv = NoKVCache()
        self.scheduler = Scheduler(
            SchedulerConfig(
                policy=config.policy,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                chunked_prefill=config.chunked_prefill,
            ),
            self.kv,
            self.prefix_cache,
        )
        self.decode_runner: StaticDecodeRunner | None = None
        if static:
            graphs = config.cuda_graphs if config.cuda_graphs is not None else on_cuda
            self.decode_runner = StaticDecodeRunner(
                model,
                self.kv,
                config.max_num_seqs,
                self.max_model_len,
                use_cuda_graphs=graphs,
                layer_fns=self.layer_fns,
            )
        pool_blocks = self.kv.num_blocks if isinstance(self.kv, PagedKVCache) else (
            config.max_num_seqs * math.ceil(self.max_model_len / config.block_size))
        self.proposer: Proposer | None = make_proposer(config, model, pool_blocks, draft_model)
        # Since start: guesses verified, guesses kept, verification passes (for /metrics).
        self.spec_totals = {"proposed_tokens": 0, "accepted_tokens": 0, "verify_passes": 0}
        self.eos_token_id = shape.eos_token_id
        self.requests: dict[str, Sequence] = {}
        self.step_log: collections.deque[StepRecord] = collections.deque(
            maxlen=config.step_log_limit
        )
        self._ids = itertools.count()
        self._lock = threading.RLock()

    @classmethod
    def from_loaded(cls, lm: Any, config: EngineConfig | None = None, draft: Any = None) -> Engine:
        """An engine over an :class:`infer_lab.models.LoadedModel`: the way to build one.

        The weights are shared with ``lm``, not copied (its projections were fused at load).
        ``draft`` is a second loaded model for ``speculative="draft"``; its tokenizer must be
        ``lm``'s (checked: a different tokenizer is refused with the differences).
        """
        draft_model = None
        if draft is not None:
            check_same_tokenizer(lm.tokenizer, draft.tokenizer)
            draft_model = EngineModel.from_hf(draft.model)
        return cls(EngineModel.from_hf(lm.model), config, draft_model)

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
            pending = _Pending()
            self._finish(seq, "cancelled", pending)
        _dispatch(pending)
        return True

    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""
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
        """Schedule, guess (speculative decoding), run one forward pass, sample, stream.

        Returns the events of this step.
        """
        pending = _Pending()
        with self._lock:
            sched = self.scheduler.schedule()
            if sched.scheduled:
                t0 = time.perf_counter()
                failed, draft_s = False, 0.0
                try:
                    if self.proposer is not None:
                        draft_s = self._add_drafts(sched)
                    logits = self._forward(sched)
                    self._advance(sched, logits, pending)
                except Exception as exc:  # a failing pass must not take the other requests down
                    failed = True
                    why = f"engine step failed: {type(exc).__name__}: {exc}"
                    for item in sched.scheduled:
                        if not item.seq.is_finished:
                            self._finish(item.seq, "error", pending, error=why)
                self._log(sched, time.perf_counter() - t0, failed, draft_s)
        _dispatch(pending)
        return [event for _, event in pending.events]

    def _add_drafts(self, sched: SchedulerOutput) -> float:
        """Ask the proposer for guesses for every decoding sequence and make room for them.

        A sequence may get up to ``num_speculative_tokens`` guesses, fewer near its
        ``max_tokens`` or the context limit, and none when its KV blocks cannot grow (so a
        guess never preempts anyone). Returns the seconds the proposer took.
        """
        t0 = time.perf_counter()
        k_max = self.config.num_speculative_tokens
        budget = (self.config.max_num_batched_tokens - sched.num_tokens
                  if self.config.chunked_prefill else None)
        decoding = [s for s in sched.scheduled if s.num_new_tokens == 1 and s.completes_context
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
            drafts = proposal.tokens
            if not drafts or not self.kv.can_allocate(item.seq, 1 + len(drafts)):
                continue
            self.kv.allocate(item.seq, 1 + len(drafts))
            item.drafts, item.draft_probs = drafts, proposal.probs
            item.num_new_tokens = 1 + len(drafts)
        return time.perf_counter() - t0

    def _forward(self, sched: SchedulerOutput) -> torch.Tensor:
        if self.decode_runner is not None and all(
            s.num_new_tokens == 1 and s.completes_context for s in sched.scheduled
        ):
            return self.decode_runner.run(self._decode_batch(sched))
        ids, positions, slots, sample_rows = [], [], [], []
        for item in sched.scheduled:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            ids += seq.all_ids[start : start + item.num_real_tokens] + item.drafts
            positions += range(start, start + n)
            slots += self.kv.slots(seq, start, n)
            if item.completes_context:  # one row per real last token and per guess
                sample_rows += range(len(ids) - 1 - len(item.drafts), len(ids))
        device = self.model.device
        one_token = self.one_token_fns is not None and len(ids) == 1
        model = self.model if self.gemm_plan.use_prepacked(len(ids)) and not one_token else self.model.plain
        meta = AttentionMetadata(
            query_lens=[s.num_new_tokens for s in sched.scheduled],
            context_lens=[s.start + s.num_new_tokens for s in sched.scheduled],
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device)
            if self.kv.stores_kv
            else None,
            sample_indices=sample_rows,
        )
        self.kv.fill_metadata(
            meta, [s.seq for s in sched.scheduled], batched_decode=self.config.batched_decode
        )
        return model.forward(
            torch.tensor(ids, dtype=torch.long, device=device),
            torch.tensor(positions, dtype=torch.long, device=device),
            meta,
            self.kv if self.kv.stores_kv else None,
            self.one_token_fns if one_token else self.layer_fns,
        )

    def _decode_batch(self, sched: SchedulerOutput) -> DecodeBatch:
        """The host-side inputs of a pure-decode step, for the static runner."""
        seqs = [s.seq for s in sched.scheduled]
        positions = [s.start for s in sched.scheduled]
        return DecodeBatch(
            input_ids=[seq.token_at(p) for seq, p in zip(seqs, positions, strict=False)],
            positions=positions,
            slot_mapping=[
                self.kv.slots(seq, p, 1)[0] for seq, p in zip(seqs, positions, strict=False)
            ],
            block_tables=[seq.block_table for seq in seqs],
            context_lens=[p + 1 for p in positions],
        )

    def _advance(self, sched: SchedulerOutput, logits: torch.Tensor, pending: _Pending) -> None:
        row = 0
        now = time.perf_counter()
        # One device-to-host copy for all rows (a per-row .cpu() would sync B times). A NaN or
        # Inf anywhere in a row wins its argmax, so checking the chosen logit checks the row.
        greedy = logits.argmax(dim=-1)
        chosen = logits.gather(1, greedy[:, None])[:, 0]
        greedy, finite = torch.stack((greedy, torch.isfinite(chosen).long())).tolist()
        for item in sched.scheduled:
            seq = item.seq
            if self.kv.stores_kv:
                seq.num_computed = item.start + item.num_real_tokens
            if not item.completes_context:
                continue
            rows = range(row, row + 1 + len(item.drafts))
            row += len(rows)
            if not all(finite[r] for r in rows):  # a numerical fault: fail this request, not others
                self._finish(seq, "error", pending, error="the model produced NaN/Inf logits")
                continue
            try:
                verdict = self._verdict(item, logits, rows, greedy)
            except Exception as exc:  # one request's sampling fault must not fail its neighbours
                self._finish(seq, "error", pending, error=f"sampling failed: {type(exc).__name__}: {exc}")
                continue
            seq.num_target_passes += 1
            if item.drafts:
                seq.num_proposed += verdict.proposed
                seq.num_accepted += verdict.accepted
                item.accepted = verdict.accepted
                self.spec_totals["proposed_tokens"] += verdict.proposed
                self.spec_totals["accepted_tokens"] += verdict.accepted
                self.spec_totals["verify_passes"] += 1
                seq.num_computed += verdict.accepted  # the kept guesses' K/V is valid
                self.kv.truncate(seq, seq.num_computed)  # the rejected ones' blocks go back
            if not seq.prefill_done:
                seq.prefill_done = True
                seq.first_token_s = now
                if self.prefix_cache is not None:
                    self.prefix_cache.insert(seq)
            self._emit(seq, verdict.tokens, now, pending)
            if self.proposer is not None and not seq.is_finished:
                self.proposer.rollback(seq, seq.num_computed)

    def _verdict(self, item: Any, logits: torch.Tensor, rows: range, greedy: list[int]) -> Verdict:
        """The tokens this step appends to one sequence: its sample, or its verified guesses."""
        seq, p = item.seq, item.seq.params
        if p.greedy:
            return self.verify_greedy(item.drafts, [greedy[r] for r in rows])
        if not item.drafts:
            return Verdict([sample_token(logits[rows[0]].cpu(), p, seq.generator)], 0, 0)
        target = torch.stack([
            torch.softmax(filter_logits(logits[r].cpu() / p.temperature, p.top_k, p.top_p), dim=-1)
            for r in rows
        ])
        return verify_sampling(item.drafts, item.draft_probs, target, seq.generator)

    def _emit(self, seq: Sequence, tokens: list[int], now: float, pending: _Pending) -> None:
        """Append ``tokens`` one by one, streaming each; stop at the first stop condition."""
        for token in tokens:
            seq.output_ids.append(token)
            seq.token_times_s.append(now)
            reason = self._stop_reason(seq, token)
            if seq.on_token is not None:
                pending.events.append((seq.on_token, TokenEvent(
                    seq.request_id, token, len(seq.output_ids) - 1, finished=reason is not None,
                    finish_reason=reason, time_s=now)))
            if reason is not None:
                self._finish(seq, reason, pending, notify=False)
                return

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if (token == self.eos_token_id and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _finish(
        self,
        seq: Sequence,
        reason: str,
        pending: _Pending,
        error: str | None = None,
        notify: bool = True,
    ) -> None:
        if self.prefix_cache is not None and reason in ("stop", "length"):
            seq.num_computed = min(seq.num_computed, seq.num_tokens)
            self.prefix_cache.insert(seq)
        if self.proposer is not None:
            self.proposer.release(seq)
        self.scheduler.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.error = reason, error
        seq.num_computed = 0
        if notify and seq.on_token is not None:
            pending.events.append(
                (
                    seq.on_token,
                    TokenEvent(
                        seq.request_id,
                        None,
                        len(seq.output_ids),
                        finished=True,
                        finish_reason=reason,
                        error=error,
                        time_s=time.perf_counter(),
                    ),
                )
            )

    def _log(self, sched: SchedulerOutput, duration_s: float, failed: bool, draft_s: float = 0.0) -> None:
        prefill = sum(
            s.num_real_tokens
            for s in sched.scheduled
            if s.num_real_tokens > 1 or not s.seq.prefill_done
        )
        used = self.kv.pool.num_used if isinstance(self.kv, PagedKVCache) else 0
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


def _dispatch(pending: _Pending) -> None:
    for callback, event in pending.events:
        callback(event)
