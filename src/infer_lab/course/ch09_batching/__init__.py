"""Chapter 09, "Batching": who runs each step, how big the batch is, and what one step costs.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/09_batching.py`` that call the engine and :mod:`infer_lab.bench` directly, called
from the page's visible cells. This module sizes them, draws and describes what they return, and
runs the very same functions for the tour, the tests and the Jupyter edition (``run_*``, through
:mod:`infer_lab.course.notebook_code`).

1. **Static vs continuous, step by step** (counted; ``serve``): ``EngineConfig(policy=...,
   max_num_seqs=...)``, the requests, and the engine's own step records, for both policies, on
   requests with a few long answers among many short ones.
2. **Contenders on one workload** (measured; ``contenders``): the same requests, with varied
   output lengths, all arriving at t = 0, served by each contender of :data:`CONTENDERS`
   (transformers baselines of :mod:`infer_lab.bench.baselines` and the engine with either
   policy) at the same number of batch slots; every contender's tokens are checked against the
   engine's continuous batching.
3. **The Pareto frontier** (measured; ``concurrency_sweep``): total tokens/s vs tokens/s per user
   as ``max_num_seqs`` grows.
4. **Predicted vs measured decode step** (measured; ``predicted_vs_measured``): the roofline on
   this machine's measured ceilings (:mod:`infer_lab.bench.predicted`) next to the engine's step.
5. **Decode paths** (measured; ``decode_paths``): the same decode through each path this device
   has, from one attention call per request to a CUDA-graph replay.

Every timed run goes through :mod:`infer_lab.bench.engine` (warm-up first, every request timed
from its arrival, percentiles). The saved view shows the H200 anchors (a naive CUDA-graph decode
and the HF eager step), labelled as saved.

One file per part of the page: ``scenario`` (the chapter's identity and sizes), ``steps`` (section 1,
static vs continuous step by step), ``batching`` (2, the contenders), ``sweep`` (3, the Pareto frontier),
``predicted`` (4), ``paths`` (5, the decode paths), ``anchors`` (the saved H200 anchors and the launch
overhead they show), ``shared`` (figure helpers several parts use) and ``whole`` (the chapter surface:
``measure``, ``summary``, ``tables``, ``figures``, ``saved``). This file re-exports every name, so
``ch09.<name>`` reads as before.
"""

from __future__ import annotations

from .anchors import (  # noqa: F401 (re-exported: the chapter's surface)
    HF_BASELINE_FILE,
    SOL_FILE,
    AnchorRow,
    _anchor_figure,
    anchor_rows,
    launch_overhead_text,
    load_saved,
)
from .batching import (  # noqa: F401 (re-exported: the chapter's surface)
    BATCHING_COLUMNS,
    CONTENDERS,
    ENGINE_CONTINUOUS,
    ENGINE_NOTE,
    NA,
    SINGLE_RUN_NOISE,
    TRANSFORMERS_DOCS_VERSION,
    BatchingResult,
    BatchingWorkload,
    ContenderRow,
    _versus,
    batching_figure,
    batching_outcome,
    batching_requests,
    batching_result,
    batching_table,
    batching_text,
    batching_workload,
    contender_row,
    contenders_text,
    hf_rows_text,
    run_batching,
    workload_text,
)
from .paths import (  # noqa: F401 (re-exported: the chapter's surface)
    PATHS_COLUMNS,
    PathRow,
    decode_path_variants,
    path_rows,
    paths_figure,
    paths_table,
    paths_text,
    run_paths,
)
from .predicted import (  # noqa: F401 (re-exported: the chapter's surface)
    PREDICTED_COLUMNS,
    PredictedPoint,
    PredictedResult,
    predicted_figure,
    predicted_result,
    predicted_table,
    predicted_text,
    run_predicted,
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
from .shared import (  # noqa: F401 (re-exported: the chapter's surface)
    _plain_log_ticks,
    _wrap,
)
from .steps import (  # noqa: F401 (re-exported: the chapter's surface)
    LONG_SHARE,
    POLICIES,
    StepsResult,
    admission_code,
    idle_slot_steps,
    run_steps,
    skewed_output_lens,
    steps_figure,
    steps_requests,
    steps_text,
)
from .sweep import (  # noqa: F401 (re-exported: the chapter's surface)
    SWEEP_COLUMNS,
    SweepPoint,
    _every_step,
    _log_if_wide,
    dominated_points,
    run_sweep,
    sweep_figure,
    sweep_points,
    sweep_table,
    sweep_text,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
