"""Chapter 12, "Speculative decoding": guess k tokens cheaply, verify them in one target pass.

0. **The textbook model.** Expected tokens per target pass and the speedup, from the acceptance
   rate α, k and the draft's relative cost c (:func:`formula_text`), on sliders.
1. **One request, counted.** The notebook's ``count_passes`` decodes one copy-task prompt plain
   and with n-gram guesses: output tokens, target passes, drafts kept, from the engine's own
   counters, with the engine's real acceptance rule on the page (:func:`acceptance_code`).
2. **Proposers and k.** n-gram prompt lookup and self-speculation (the target's first L
   layers) at k = 1..8 on input-grounded prompts: acceptance, tokens per target pass, target
   passes per output token, the wall-clock speedup over plain decoding of the same engine, and
   the textbook prediction beside every k, with the costs it needs (c, and the price of a
   (k+1)-token verification) measured on this machine.
3. **Workloads.** The same proposer on grounded prompts (copy, edit, quote) and on open-ended
   chat: where speculation pays and where it costs.
4. **Batch size.** Speedup vs concurrent requests, and the roofline of chapter 04 that says where
   the gain vanishes: once a step is compute-bound, the guesses' FLOPs are no longer free.
5. **EAGLE, Medusa, MTP.** What each drafts from and adds to a model, computed from catalog
   configs, next to the speedups their papers report (cited, not measured here).

Every run is greedy and checked token for token against plain decoding. Timings come from the
engine's own step log and wall clock, plain and speculative interleaved after a warm-up
(:mod:`infer_lab.bench.speculative`).

Each experiment is an ``@app.function`` of ``infer_lab/notebooks/12_speculative_decoding.py`` (``count_passes``,
``proposers_by_k``, ``speedup_by_batch``, ``size_mechanisms``); the ``run_*`` functions here execute
those same functions (:func:`~infer_lab.course.notebook_code.notebook_function`), and the rest of
this package shapes what they return for people.

One file per part of the page: ``scenario`` (the chapter's identity and sizes), ``formula`` (section 0,
the textbook model), ``passes`` (1), ``sweep`` (2), ``workloads`` (3), ``batch`` (4), ``variants`` (5),
``shared`` (formats and notes they all use) and ``whole`` (the chapter surface: ``measure``, ``summary``,
``tables``, ``figures``, ``saved``). This file re-exports every name, so ``ch12.<name>`` reads as before.
"""

from __future__ import annotations

from .batch import (  # noqa: F401 (re-exported: the chapter's surface)
    ANALYTIC_BATCHES,
    BATCH_COLUMNS,
    BATCH_LESSON,
    SINGLE_RUN_NOISE,
    VANISHED,
    BatchPoint,
    BatchResult,
    RooflineCurve,
    batch_derivation,
    batch_details,
    batch_figure,
    batch_lead,
    batch_paragraphs,
    batch_result,
    batch_table,
    batch_text,
    batch_trend_text,
    chat_case_note,
    frontier_shift_text,
    roofline_curve,
    run_batch,
    shift_reach_text,
    small_batch_text,
    trend,
)
from .formula import (  # noqa: F401 (re-exported: the chapter's surface)
    formula_figure,
    formula_text,
)
from .passes import (  # noqa: F401 (re-exported: the chapter's surface)
    LOSSLESS_SOURCE,
    PASSES_COLUMNS,
    PassesResult,
    acceptance_code,
    grounded_prompt_ids,
    identical_text,
    passes_figure,
    passes_result,
    passes_table,
    passes_text,
    run_passes,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    ANALYTIC_PARTS,
    K_RANGE,
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    PASSES_K,
    PASSES_PROPOSER,
    SECTIONS,
    SLUG,
    TITLE,
    Sizes,
    sizes,
)
from .shared import (  # noqa: F401 (re-exported: the chapter's surface)
    COLORS,
    _hardware,
    _pct,
    _x,
    lesson_columns,
    prompts_note,
)
from .sweep import (  # noqa: F401 (re-exported: the chapter's surface)
    DETAIL_COLUMNS,
    SWEEP_COLUMNS,
    SWEEP_LESSON,
    AcceptanceDetail,
    SweepResult,
    _acceptance_panels,
    _row_dict,
    _speed_panels,
    acceptance_detail,
    alpha_text,
    cost_text,
    detail_table,
    explained_detail,
    run_sweep,
    sweep_figure,
    sweep_result,
    sweep_table,
    sweep_text,
)
from .variants import (  # noqa: F401 (re-exported: the chapter's surface)
    CHAIN_ALPHAS,
    CHAIN_K,
    CITED_COLUMNS,
    CITED_MODEL,
    MECHANISM_COLUMNS,
    MECHANISM_LESSON,
    TREE_DRAFTING,
    VariantsResult,
    _mechanism_cost,
    above_chain_curves,
    chain_curves_text,
    cited_table,
    mechanisms_table,
    run_variants,
    variants_details,
    variants_figure,
    variants_result,
    variants_text,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    chat_tokens_per_pass,
    figures,
    implausible,
    measure,
    measured_chat_tokens_per_pass,
    saved,
    summary,
    sweep_details,
    tables,
)
from .workloads import (  # noqa: F401 (re-exported: the chapter's surface)
    POINT_COLUMNS,
    WORKLOAD_COLUMNS,
    WORKLOAD_LESSON,
    PromptPoint,
    WorkloadResult,
    points_table,
    run_workloads,
    workloads_details,
    workloads_figure,
    workloads_result,
    workloads_table,
    workloads_text,
)
