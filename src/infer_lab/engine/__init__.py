"""A mini LLM serving engine written from scratch: KV cache, paging, batching, prefix caching, chunked prefill.

Start with :class:`Engine` (``engine.py`` explains the API); each idea lives in its own file.
"""

from .bench import generate_text, run_engine_benchmark
from .engine import Engine, EngineConfig, RequestRejected, StepRecord
from .graph_runner import DecodeBatch, StaticDecodeRunner
from .kv_cache import (
    BlockPool,
    ContiguousKVCache,
    KVMemoryReport,
    NoKVCache,
    OutOfKVMemory,
    PagedKVCache,
)
from .model import EngineModel, ModelShape
from .prefix_cache import HashPrefixCache, RadixPrefixCache
from .scheduler import Scheduler, SchedulerConfig
from .sequence import RequestOutput, SamplingParams, Sequence, TokenEvent

__all__ = [
    "BlockPool",
    "ContiguousKVCache",
    "DecodeBatch",
    "Engine",
    "EngineConfig",
    "EngineModel",
    "HashPrefixCache",
    "KVMemoryReport",
    "ModelShape",
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
    "generate_text",
    "run_engine_benchmark",
]
