"""A mini LLM serving engine written from scratch: KV cache, paging, batching, prefix caching, chunked prefill.

Start with :class:`Engine` (``engine.py`` explains the API); each idea lives in its own file:

=================  ===============================================================
``config``         every switch of the engine (:class:`EngineConfig`)
``sequence``       a request as the engine sees it, its sampling settings and events
``parts``          the components an engine is assembled from, and replacing them
``sampling``       greedy, temperature, top-k / top-p, speculative verification (the sampler)
``scheduler``      who runs each step: static or continuous batching, chunked prefill
``step_loop``      one step: schedule -> forward -> sample -> postprocess -> free
``block_manager``  KV blocks: free list, reference counts, block tables
``kv_store``       K/V in slots, written and attended through block tables
``kv_cache``       where K/V lives: none, contiguous regions, or paged blocks (manager + store)
``prefix_cache``   reusing computed prefixes: hashed blocks or a radix tree
``layers``         RMSNorm, RoPE, attention, SwiGLU: the decoder layer, written once
``prepack``        GEMM weights reordered once for oneDNN (CPU): the fast small-batch path
``gemm_choice``    prepacked or plain GEMMs, chosen by timing both on this machine per batch size
``cpu_decode``     one user's decode step on a CPU, compiled: GEMVs as fused multiply-sum loops
``model``          the decoder over a flat ragged batch of tokens
``graph_runner``   fixed-shape decode steps, replayed from CUDA graphs
``executor``       one forward pass over a scheduled step, with every fast path
``engine``         the lifecycle: builds the parts, takes requests, streams each step's tokens
=================  ===============================================================

Nothing here plots, benchmarks or demonstrates: the course chapters (:mod:`infer_lab.course`)
and :mod:`infer_lab.bench` do that on top of this package.
"""

from .block_manager import BlockManager
from .config import EngineConfig
from .cpu import cpu_decode, gemm_choice, prepack
from .engine import Engine, RequestRejected, StepRecord
from .graph_runner import DecodeBatch, StaticDecodeRunner
from .kv_cache import (
    AttentionMetadata,
    ContiguousKVCache,
    KVMemoryReport,
    NoKVCache,
    OutOfKVMemory,
    PagedKVCache,
)
from .layers import LayerFunctions, LayerWeights
from .model import EngineModel, forward_tokens, fuse_projections
from .parts import EngineParts
from .prefix_cache import HashPrefixCache, RadixPrefixCache
from .sampling import Sampler
from .scheduler import Scheduler, SchedulerConfig
from .sequence import RequestOutput, SamplingParams, Sequence, TokenEvent

__all__ = [
    "AttentionMetadata",
    "BlockManager",
    "ContiguousKVCache",
    "DecodeBatch",
    "Engine",
    "EngineConfig",
    "EngineModel",
    "EngineParts",
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
    "Sampler",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "Sequence",
    "StaticDecodeRunner",
    "StepRecord",
    "TokenEvent",
    "cpu_decode",
    "forward_tokens",
    "fuse_projections",
    "gemm_choice",
    "prepack",
]
