"""Chapter 14, "Tensor parallelism": one model split over two processes, for real, and scaled up.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/14_tensor_parallel.py`` that call :mod:`infer_lab.parallel` and
:mod:`infer_lab.analysis` directly, called from the page's visible cells. This module sizes them,
draws and describes what they return, and runs the very same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

1. **Tensor parallelism, run** (``tensor_parallel``): the embedded model split over 2 CPU
   processes (gloo), token for token the same as one process and as transformers; every
   all-reduce counted (2 x layers per step, tokens x hidden x 4 B each in fp32, as
   :func:`infer_lab.analysis.collectives.tp_allreduces` predicts) and timed; the all-reduce cost
   fitted (latency + bandwidth) and held against the step time.
2. **Scaling on catalogued GPUs** (``tp_scaling``, analytic): TP 1/2/4/8 ITL is sublinear; on
   PCIe replicas beat TP; the Pareto frontier of speed vs throughput per GPU with energy and $ per
   token; the "fast mode" a public talk on inference described (spending what seems to be about 6x the
   tokens, read as a price, for 2x speed), computed.

Serving many GPUs as a cluster (prefill/decode disaggregation, heterogeneous hardware, the
planner's launch commands, the simulator checked against the engine) is chapter 15. Our engine
does not pretend to be a distributed engine: part 1 is the mechanism, small enough to read.

One file per part of the page: ``scenario`` (the chapter's identity, its sizes and the talk's numbers
it quotes), ``split`` (part 1 before the run: the split rule, the replicated vocabulary, the layer's
code, the prediction), ``tp`` (part 1's run: result, tables, figure), ``tp_findings`` (its findings in
words), ``scaling`` (part 2: results and tables), ``scaling_findings`` (its findings in words),
``scaling_figures`` (its figures) and ``whole`` (the chapter surface: ``measure``, ``summary``,
``tables``, ``figures``, ``saved``). This file re-exports every name, so ``ch14.<name>`` reads as before.
"""

from __future__ import annotations

from .scaling import (  # noqa: F401 (re-exported: the chapter's surface)
    FRONTIER_COLUMNS,
    LAYOUT_COLUMNS,
    LAYOUT_LESSON,
    SCALING_COLUMNS,
    SCALING_GPUS,
    SCALING_LESSON,
    SMALL_MODEL_COLUMNS,
    SMALL_MODEL_LESSON,
    LayoutRow,
    ScalingResult,
    ScalingRow,
    TalkPoint,
    _layout_rows,
    _scaling_row,
    _scaling_rows,
    lesson_columns,
    run_scaling,
    scaling_result,
    scaling_tables,
    talk_compute_point,
)
from .scaling_figures import (  # noqa: F401 (re-exported: the chapter's surface)
    NOT_FITTING_ALPHA,
    _line_span,
    _place_clear_of_lines,
    frontier_figure,
    scaling_figures,
    tp_scaling_figure,
    tp_scaling_title,
)
from .scaling_findings import (  # noqa: F401 (re-exported: the chapter's surface)
    SCALING_FINDINGS,
    _by_batch,
    _layout_step,
    allreduce_reason_text,
    fixed_batch_text,
    scaling_finding,
    scaling_paragraphs,
    scaling_text,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    ANALYTIC_PARTS,
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    SCALING_BATCH,
    SCALING_CONTEXT,
    SCALING_MODEL,
    SLUG,
    TALK_FAST_MODE_COMPUTE,
    TALK_FAST_MODE_SPEEDUP,
    TALK_TP_SPEEDUP_AT_4,
    TITLE,
    TP_QUESTIONS,
    TP_WORLD_SIZE,
    Sizes,
    sizes,
)
from .split import (  # noqa: F401 (re-exported: the chapter's surface)
    SPLIT_COLUMNS,
    VOCAB_PARALLEL_COLLECTIVES,
    SplitRow,
    allreduce_prediction,
    collectives_per_step,
    layer_code,
    model_shape_of,
    prediction_text,
    replicated_vocab_text,
    split_rows,
    split_table,
    split_text,
)
from .tp import (  # noqa: F401 (re-exported: the chapter's surface)
    SWEEP_COLUMNS,
    TP_STEP_COLUMNS,
    TP_STEP_LESSON_COLUMNS,
    StepRow,
    TPResult,
    _step_row,
    _threads_label,
    run_tp,
    sweep_table,
    tp_figure,
    tp_model,
    tp_prompts,
    tp_result,
    tp_steps_table,
)
from .tp_findings import (  # noqa: F401 (re-exported: the chapter's surface)
    tp_derivation,
    tp_details,
    tp_finding,
    tp_lead,
    tp_paragraphs,
    tp_text,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
