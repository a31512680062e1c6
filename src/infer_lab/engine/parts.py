"""The engine's components, and which of them replace the library's own.

An :class:`~.engine.Engine` is assembled from eight components, each a file of this package with
one small interface:

==================  ================================  =========================================
component           the library's                     what it does
==================  ================================  =========================================
``forward``         :func:`.model.forward_tokens`     the model over a flat batch of tokens
``block_manager``   :class:`.BlockManager`            free list, reference counts, block tables
``kv_store``        :class:`.kv_store.PagedKVStore`   K/V written and attended through tables
``scheduler``       :class:`.Scheduler`               who runs each step, how many tokens
``step_loop``       :mod:`.step_loop`                 schedule -> forward -> sample -> free
``sampler``         :class:`.sampling.Sampler`        next tokens, speculative verification
``prefix_cache``    :class:`.RadixPrefixCache`        reuse of cached prompt prefixes
``proposer``        :class:`.proposers.NgramProposer` speculative guesses by prompt lookup
==================  ================================  =========================================

:class:`EngineParts` names replacements (the course's build track passes a learner's); every
component it leaves as ``None`` is the library's. The replacements are constructed the way the
engine constructs its own, with the arguments listed on each field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

COMPONENTS = ("forward", "block_manager", "kv_store", "scheduler", "step_loop", "sampler", "prefix_cache",
              "proposer")


@dataclass(frozen=True)
class EngineParts:
    """Components to use instead of the library's (``None``: the library's).

    Attributes:
        forward: ``forward(model, token_ids, positions, attend, rows) -> logits``
            (see :func:`~.model.forward_tokens`).
        block_manager: ``block_manager(num_blocks, block_size)`` -> a block manager
            (see :class:`~.block_manager.BlockManager`).
        kv_store: ``kv_store(num_blocks, block_size, layers, kv_heads, head_dim, dtype, device)``
            -> a store (see :class:`~.kv_store.PagedKVStore`).
        scheduler: ``scheduler(config: SchedulerConfig, kv)`` -> a scheduler
            (see :class:`~.scheduler.Scheduler`).
        step_loop: an object (a module) with ``step(engine)`` and ``finish(engine, seq, reason,
            error=None)`` (see :mod:`~.step_loop`).
        sampler: ``sampler()`` -> a sampler (see :class:`~.sampling.Sampler`).
        prefix_cache: ``prefix_cache(kv)`` -> a radix prefix cache, used when the config asks for
            ``prefix_cache="radix"`` (see :class:`~.prefix_cache.RadixPrefixCache`).
        proposer: ``proposer(max_n)`` -> an n-gram proposer, used when the config asks for
            ``speculative="ngram[:N]"`` (see :class:`~.proposers.NgramProposer`).
    """

    forward: Any = None
    block_manager: Any = None
    kv_store: Any = None
    scheduler: Any = None
    step_loop: Any = None
    sampler: Any = None
    prefix_cache: Any = None
    proposer: Any = None

    def replaced(self) -> list[str]:
        """The components given here, in :data:`COMPONENTS` order."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    @property
    def needs_paged_kv(self) -> bool:
        """Every replacement but the sampler and the step loop works on paged KV."""
        return any(getattr(self, name) is not None for name in ("forward", "block_manager", "kv_store",
                                                                 "prefix_cache"))
