"""A mini LLM serving engine written from scratch: KV cache, paging, batching, prefix caching, chunked prefill.

Start with :class:`Engine` (``engine.py`` explains the API); each idea lives in its own file:

=================  ===============================================================
``config``         every switch of the engine (:class:`EngineConfig`)
``sequence``       a request as the engine sees it, its sampling settings and events
``sampling``       greedy, temperature, top-k / top-p
``scheduler``      who runs each step: static or continuous batching, chunked prefill
``kv_cache``       where K/V lives: none, contiguous regions, or paged blocks
``prefix_cache``   reusing computed prefixes: hashed blocks or a radix tree
``layers``         RMSNorm, RoPE, attention, SwiGLU: the decoder layer, written once
``prepack``        GEMM weights reordered once for oneDNN (CPU): the fast small-batch path
``gemm_choice``    prepacked or plain GEMMs, chosen by timing both on this machine per batch size
``cpu_decode``     one user's decode step on a CPU, compiled: GEMVs as fused multiply-sum loops
``model``          the decoder over a flat ragged batch of tokens
``graph_runner``   fixed-shape decode steps, replayed from CUDA graphs
``engine``         the step loop that ties them together
=================  ===============================================================

Nothing here plots, benchmarks or demonstrates: the course chapters (:mod:`infer_lab.course`)
and :mod:`infer_lab.bench` do that on top of this package.
"""

from . import cpu_decode, gemm_choice, prepack
from .config import EngineConfig
from .engine import Engine, RequestRejected, StepRecord
from .graph_runner import DecodeBatch, StaticDecodeRunner
from .kv_cache import (
    AttentionMetadata,
    BlockPool,
    ContiguousKVCache,
    KVMemoryReport,
    NoKVCache,
    OutOfKVMemory,
    PagedKVCache,
)
from .layers import LayerFunctions, LayerWeights
from .model import EngineModel, fuse_projections
from .prefix_cache import HashPrefixCache, RadixPrefixCache
from .scheduler import Scheduler, SchedulerConfig
from .sequence import RequestOutput, SamplingParams, Sequence, TokenEvent

__all__ = [
    "AttentionMetadata",
    "BlockPool",
    "ContiguousKVCache",
    "DecodeBatch",
    "Engine",
    "EngineConfig",
    "EngineModel",
    "HashPrefixCache",
    "KVMemoryReport",
    "LayerFunctions",
    "LayerWeights",
    "NoKVCache",
    "OutOfKVMemory",
    "PagedKVCache",
    "RadixPrefixCache",
    "RequestOutput",
    "RequestRejected",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "Sequence",
    "StaticDecodeRunner",
    "StepRecord",
    "TokenEvent",
    "cpu_decode",
    "fuse_projections",
    "gemm_choice",
    "prepack",
]
