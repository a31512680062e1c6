"""Chapter 10, "Prefix caching": hashed blocks (vLLM style) vs a radix tree (SGLang style).

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/10_prefix_caching.py`` that call the engine directly, called from the page's
visible cells. This module sizes them, predicts, draws and describes what they return, and runs
the very same functions for the tour, the tests and the Jupyter edition (``run_*``, through
:mod:`infer_lab.course.notebook_code`).

1. **Match granularity, measured** (counted; ``tokens_reused``): two prompts share their first
   *k* tokens; the engine reports how many prompt tokens each cache handed the second one. The
   prediction (hash: whole blocks; radix: every shared token) is drawn beside the measurement.
   Two choices are kept apart: the lookup structure (hash table or tree) and the granularity,
   which the KV block (page) size sets (:func:`granularity_note`).
2. **Three prefix-sharing workloads** (counted and timed; ``serve_waves``): a shared system
   prompt, multi-turn chat and agentic branching (:mod:`infer_lab.bench.prefix_workloads`), each
   served with no cache, the hash cache and the radix tree: hit rate, prefill tokens computed
   (the exact measure of work saved) and TTFT. A chat's next turn, and an agent's review, quote
   the tokens the engine generated in the wave before, as a real client sends them back.

Prompts are random token ids (prefix reuse depends only on ids) and EOS is ignored, so every
run does exactly the work asked for.

One file per part of the page: ``scenario`` (the chapter's identity, the caches and workloads it
compares, and its sizes), ``granularity`` (section 1, match granularity and the typo argument),
``workloads`` (2, the three workloads and the cited SGLang claim) and ``whole`` (the chapter surface:
``measure``, ``summary``, ``tables``, ``figures``, ``saved``, ``gpu_note``). This file re-exports every
name, so ``ch10.<name>`` reads as before.
"""

from __future__ import annotations

from .granularity import (  # noqa: F401 (re-exported: the chapter's surface)
    _GRANULARITY_WORDS,
    GRANULARITY_COLUMNS,
    SGLANG_DEFAULT_PAGE_SIZE,
    SGLANG_FORCED_PAGE_SIZES,
    SGLANG_VERSION,
    MatchPoint,
    MatchResult,
    granularity_figure,
    granularity_note,
    granularity_rows,
    granularity_table,
    granularity_text,
    match_result,
    predicted_reuse,
    radix_match_code,
    run_granularity,
    shared_lengths,
    typo_position,
    typo_reuse,
    typo_text,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    CACHES,
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    SLUG,
    TITLE,
    WORKLOADS,
    Sizes,
    sizes,
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
from .workloads import (  # noqa: F401 (re-exported: the chapter's surface)
    SGLANG_AGENTIC_CLAIM,
    TTFT_TOLERANCE,
    WORKLOAD_COLUMNS,
    WorkloadRun,
    WorkloadsResult,
    _generated_words,
    generated_tokens_reused,
    run_workloads,
    sglang_claim_text,
    sglang_claim_words,
    shared_prompt_prediction,
    shared_prompt_prediction_text,
    ttft_vs_work_text,
    workload_run,
    workload_waves,
    workloads_figure,
    workloads_table,
    workloads_text,
)
