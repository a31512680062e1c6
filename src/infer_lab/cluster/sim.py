"""A discrete-event simulator of a serving cluster: colocated or prefill/decode disaggregated.

An *instance* is one engine on one TP group of GPUs. It runs steps back to back while it has
work; each step's duration comes from a cost model (:mod:`infer_lab.cluster.costs`: roofline or
measured). Events are arrivals, step ends and KV transfers; time jumps from one to the next.

Roles and their schedulers (continuous batching everywhere: a finished request frees its slot
and KV at once, a waiting one joins on the next step):

- ``colocated`` without chunked prefill: when requests wait and fit, the next step prefills
  whole prompts (up to ``max_num_batched_tokens``) and the running decodes pause for it, which is
  the prefill interference that makes decode's tail ITL spike. Otherwise it decodes.
- ``colocated`` with chunked prefill: every step decodes all running sequences and fills the
  rest of the token budget with prompt chunks (decode first), so a prompt delays each decode
  step a little instead of one step a lot.
- ``prefill`` (disaggregated): prefill-only steps; each finished prompt samples its first token
  (that is its TTFT), then its KV (prompt x KV bytes per token) goes to a decode instance over
  the KV link, one transfer at a time per prefill instance, at ``n_gpus`` NICs' bandwidth (each
  GPU of the group sends its own shard).
- ``decode`` (disaggregated): decode-only steps; a request joins when its KV has arrived.

How this scheduler differs from the engine's (:mod:`infer_lab.engine.scheduler`), on purpose:
the engine allocates KV blocks as tokens arrive and preempts (recomputes) the newest request when
it runs out; a simulated instance reserves a request's whole KV on admission, so it never
preempts. The simulator models steady serving at a planned load, where preemption is a failure
to plan, and a reservation keeps every event deterministic. The knobs keep the engine's names
(``max_num_seqs``, ``max_num_batched_tokens``, ``chunked_prefill``), and
:mod:`infer_lab.cluster.engine_check` runs both on the same trace and compares their steps.

KV memory is reserved per request on admission (prompt + output tokens where it decodes,
prompt where it only prefills) and freed when it leaves, so nothing is preempted; a request
that can never fit is an error before the run starts. Routing: the instance with the least
outstanding work.

Token times: the first token at the end of its prefill, every other token at the end of a
decode step. The gap between two tokens is one ITL sample; with disaggregation the first gap
includes the KV transfer and the wait for a decode slot.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from ..analysis.parallel import p2p_transfer_s
from ..catalog import get_interconnect
from .costs import StepBatch, StepCostModel
from .workloads import TraceRequest

ROLES = ("colocated", "prefill", "decode")


@dataclass
class InstanceSpec:
    """One engine instance: its role, step cost, GPUs and KV capacity (tokens)."""

    role: str
    cost: StepCostModel
    n_gpus: int
    kv_capacity_tokens: int
    gpu: str = ""
    name: str = ""
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    chunked_prefill: bool = False
    usd_per_hour: float = 0.0

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; use one of {', '.join(ROLES)}")
        for name in ("n_gpus", "kv_capacity_tokens", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


@dataclass
class _Req:
    trace: TraceRequest
    prefilled: int = 0
    generated: int = 0
    token_times: list[float] = field(default_factory=list)
    prefill_instance: int | None = None
    decode_instance: int | None = None
    kv_sent_bytes: int = 0
    kv_transfer_s: float = 0.0
    finish_s: float | None = None

    @property
    def context(self) -> int:
        """Tokens cached after this request's next decode step."""
        return self.trace.prompt_tokens + self.generated


