"""One typed result per engine run: what the engine did, how fast, and what it held.

:class:`EngineRun` is one timed run through a fresh engine (:func:`summarize_run`);
:class:`EngineBenchmark` is what ``infer-lab bench engine`` reports: the run, the configuration it
ran under, and, with ``--compare-hf``, every contender's tokens/s per round. Percentiles are
:class:`~infer_lab.timing.Stats` (in milliseconds), never a repeated ``p50``/``p90``/``p99`` field.
``as_json`` gives the plain dict the CLI prints and saves.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..engine import Engine, EngineConfig, RequestOutput
from ..timing import Stats, summarize
from .ledger import mean_decode_context


def stats_ms(samples_s: list[float]) -> Stats | None:
    """:class:`~infer_lab.timing.Stats` of seconds, in milliseconds; None when there are no samples."""
    return summarize([x * 1e3 for x in samples_s]) if samples_s else None


@dataclass(frozen=True)
class StepSamples:
    """Every step of a run, in order: seconds, requests in the step, prompt and decode tokens."""

    duration_s: list[float]
    num_seqs: list[int]
    prefill_tokens: list[int]
    decode_tokens: list[int]


@dataclass(frozen=True)
class DecodeSteps:
    """The run's pure decode steps (every sequence decodes, none prefills): the ledger's speed.

    ``tokens_per_s`` is decode tokens over those steps' seconds; ``step_bytes`` is what a mean
    step reads (:func:`~.ledger.decode_step_bytes`), None without a KV cache to read."""

    steps: int
    tokens_per_s: float
    mean_batch: float  # sequences decoding per step
    mean_context: float  # tokens each sequence's cache holds, on average over the steps
    step_bytes: int | None = None


@dataclass(frozen=True)
class DecodePathUsed:
    """How the decode steps actually ran (what the engine chose, not only what was asked)."""

    requested: str
    batched_decode: bool
    static_decode: bool
    cuda_graphs: bool
    fused_projections: bool
    prepacked_weights: bool
    gemm_plan: dict[str, Any]
    compiled: bool
    compiled_decode: bool
    compiled_decode_setup_s: float | None  # this engine's; the compile itself ran in the warm-up
    static_steps: int
    graphs_captured: int


@dataclass(frozen=True)
class KVUse:
    """The paged pool: its blocks, the most in use at once, and tokens per block."""

    blocks_total: int
    blocks_peak_used: int
    block_size: int


@dataclass(frozen=True)
class EngineRun:
    """One timed run of every request through a fresh engine: :class:`~infer_lab.timing.Stats` in ms,
    ``*_s`` fields in seconds, speeds per second."""

    requests: int
    output_tokens: int
    elapsed_s: float
    ttft_ms: Stats | None
    itl_ms: Stats | None  # None when every request made one token
    e2e_ms: Stats | None
    steps: int
    mean_batch_size: float  # requests per step
    mean_idle_slots: float  # batch slots left empty per step
    kv: KVUse | None  # None without a paged pool
    prefix_hit_rate: float
    prefix_hit_tokens: int
    num_preemptions: int
    failed_requests: int
    decode: DecodeSteps | None  # None without a pure decode step
    decode_path: DecodePathUsed
    graph_capture_s: float | None  # CUDA graphs captured before the clock started, as a server does
    ttft_samples_s: list[float] = field(repr=False)  # in request order
    e2e_samples_s: list[float] = field(repr=False)  # arrival to last token, in request order
    step_samples: StepSamples = field(repr=False)

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.elapsed_s

    def as_json(self) -> dict[str, Any]:
        """A plain dict (``output_tokens_per_s`` and ``requests_per_s`` included) for JSON."""
        return {**asdict(self), "output_tokens_per_s": self.output_tokens_per_s,
                "requests_per_s": self.requests_per_s}


def decode_steps(engine: Engine, outputs: list[RequestOutput]) -> DecodeSteps | None:
    """The pure decode steps of a finished run (no step bytes yet); None when there was none."""
    decode = [r for r in engine.step_log if r.prefill_tokens == 0 and r.decode_tokens > 0 and not r.failed]
    seconds, tokens = sum(r.duration_s for r in decode), sum(r.decode_tokens for r in decode)
    if not decode or not seconds:
        return None
    lens = ([len(o.prompt_ids) for o in outputs], [len(o.token_ids) for o in outputs])
    return DecodeSteps(len(decode), tokens / seconds, tokens / len(decode), mean_decode_context(*lens))


def decode_path_used(config: EngineConfig, engine: Engine, requested: str) -> DecodePathUsed:
    """What the engine's decode steps ran on, from its config and what it built."""
    runner = engine.decode_runner
    return DecodePathUsed(
        requested=requested, batched_decode=config.batched_decode, static_decode=runner is not None,
        cuda_graphs=bool(runner and runner.use_cuda_graphs), fused_projections=config.fuse_projections,
        prepacked_weights=engine.prepacked_weights, gemm_plan=engine.gemm_plan.as_dict(),
        compiled=config.compile_layers, compiled_decode=config.compiled_decode,
        compiled_decode_setup_s=engine.compile_s, static_steps=runner.steps if runner else 0,
        graphs_captured=len(runner.graphs) if runner else 0)


