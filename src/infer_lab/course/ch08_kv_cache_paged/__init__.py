"""Chapter 08, "KV cache and PagedAttention": why the cache exists, and where its memory goes.

The chapter's experiments are the ``@app.function`` of ``infer_lab/notebooks/08_kv_cache_paged.py``, which
call the library directly; this module prepares their inputs and presents their results, and
runs the notebook's own functions (:func:`~infer_lab.course.notebook_code.notebook_function`)
for the tour, the tests, the deck and the Jupyter edition.

1. **No cache vs KV cache** (measured, ``generate_step_by_step``): the same generation through
   the engine with ``kv_mode="nocache"`` (every step recomputes the whole context) and
   ``kv_mode="paged"`` (every step computes one token and reads the cached K/V).
2. **Where KV memory goes** (simulated, no model, ``where_memory_goes``): a mixed workload shares
   a KV budget under three layouts (:mod:`infer_lab.analysis.fragmentation`); every slot of
   every step is classified as used, reserved for future tokens, internal or external
   fragmentation (:mod:`infer_lab.analysis.kv_waste` turns slots into bytes).
3. **How many requests fit** (the engine's own allocators, no model run, ``fill_until_full``):
   :class:`~infer_lab.engine.ContiguousKVCache` and :class:`~infer_lab.engine.PagedKVCache` in
   one budget (:func:`infer_lab.bench.kv_allocators.caches_in_budget`) take the workload's
   requests in order until the next one does not fit.

Times are ``time.perf_counter`` around synchronized engine steps (the engine reads each step's
sampled tokens back to the host). Bytes are counted from the allocators or from slot counts ×
the model's K/V bytes per token.

One file per part of the page: ``scenario`` (the chapter's identity, the figures it cites, the workload's
settings and sizes), ``cache`` (section 1, no cache vs KV cache), ``waste`` (2, where KV memory goes),
``fit`` (3, the engine's allocators, with the paging code the page shows), ``memory_bars`` (the stacked
KV-bytes bars that draw parts 2 and 3) and ``whole`` (the chapter surface: ``measure``, ``summary``,
``tables``, ``figures``, ``saved``, ``gpu_note``). This file re-exports every name, so ``ch08.<name>`` reads
as before.
"""

from __future__ import annotations

from .cache import (  # noqa: F401 (re-exported: the chapter's surface)
    CACHE_COLUMNS,
    KV_MODES,
    CacheResult,
    ModeTotals,
    StepPoint,
    _mean_step,
    cache_figure,
    cache_prompt,
    cache_result,
    cache_table,
    cache_text,
    predicted_tokens_computed,
    run_cache,
)
from .fit import (  # noqa: F401 (re-exported: the chapter's surface)
    FIT_BLOCK_SIZE,
    FIT_COLUMNS,
    FitResult,
    FitRow,
    fit_result,
    fit_table,
    fit_text,
    mean_request_tokens,
    paging_code,
    ratio_cause_text,
    run_fit,
    share_words,
)
from .memory_bars import (  # noqa: F401 (re-exported: the chapter's surface)
    fit_figure,
    kv_waste_figure,
    segments,
    waste_figure,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    ANALYTIC_PARTS,
    BYTES_PER_VALUE,
    LENGTH_DIVISOR,
    NEEDS_MODEL,
    NUMBER,
    PAPER,
    PAPER_THROUGHPUT,
    PAPER_WASTE_BEFORE,
    PAPER_WASTE_PAGED,
    PARTS,
    RATIO_EXPLAINED,
    SLUG,
    TALK_REQUESTS,
    TITLE,
    Sizes,
    WasteSettings,
    sizes,
)
from .waste import (  # noqa: F401 (re-exported: the chapter's surface)
    WASTE_COLUMNS,
    WasteResult,
    budget_slots,
    run_waste,
    waste_problem,
    waste_result,
    waste_table,
    waste_text,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    gpu_note,
    measure,
    saved,
    summary,
    tables,
)
