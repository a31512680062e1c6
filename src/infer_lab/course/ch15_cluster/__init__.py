"""Chapter 15, "The cluster": serving one model on many GPUs, simulated, and the simulator checked.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/15_cluster.py`` that call :mod:`infer_lab.cluster`, :mod:`infer_lab.analysis` and
:mod:`infer_lab.launchers` directly, called from the page's visible cells. This module sizes them,
draws and describes what they return, and runs the very same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

1. **Serving a cluster** (``serve_cluster``, ``throughput_ceiling``; the simulator): colocated vs
   prefill/decode disaggregated, for a prefill-heavy (summarize) and a decode-heavy (story)
   workload: TTFT/ITL percentiles, goodput per GPU, the best P:D, the tail ITL, and the throughput
   ceiling.
2. **Heterogeneous hardware** (``heterogeneous``: prefill on compute, decode on bandwidth), the
   cited wafer-scale data point, and the attention/FFN split of a large MoE (``attention_ffn_split``,
   analytic).
3. **The planner's answer** (``plan_cluster``) and the exact vLLM / SGLang launch commands for it.
4. **The simulator checked** (``simulator_vs_engine``) against our engine's measured
   continuous-batching run: the same steps, and totals within stated tolerances.

Chapter 14 split one model over two processes; this chapter is what a fleet does with many GPUs.
Our engine stays on one device: the launch commands of part 3 are how to serve across GPUs for real.

One file per part of the page: ``scenario`` (the chapter's identity, the settings its experiments share
and the sizes), ``cluster`` (part 1, the simulated cluster), ``hetero`` (2, heterogeneous hardware, the
wafer-scale data point and the attention/FFN split), ``plan`` (3, the planner and its launch commands),
``check`` (4, the simulator against our engine) and ``whole`` (the chapter surface: ``measure``,
``summary``, ``tables``, ``figures``, ``saved``). This file re-exports every name, so ``ch15.<name>``
reads as before.
"""

from __future__ import annotations

from .check import (  # noqa: F401 (re-exported: the chapter's surface)
    CHECK_COLUMNS,
    R2_FLOOR,
    check_model,
    check_prompts,
    check_table,
    check_text,
    run_check,
)
from .cluster import (  # noqa: F401 (re-exported: the chapter's surface)
    MODE_COLUMNS,
    QUANTILES,
    ClusterResult,
    ModeRow,
    WorkloadRun,
    _itl_quantiles,
    _mode_row,
    _pd_counts,
    cluster_figure,
    cluster_result,
    cluster_text,
    pools_text,
    run_cluster,
)
from .hetero import (  # noqa: F401 (re-exported: the chapter's surface)
    AFD_COLUMNS,
    FITNESS_COLUMNS,
    HETERO_LABELS,
    HeteroResult,
    WaferPoint,
    cited_pairing_text,
    cluster_usd_per_hour,
    hetero_result,
    hetero_text,
    run_hetero,
    wafer_point,
    wafer_rows,
    wafer_text,
)
from .plan import (  # noqa: F401 (re-exported: the chapter's surface)
    NIXL_SIDE_CHANNEL_BASE,
    PD_FRONT_PORT,
    PD_PORTS,
    VLLM_PD_PROXY,
    PlanResult,
    pd_commands,
    pd_gpus,
    pd_gpus_text,
    plan_result,
    plan_text,
    run_plan,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    AFD_CONTEXT,
    AFD_GPU,
    AFD_GPUS,
    AFD_MODEL,
    ANALYTIC_PARTS,
    CHECK_QUESTIONS,
    CHECK_SLOTS,
    CLUSTER_GPUS,
    HETERO_GPUS,
    HETERO_SPLIT,
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    SERVING_SLO,
    SLUG,
    TITLE,
    WORKLOADS,
    Sizes,
    sizes,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    cluster_tables,
    figures,
    hetero_tables,
    measure,
    plan_tables,
    saved,
    summary,
    tables,
)
