"""What fits on one GPU: the fit report, the longest context of one user, context against users."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from ...analysis import memory
from ...analysis.memory import ModelLike, as_shape
from ...catalog import get_gpu
from ...units import fmt_bytes
from ..chapter import chapter_number
from ..tables import Column, people_table

# The planner's defaults, read from the functions that apply them (one source for the words and the numbers).
PLANNER_MEMORY_FRACTION: float = inspect.signature(memory.fit).parameters["memory_fraction"].default


@dataclass(frozen=True)
class TradeoffPoint:
    context: int
    max_users: int
    kv_bytes_per_user: int


@dataclass(frozen=True)
class FitView:
    """One workload on one GPU: the fit report, the longest context for one user, the context/users curve."""

    model: str
    gpu: str
    gpu_memory_bytes: int
    kv_dtype: str
    context: int
    users: int
    fit: memory.FitReport
    max_context_one_user: int  # what memory allows, before the model's own limit
    tradeoff: list[TradeoffPoint]
    memory_fraction: float = PLANNER_MEMORY_FRACTION
    prefill_chunk: int = 2048
    context_limit: int = 0  # the model's max_position_embeddings (0: unknown)
    dropped_contexts: tuple[int, ...] = ()  # trade-off contexts past the model's limit, left out


def fit_view(model: ModelLike, gpu: str, context: int, users: int, kv_dtype: str = "bf16",
             contexts: list[int] | None = None) -> FitView:
    """Does ``users`` x ``context`` fit on one ``gpu``, and how context trades against users there."""
    spec = get_gpu(gpu)
    shape = as_shape(model)
    contexts = contexts or [1024 * 2**i for i in range(8)]
    readable = memory.within_limit(shape, contexts)
    report = memory.fit(shape, spec.memory_bytes, context, users=users, kv_dtype=kv_dtype)
    trade = [TradeoffPoint(**r) for r in memory.context_users_tradeoff(shape, spec.memory_bytes, readable,
                                                                        kv_dtype=kv_dtype)]
    return FitView(shape.name, spec.name, spec.memory_bytes, kv_dtype, context, users, report,
                   memory.max_context(shape, spec.memory_bytes, users=1, kv_dtype=kv_dtype), trade,
                   context_limit=memory.context_limit(shape),
                   dropped_contexts=tuple(c for c in contexts if c not in readable))


def fit_text(view: FitView) -> str:
    f = view.fit
    verdict = (f"**Fits**, {fmt_bytes(f.headroom_bytes)} to spare." if f.fits else
               f"**Does not fit**: short by {f.shortfall_bytes:,} B ({fmt_bytes(f.shortfall_bytes)}).")
    return (
        f"{view.model} on one **{view.gpu}** ({fmt_bytes(view.gpu_memory_bytes)}; "
        f"{view.memory_fraction:.0%} usable), {view.users:,} users × {view.context:,} tokens: weights "
        f"{fmt_bytes(f.weight_bytes)}, overhead {fmt_bytes(f.overhead_bytes)}, KV {fmt_bytes(f.kv_needed_bytes)}. "
        f"{verdict} At most **{f.max_users:,} users** at this context; " + one_user_text(view)
        + (f" **{view.model} reads at most {view.context_limit:,} positions, so {view.context:,} tokens is past what "
           "it can serve at all**, whatever the memory." if view.context_limit and view.context > view.context_limit
           else "")
        + (f" The trade-off table stops at the model's limit (left out: {', '.join(f'{c:,}' for c in view.dropped_contexts)} "
           "tokens)." if view.dropped_contexts else "")
    )


def one_user_text(view: FitView) -> str:
    """The longest context of one user: the memory's answer, capped at the model's own limit."""
    if view.context_limit and view.max_context_one_user > view.context_limit:
        return (f"memory would hold one user's KV for {view.max_context_one_user:,} tokens, but {view.model} reads "
                f"at most **{view.context_limit:,} positions**, so that is one user's limit.")
    return f"one user can have up to **{view.max_context_one_user:,} tokens**."


# vLLM's default for ``gpu_memory_utilization``: 0.92 in vLLM's current source (``vllm/config/cache.py``,
# ``CacheConfig.gpu_memory_utilization``, read 2026-12); 0.9 before (vLLM 0.6.4's engine-argument docs,
# docs.vllm.ai/en/v0.6.4/models/engine_args.html). Not tied to a release: the snapshot read names no version,
# and the default of the vLLM this course pins for CPU runs (``local_engines.SPECS``) was not checked.
VLLM_MEMORY_UTILIZATION = 0.92
VLLM_OLD_MEMORY_UTILIZATION = 0.9


def memory_fraction_text(memory_fraction: float = PLANNER_MEMORY_FRACTION) -> str:
    """Where the usable fraction of the GPU's memory comes from: a setting of the planner (and of
    engines), not a property of the GPU."""
    return (f"the planner counts {memory_fraction:.0%} of the GPU's memory as usable: its default `memory_fraction`, "
            "an engine setting rather than a property of the GPU (vLLM's `gpu_memory_utilization` is the same knob: "
            f"current vLLM source, `vllm/config/cache.py`, defaults to {VLLM_MEMORY_UTILIZATION:g}; older releases and "
            f"docs said {VLLM_OLD_MEMORY_UTILIZATION:g}, vLLM 0.6.4's among them). The capacity calculator's "
            f"\"memory fraction\" slider (chapter {chapter_number('capacity_planner')}) changes it")


def fit_intro(prefill_chunk: int = 2048, memory_fraction: float = PLANNER_MEMORY_FRACTION) -> str:
    """How the fit is computed, with the defaults of :func:`infer_lab.analysis.memory.fit`."""
    return (
        f"Usable memory: {memory_fraction_text(memory_fraction)}. After the weights and an overhead term (a "
        f"runtime reserve of {fmt_bytes(memory.DEFAULT_RUNTIME_OVERHEAD_BYTES)} plus the activation workspace of "
        f"a {prefill_chunk:,}-token prefill chunk), the rest is KV budget. At a fixed GPU and model you trade "
        "context length against concurrent users."
    )


TRADEOFF_COLUMNS = [
    Column("context", "context (tokens)", "int"), Column("max_users", "max users", "int"),
    Column("kv_bytes_per_user", "KV per user", "bytes"),
]


def tradeoff_table(view: FitView):
    return people_table(view.tradeoff, TRADEOFF_COLUMNS)