class _Instance:
    def __init__(self, idx: int, spec: InstanceSpec):
        self.idx, self.spec = idx, spec
        self.waiting: deque[_Req] = deque()  # need (the rest of) a prefill here
        self.ready: deque[_Req] = deque()  # decode role: KV arrived, waiting for a slot
        self.prefilling: list[_Req] = []
        self.running: list[_Req] = []
        self.kv_used = 0
        self.busy = False
        self.plan: list[tuple[_Req, int]] = []  # (request, prompt tokens computed this step)
        self.decoding: list[_Req] = []
        self.steps = 0
        self.busy_s = 0.0
        self.kv_allocated = 0
        self.kv_freed = 0
        self.kv_peak = 0
        self.link_free_s = 0.0

    # Memory ---------------------------------------------------------------------------------
    def need(self, r: _Req) -> int:
        t = r.trace
        return t.prompt_tokens if self.spec.role == "prefill" else t.prompt_tokens + t.output_tokens

    def try_reserve(self, r: _Req) -> bool:
        n = self.need(r)
        if self.kv_used + n > self.spec.kv_capacity_tokens:
            return False
        self.kv_used += n
        self.kv_allocated += n
        self.kv_peak = max(self.kv_peak, self.kv_used)
        return True

    def release(self, r: _Req) -> None:
        n = self.need(r)
        self.kv_used -= n
        self.kv_freed += n

    def outstanding(self) -> int:
        """The router's load measure: requests here (colocated), prompt tokens still to
        compute (prefill), KV tokens held or promised (decode)."""
        if self.spec.role == "colocated":
            return len(self.waiting) + len(self.prefilling) + len(self.running)
        if self.spec.role == "prefill":
            return sum(r.trace.prompt_tokens - r.prefilled for r in self.waiting) + sum(
                c for _, c in self.plan
            )
        return self.kv_used + sum(self.need(r) for r in self.ready)

    # Scheduling -----------------------------------------------------------------------------
    def schedule(self) -> StepBatch | None:
        """Pick this step's work; None when there is nothing to do."""
        role = self.spec.role
        if role == "decode":
            self._admit_ready()
            return self._decode_only()
        if role == "colocated" and self.spec.chunked_prefill:
            return self._mixed()
        batch = self._whole_prompts()
        if batch is not None or role == "prefill":
            return batch
        return self._decode_only()

    def _admit_ready(self) -> None:
        while (
            self.ready
            and len(self.running) < self.spec.max_num_seqs
            and self.try_reserve(self.ready[0])
        ):
            self.running.append(self.ready.popleft())

    def _decode_only(self) -> StepBatch | None:
        self.plan, self.decoding = [], list(self.running)
        if not self.decoding:
            return None
        batch = StepBatch()
        for r in self.decoding:
            batch = batch + StepBatch.decode(1, r.context)
        return batch

    def _whole_prompts(self) -> StepBatch | None:
        budget = self.spec.max_num_batched_tokens
        plan, used = [], 0
        seats = self.spec.max_num_seqs - len(self.running)
        while self.waiting and len(plan) < seats:
            r = self.waiting[0]
            p = r.trace.prompt_tokens
            if plan and used + p > budget:
                break
            if not self.try_reserve(r):
                break
            self.waiting.popleft()
            plan.append((r, p))
            used += p
        if not plan:
            return None
        self.plan, self.decoding = plan, []
        batch = StepBatch()
        for _, p in plan:
            batch = batch + StepBatch.prefill(p)
        return batch

    def _mixed(self) -> StepBatch | None:
        budget = self.spec.max_num_batched_tokens
        self.decoding = list(self.running)
        batch = StepBatch()
        for r in self.decoding:
            batch = batch + StepBatch.decode(1, r.context)
        budget -= len(self.decoding)
        plan = []
        for r in self.prefilling:
            if budget <= 0:
                break
            chunk = min(r.trace.prompt_tokens - r.prefilled, budget)
            plan.append((r, chunk))
            budget -= chunk
        seats = self.spec.max_num_seqs - len(self.running) - len(self.prefilling)
        while self.waiting and budget > 0 and seats > 0 and self.try_reserve(self.waiting[0]):
            r = self.waiting.popleft()
            self.prefilling.append(r)
            chunk = min(r.trace.prompt_tokens, budget)
            plan.append((r, chunk))
            budget -= chunk
            seats -= 1
        for r, chunk in plan:
            done = r.prefilled + chunk == r.trace.prompt_tokens
            batch = batch + StepBatch.prefill(chunk, past=r.prefilled, samples=done)
        self.plan = plan
        return batch if batch.tokens else None


