"""Chapter 04, "Prefill vs decode and the roofline": predicted op by op, then measured here.

1. On a datasheet GPU (analytic, live in the notebook): every op of a prefill and of a decode
   step, its FLOPs, bytes and arithmetic intensity, and ``max(FLOPs / peak, bytes / bandwidth)``
   (:mod:`infer_lab.analysis.roofline`).
2. On this machine (measured): the same arithmetic on the ceilings measured here, next to what
   the harness measures (:func:`infer_lab.bench.hf_predicted.predicted_vs_measured`): bytes must
   agree to within 1 %; times do not, and the ratio is the lesson.

Both are the notebook's own code: ``datasheet_prediction`` and ``roofline_vs_harness``, the
``@app.function`` s of ``infer_lab/notebooks/04_prefill_decode_roofline.py`` that call the library directly.
This module shows what they return and runs the same functions for the tour, the tests and the
Jupyter edition (:func:`datasheet_view`, :func:`run_compare`, through
:mod:`infer_lab.course.notebook_code`).

One file per part of the page: ``scenario`` (the chapter's identity and sizes), ``datasheet`` (part 1,
the prediction on a datasheet GPU), ``compare`` (2, predicted vs measured on this machine), ``shared`` (each
op's row on a roof, a predicted-vs-measured row and the roofline figure both parts draw), ``foundations`` (the memory hierarchy and why
decode waits on memory, for the deck and chapters 01 and 16) and ``whole`` (the chapter surface: ``Result``,
``measure``, ``summary``, ``tables``, ``figures``, ``saved``). This file re-exports every name, so
``ch04.<name>`` reads as before.
"""

from __future__ import annotations

from .compare import (  # noqa: F401 (re-exported: the chapter's surface)
    COMPARE_COLUMNS,
    CompareResult,
    _comparison_row,
    attention_implementation,
    compare_figure,
    compare_result,
    compare_table,
    compare_text,
    comparison_records,
    decode_ratio_text,
    ratio_figure,
    run_compare,
    save_compare,
)
from .datasheet import (  # noqa: F401 (re-exported: the chapter's surface)
    OP_COLUMNS,
    DatasheetView,
    datasheet_figure,
    datasheet_text,
    datasheet_view,
    datasheet_view_of,
    decode_intensity_text,
    ops_table,
    prefill_bound_text,
    prefill_crossover_tokens,
    roof_code,
)
from .foundations import (  # noqa: F401 (re-exported: the chapter's surface)
    TALK_DECODE_WAIT,
    DecodeWait,
    HierarchyRow,
    decode_wait,
    decode_wait_curve,
    decode_wait_figure,
    decode_wait_table,
    decode_wait_text,
    hierarchy_figure,
    hierarchy_rows,
    hierarchy_table,
    hierarchy_text,
    talk_wait_judgement,
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
    COLORS,
    ComparisonRow,
    OpRow,
    _short_op,
    op_rows,
    roofline_figure,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