def summarize_run(engine: Engine, outputs: list[RequestOutput], elapsed_s: float, *,
                  decode: DecodeSteps | None = None, requested_path: str = "auto",
                  graph_capture_s: float | None = None) -> EngineRun:
    """The typed result of a finished engine run (``decode``: its pure decode steps, with bytes)."""
    log, kv, pc = engine.step_log, engine.kv, engine.prefix_cache
    paged = hasattr(kv, "num_used_blocks")
    ttft = [o.ttft_s for o in outputs if o.ttft_s is not None]
    steps = max(len(log), 1)
    return EngineRun(
        requests=len(outputs), output_tokens=sum(len(o.token_ids) for o in outputs), elapsed_s=elapsed_s,
        ttft_ms=stats_ms(ttft), itl_ms=stats_ms([x for o in outputs for x in o.itl_s]),
        e2e_ms=stats_ms([o.e2e_s for o in outputs]), steps=len(log),
        mean_batch_size=sum(r.num_seqs for r in log) / steps, mean_idle_slots=sum(r.idle_slots for r in log) / steps,
        kv=KVUse(kv.num_blocks, kv.peak_blocks_used, engine.config.block_size) if paged else None,
        prefix_hit_rate=pc.stats.hit_rate if pc else 0.0, prefix_hit_tokens=pc.stats.hit_tokens if pc else 0,
        num_preemptions=engine.scheduler.num_preemptions,
        failed_requests=sum(1 for o in outputs if o.finish_reason == "error"),
        decode=decode if decode is not None else decode_steps(engine, outputs),
        decode_path=decode_path_used(engine.config, engine, requested_path), graph_capture_s=graph_capture_s,
        ttft_samples_s=ttft, e2e_samples_s=[o.e2e_s for o in outputs],
        step_samples=StepSamples([r.duration_s for r in log], [r.num_seqs for r in log],
                                 [r.prefill_tokens for r in log], [r.decode_tokens for r in log]))


@dataclass(frozen=True)
class Contender:
    """One contender of ``--compare-hf``: its tokens/s in every round and whether the engine's
    tokens equal its own, request by request."""

    name: str
    tokens_per_s_by_round: list[float]
    identical_to_engine: bool

    @property
    def tokens_per_s(self) -> float:
        """The median over rounds."""
        return statistics.median(self.tokens_per_s_by_round)


@dataclass(frozen=True)
class EngineBenchmark:
    """What ``infer-lab bench engine`` measured: the engine's run and the setting it ran under.

    ``output_tokens_per_s`` and ``decode_tokens_per_s`` are the medians over ``rounds`` (one
    round: the run's own); ``run`` is the engine's last round. ``contenders`` (``--compare-hf``)
    ran the same requests, interleaved with the engine."""

    run: EngineRun
    config: EngineConfig
    workload: dict[str, Any]  # requests, prompt and output lengths, shared prefix, seed
    output_tokens_per_s: float
    decode_tokens_per_s: float | None
    ledger: dict[str, float] | None  # :func:`~.ledger.ledger_row` at decode_tokens_per_s
    rounds: int = 1
    engine_tokens_per_s_by_round: list[float] = field(default_factory=list)
    decode_tokens_per_s_by_round: list[float] = field(default_factory=list)  # the ledger's speed, per round
    contenders: list[Contender] = field(default_factory=list)
    roofline: dict[str, Any] | None = None  # :func:`~.engine.roofline_bounds` (uniform workloads)
    threads: int | None = None
    copy_bandwidth: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None

    def contender(self, name: str) -> Contender | None:
        """The contender called ``name`` (e.g. ``hf-padded``), or None when it did not run."""
        return next((c for c in self.contenders if c.name == name), None)

    def speedup_vs(self, name: str) -> float:
        """The engine's median tokens/s over the contender's."""
        other = self.contender(name)
        if other is None:
            raise KeyError(f"no contender {name!r}; ran: {', '.join(c.name for c in self.contenders) or 'none'}")
        return self.output_tokens_per_s / other.tokens_per_s

    @property
    def fraction_of_roofline_bound(self) -> float | None:
        """The engine's tokens/s over the bound of the workload it ran (uniform workloads only)."""
        if self.roofline is None:
            return None
        return self.output_tokens_per_s / self.roofline["roofline_bound"]["output_tokens_per_s"]

    def as_json(self) -> dict[str, Any]:
        """A plain dict for JSON: every field, the contenders' medians and the engine's ratio to each."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["run"] = self.run.as_json()
        out["config"] = asdict(self.config)
        out["contenders"] = [{**asdict(c), "tokens_per_s": c.tokens_per_s,
                              "engine_speedup": self.speedup_vs(c.name)} for c in self.contenders]
        out["fraction_of_roofline_bound"] = self.fraction_of_roofline_bound
        return out
