"""Chapter 13, "Engines": one load generator against every engine, and the decision chart.

1. The same workload (same prompts, same seed, same concurrency, warm-up) served over HTTP by
   the HF baseline and by our engine with one optimization switched on at a time, measured by
   :mod:`infer_lab.loadgen` (TTFT, ITL, TPOT, E2E percentiles, throughput).
2. A concurrency sweep of one variant: latency against load, and the Pareto frontier of total
   tokens/s against tokens/s per user.

Beside the measurements, analytic material that needs no button: the engine decision chart,
the launch lines for vLLM and SGLang, and the capacity planner's answer to "how many GPUs".
The servers and the launchers live in :mod:`infer_lab.server` and :mod:`infer_lab.launchers`, the
load generator in :mod:`infer_lab.loadgen`, and serving one configuration under load in
:func:`infer_lab.bench.served.serve_and_load`. The experiments are ``@app.function``s of
``infer_lab/notebooks/13_engines.py`` (``serve_variants``, ``concurrency_sweep``); ``run_variants`` and
``run_sweep`` here execute those same functions (:func:`~infer_lab.course.notebook_code.notebook_function`),
and the rest of this package holds the chapter's sizes and shapes results for people.

One file per part of the page: ``scenario`` (the chapter's identity, its variants and sizes), ``workshop`` (the
opening: talk 1's reported runs), ``variants`` (part 1), ``sweep`` (part 2), ``vllm_sglang`` (vLLM and SGLang on
a GPU, and what is saved of them), ``decision_chart`` (the engine decision chart), ``scale_out`` (when one GPU is
not enough), ``shared`` (the served load, the served model and the latency columns both parts use) and ``whole``
(the chapter surface: ``measure``, ``summary``, ``tables``, ``figures``, ``saved``). This file re-exports every
name, so ``ch13.<name>`` reads as before.
"""

from __future__ import annotations

from .decision_chart import (  # noqa: F401 (re-exported: the chapter's surface)
    _SGLANG_REPORTED_HI,
    _SGLANG_REPORTED_LO,
    DECISION_CHART,
    MEASURED_HERE,
    EngineChoice,
    _measured_note,
    decision_chart_frame,
    decision_figure,
    decision_table,
    plot_decision_chart,
)
from .scale_out import (  # noqa: F401 (re-exported: the chapter's surface)
    SCALE_OUT,
    SCALE_OUT_COLUMNS,
    _layout_contrast,
    scale_out_commands,
    scale_out_plan,
    scale_out_table,
    scale_out_text,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    HF_VARIANT,
    NEEDS_MODEL,
    NUMBER,
    OUR_VARIANTS,
    PARTS,
    SLUG,
    TITLE,
    WORKLOAD,
    WORKLOAD_DEFAULTS,
    Sizes,
    sizes,
)
from .shared import (  # noqa: F401 (re-exported: the chapter's surface)
    _EMBEDDED,
    _LATENCY,
    ServedLoad,
    servable_model,
)
from .sweep import (  # noqa: F401 (re-exported: the chapter's surface)
    SWEEP_COLUMNS,
    SweepResult,
    _sweep_words,
    as_loadgen_results,
    run_sweep,
    sweep_figures,
    sweep_result,
    sweep_table,
    sweep_text,
)
from .variants import (  # noqa: F401 (re-exported: the chapter's surface)
    VARIANT_COLUMNS,
    VariantRun,
    VariantsResult,
    _options_text,
    run_variants,
    variants_figure,
    variants_not_run_text,
    variants_result,
    variants_table,
    variants_text,
)
from .vllm_sglang import (  # noqa: F401 (re-exported: the chapter's surface)
    GPU_MODEL,
    GPU_PORT,
    NAMED_ENGINES,
    SavedEngineRun,
    engines_text,
    gpu_commands,
    gpu_note,
    saved_engine_runs,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
from .workshop import (  # noqa: F401 (re-exported: the chapter's surface)
    _SETUP_LOAD,
    BRIEF_SETUP,
    NUMBER_WORDS,
    SHORT_SOURCE,
    TALK_1,
    VLLM_V1_DEFAULT_SINCE,
    WORKSHOP_COLUMNS,
    WORKSHOP_RUNS,
    WORKSHOP_SETUP,
    WORKSHOP_TABLE,
    WORKSHOP_TITLE,
    ReportedRun,
    _change_words,
    _from,
    _number,
    numbers_by_source,
    workshop_table,
    workshop_text,
)