@dataclass(frozen=True)
class RequestResult:
    """What happened to one request. Times in seconds from the start of the trace."""

    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float
    finish_s: float
    itl_s: tuple[float, ...]
    prefill_instance: int
    decode_instance: int
    kv_bytes_transferred: int
    kv_transfer_s: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None for one-token answers)."""
        if self.output_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class InstanceStats:
    """One instance over the run: steps, busy time and its KV ledger (tokens)."""

    index: int
    name: str
    role: str
    gpu: str
    n_gpus: int
    steps: int
    busy_s: float
    kv_capacity_tokens: int
    kv_allocated_tokens: int
    kv_freed_tokens: int
    kv_peak_tokens: int
    kv_in_use_at_end: int
    usd_per_hour: float
    chunked_prefill: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SimResult:
    """A finished run: every request, every instance, the KV bytes moved."""

    requests: list[RequestResult]
    instances: list[InstanceStats]
    makespan_s: float
    kv_bytes_per_token: int
    kv_bytes_transferred: int
    kv_link: str | None
    n_arrived: int

    @property
    def n_gpus(self) -> int:
        return sum(i.n_gpus for i in self.instances)

    @property
    def mode(self) -> str:
        return "disaggregated" if any(i.role == "prefill" for i in self.instances) else "colocated"

    @property
    def layout(self) -> str:
        """``'8 x TP1 colocated H100-SXM'``, ``'8 x TP1 chunked H100-SXM'``,
        ``'3P:5D TP1 H100-SXM'`` or ``'2P H100-SXM : 6D H200 TP1'``."""
        roles = [i.role for i in self.instances]
        tp = "/".join(f"TP{t}" for t in sorted({i.n_gpus for i in self.instances}))
        if self.mode == "colocated":
            kind = "chunked" if any(i.chunked_prefill for i in self.instances) else "colocated"
            gpus = "/".join(sorted({i.gpu for i in self.instances}))
            return f"{len(roles)} x {tp} {kind} {gpus}".strip()
        pre = "/".join(sorted({i.gpu for i in self.instances if i.role == "prefill"}))
        dec = "/".join(sorted({i.gpu for i in self.instances if i.role == "decode"}))
        p, d = roles.count("prefill"), roles.count("decode")
        if pre != dec:
            return f"{p}P {pre} : {d}D {dec} {tp}"
        return f"{p}P:{d}D {tp} {pre}".strip()


def simulate(
    instances: list[InstanceSpec],
    trace: list[TraceRequest],
    kv_bytes_per_token: int = 0,
    kv_link: Any = None,
) -> SimResult:
    """Run ``trace`` through ``instances`` until every request has its last token.

    Disaggregated clusters (prefill and decode instances, no colocated ones) need ``kv_link``
    (a catalog interconnect key or spec) and ``kv_bytes_per_token`` to time the KV transfers.
    """
    insts = [_Instance(i, s) for i, s in enumerate(instances)]
    roles = {s.role for s in instances}
    if not instances:
        raise ValueError("a cluster needs at least one instance")
    if "colocated" in roles and roles != {"colocated"}:
        raise ValueError("mix colocated instances with prefill/decode ones is not supported")
    if roles != {"colocated"} and roles != {"prefill", "decode"}:
        raise ValueError(
            "a disaggregated cluster needs at least one prefill and one decode instance"
        )
    disagg = roles == {"prefill", "decode"}
    link = None
    if disagg:
        if kv_link is None:
            raise ValueError("a disaggregated cluster needs kv_link (e.g. 'infiniband-ndr400')")
        link = get_interconnect(kv_link) if isinstance(kv_link, str) else kv_link
    _check_fits(insts, trace)
    return _Loop(insts, trace, kv_bytes_per_token, link).run()


def _check_fits(insts: list[_Instance], trace: list[TraceRequest]) -> None:
    for role in {i.spec.role for i in insts}:
        cap = max(i.spec.kv_capacity_tokens for i in insts if i.spec.role == role)
        for t in trace:
            need = t.prompt_tokens if role == "prefill" else t.prompt_tokens + t.output_tokens
            if need > cap:
                raise ValueError(
                    f"request {t.rid} needs {need:,} KV tokens but a {role} instance holds at most "
                    f"{cap:,}: shorten the trace's lengths or give the instance more memory"
                )
            if t.prompt_tokens < 1 or t.output_tokens < 1:
                raise ValueError(
                    f"request {t.rid} must have at least one prompt and one output token"
                )


class _Loop:
    def __init__(self, insts, trace, kv_bytes_per_token, link):
        self.insts, self.link = insts, link
        self.kvb = kv_bytes_per_token
        self.trace = sorted(trace, key=lambda t: (t.arrival_s, t.rid))
        self.events: list = []
        self.counter = itertools.count()
        self.done: list[_Req] = []
        self.now = 0.0
        self.kv_sent = 0

    def push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (t, next(self.counter), kind, payload))

    def run(self) -> SimResult:
        for t in self.trace:
            self.push(t.arrival_s, "arrive", _Req(t))
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(payload)
        return self._result()

    def _pick(self, role: str) -> _Instance:
        candidates = [i for i in self.insts if i.spec.role == role]
        return min(candidates, key=lambda i: (i.outstanding(), i.idx))

    def _kick(self, inst: _Instance) -> None:
        if inst.busy:
            return
        batch = inst.schedule()
        if batch is None:
            return
        duration = float(inst.spec.cost(batch))
        if not duration > 0:
            raise ValueError(f"the cost model gave {duration!r} s for a step of {batch}")
        inst.busy = True
        inst.steps += 1
        inst.busy_s += duration
        self.push(self.now + duration, "step", inst)

    def _on_arrive(self, r: _Req) -> None:
        role = "colocated" if any(i.spec.role == "colocated" for i in self.insts) else "prefill"
        inst = self._pick(role)
        r.prefill_instance = inst.idx
        if role == "colocated":
            r.decode_instance = inst.idx
        inst.waiting.append(r)
        self._kick(inst)

    def _on_step(self, inst: _Instance) -> None:
        inst.busy = False
        for r in inst.decoding:
            r.generated += 1
            r.token_times.append(self.now)
            if r.generated == r.trace.output_tokens:
                self._finish(inst, r)
        inst.running = [r for r in inst.running if r.finish_s is None]
        for r, chunk in inst.plan:
            r.prefilled += chunk
            if r.prefilled < r.trace.prompt_tokens:
                continue
            if r in inst.prefilling:
                inst.prefilling.remove(r)
            r.generated = 1
            r.token_times.append(self.now)
            self._prefill_done(inst, r)
        inst.plan, inst.decoding = [], []
        self._kick(inst)

    def _prefill_done(self, inst: _Instance, r: _Req) -> None:
        if r.trace.output_tokens == 1:
            self._finish(inst, r)
        elif inst.spec.role == "colocated":
            inst.running.append(r)
        else:
            self._send_kv(inst, r)

    def _send_kv(self, inst: _Instance, r: _Req) -> None:
        n_bytes = r.trace.prompt_tokens * self.kvb
        start = max(self.now, inst.link_free_s)
        nics = inst.spec.n_gpus
        seconds = p2p_transfer_s(n_bytes / nics, self.link)
        inst.link_free_s = start + seconds
        r.kv_sent_bytes = n_bytes
        r.kv_transfer_s = inst.link_free_s - self.now
        self.kv_sent += n_bytes
        self.push(inst.link_free_s, "kv", (inst, r))

    def _on_kv(self, payload) -> None:
        src, r = payload
        src.release(r)
        dst = self._pick("decode")
        r.decode_instance = dst.idx
        dst.ready.append(r)
        self._kick(dst)
        self._kick(src)

    def _finish(self, inst: _Instance, r: _Req) -> None:
        r.finish_s = self.now
        inst.release(r)
        self.done.append(r)

    def _result(self) -> SimResult:
        reqs = []
        for r in sorted(self.done, key=lambda r: r.trace.rid):
            times = r.token_times
            reqs.append(
                RequestResult(
                    rid=r.trace.rid,
                    arrival_s=r.trace.arrival_s,
                    prompt_tokens=r.trace.prompt_tokens,
                    output_tokens=r.trace.output_tokens,
                    first_token_s=times[0],
                    finish_s=r.finish_s,
                    itl_s=tuple(b - a for a, b in itertools.pairwise(times)),
                    prefill_instance=r.prefill_instance,
                    decode_instance=r.decode_instance
                    if r.decode_instance is not None
                    else r.prefill_instance,
                    kv_bytes_transferred=r.kv_sent_bytes,
                    kv_transfer_s=r.kv_transfer_s,
                )
            )
        stats = [
            InstanceStats(
                index=i.idx,
                name=i.spec.name or f"{i.spec.role}-{i.idx}",
                role=i.spec.role,
                gpu=i.spec.gpu,
                n_gpus=i.spec.n_gpus,
                steps=i.steps,
                busy_s=i.busy_s,
                kv_capacity_tokens=i.spec.kv_capacity_tokens,
                kv_allocated_tokens=i.kv_allocated,
                kv_freed_tokens=i.kv_freed,
                kv_peak_tokens=i.kv_peak,
                kv_in_use_at_end=i.kv_used,
                usd_per_hour=i.spec.usd_per_hour,
                chunked_prefill=i.spec.chunked_prefill,
            )
            for i in self.insts
        ]
        start = self.trace[0].arrival_s if self.trace else 0.0
        return SimResult(
            requests=reqs,
            instances=stats,
            makespan_s=(max((r.finish_s for r in reqs), default=start) - start),
            kv_bytes_per_token=self.kvb,
            kv_bytes_transferred=self.kv_sent,
            kv_link=self.link.name if self.link is not None else None,
            n_arrived=len(self.trace),
        )
