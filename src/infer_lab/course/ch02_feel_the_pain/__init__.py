"""Chapter 02, "Feel the pain": the four problems of serving an LLM, measured on your machine.

1. Memory grows with tokens and with users (KV bytes counted from the cache tensors).
2. Time to first token grows with context length (prefill).
3. Naive serving runs requests one after another.
4. Each decode step (the inter-token latency) costs a full read of the weights and the KV.

Each part is predict -> run -> compare. The prediction (from the config alone, through
:mod:`infer_lab.analysis`) is on the page first, with a guess field where it teaches. The
experiments are the notebook's own ``@app.function`` s (``kv_after_prefill``, ``ttft_by_prompt``,
``serve_one_by_one_then_batched``, ``decode_step_times`` in ``infer_lab/notebooks/02_feel_the_pain.py``),
which call :func:`infer_lab.harness.timed_generate` directly; this module turns what they return
into results, figures, tables and words, and runs the same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

Every timing goes through :mod:`infer_lab.harness` (warm-up, synchronization, repeats,
percentiles). The prompts are random token ids and EOS is ignored, so every run has exactly
the length asked for.

One file per part of the page: ``scenario`` (the chapter's identity and sizes), ``kv_memory`` (section 1,
KV memory by tokens and users), ``ttft`` (2, time to first token), ``serving`` (3, one by one, then
batched), ``itl`` (4, the decode step), ``baseline`` (the saved H200 HF-eager baseline other chapters
quote), ``shared`` (the model's shape, a decode step's bytes and the verdicts several parts use) and
``whole`` (the chapter surface: ``measure``, ``summary``, ``tables``, ``figures``, ``saved``). This file
re-exports every name, so ``ch02.<name>`` reads as before.
"""

from __future__ import annotations

from .baseline import (  # noqa: F401 (re-exported: the chapter's surface)
    saved_batch1_steps_ms,
    saved_batch1_text,
    saved_warning,
)
from .itl import (  # noqa: F401 (re-exported: the chapter's surface)
    ITL_COLUMNS,
    ITLPlan,
    ITLPoint,
    itl_batch_pairs,
    itl_figure,
    itl_plan,
    itl_plan_for,
    itl_points,
    itl_prediction,
    itl_table,
    itl_text,
    itl_verdict,
    left_out_text,
    run_itl,
)
from .kv_memory import (  # noqa: F401 (re-exported: the chapter's surface)
    MEMORY_COLUMNS,
    MemoryPoint,
    MemoryResult,
    memory_figure,
    memory_panels_text,
    memory_prediction,
    memory_result,
    memory_table,
    memory_text,
    predicted_kv_bytes_per_token,
    run_memory,
    users_panel_context,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    SLUG,
    TITLE,
    Sizes,
    sizes,
)
from .serving import (  # noqa: F401 (re-exported: the chapter's surface)
    SERVING_COLUMNS,
    RequestTimes,
    ServingResult,
    run_serving,
    serving_compare_text,
    serving_figure,
    serving_prediction,
    serving_result,
    serving_rows,
    serving_table,
    serving_text,
)
from .shared import (  # noqa: F401 (re-exported: the chapter's surface)
    CONTRADICTED,
    INCONCLUSIVE,
    SINGLE_RUN_NOISE,
    SUPPORTED,
    _shape_dtype,
    decode_bytes,
    guess_line,
    noise_band,
    noise_band_text,
    noise_outcome,
    verdict,
)
from .ttft import (  # noqa: F401 (re-exported: the chapter's surface)
    TTFT_COLUMNS,
    TTFTPoint,
    prefill_flops,
    run_ttft,
    ttft_compare_text,
    ttft_figure,
    ttft_points,
    ttft_prediction,
    ttft_ratio,
    ttft_table,
    ttft_text,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
