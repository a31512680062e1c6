"""Chapter 06, "Quantization": fewer bytes per weight, and the quality price measured on real weights.

1. Formats: every linear layer quantized with each format, its reconstruction error measured.
   The embedded model's "fp32" weights were dequantized from a Q4_1 GGUF, so re-quantizing to
   Q4_1 with the same groups of 32 gives them back exactly: the baseline is already 4-bit.
2. Methods side by side: exact weight bytes, decode speed, perplexity and top-1 agreement.
3. Outlier features in the activations: why one scale per row fails (LLM.int8's motivation).
4. KV-cache quantization: int8 / fp8 with one scale per token per head.

Analytic and saved parts need no button: which big model fits one GPU in which format (the
memory model), and bitsandbytes on an H200 (saved): int8 reads half the bytes of bf16 and is
slower. The quantizers themselves are library code in :mod:`infer_lab.quant`.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/06_quantization.py`` (``layer_errors``, ``quantize_and_compare``,
``outlier_features``, ``kv_cache_quality``) that call :mod:`infer_lab.quant` directly. This module
sizes them, turns what they return into typed results, figures, tables and words, and runs the
very same functions for the tour, the tests and the Jupyter edition (``run_*``, through
:mod:`infer_lab.course.notebook_code`).

One file per part of the page: ``scenario`` (the chapter's identity and sizes), ``formats`` (section 1,
with the note that the baseline is already 4-bit and its measured proof), ``compare`` (2, methods side
by side), ``outliers`` (3), ``kv`` (4, the KV cache), ``bnb`` (bitsandbytes on an H200, saved), ``fit``
(which big model fits one GPU, analytic) and ``whole`` (the chapter surface: ``Result``, ``measure``,
``summary``, ``tables``, ``figures``, ``saved``). This file re-exports every name, so ``ch06.<name>``
reads as before.
"""

from __future__ import annotations

from ...quant.formats import NF4_FORMAT  # noqa: F401 (the notebook reads ch06.NF4_FORMAT)
from .bnb import (  # noqa: F401 (re-exported: the chapter's surface)
    BNB_SHAPE,
    FORMAT_BITS,
    WEIGHT_READ_COLUMNS,
    WeightRead,
    bnb_text,
    weight_reads,
)
from .compare import (  # noqa: F401 (re-exported: the chapter's surface)
    COMPARE_COLUMNS,
    Comparison,
    MethodRow,
    _method_row,
    compare_figure,
    compare_table,
    compare_text,
    comparison_result,
    guess_text,
    run_compare,
)
from .fit import (  # noqa: F401 (re-exported: the chapter's surface)
    FIT_DTYPES,
    FIT_GPUS,
    FIT_MODELS,
    FitRow,
    fit_rows,
    fit_table,
    gpt_oss_text,
    nf4_scheme_text,
    qat_vs_ptq_text,
    scale_schemes_text,
    shipped_format_text,
)
from .formats import (  # noqa: F401 (re-exported: the chapter's surface)
    FORMAT_COLUMNS,
    ORIGIN_GROUP,
    FormatsResult,
    FormatSummary,
    LayerError,
    baseline_note,
    baseline_proof,
    formats_figure,
    formats_result,
    formats_table,
    formats_text,
    group_quantize_code,
    run_formats,
)
from .kv import (  # noqa: F401 (re-exported: the chapter's surface)
    DTYPE_BYTES,
    KV_COLUMNS,
    KV_DTYPES,
    KVResult,
    dtype_label,
    kv_result,
    kv_table,
    kv_text,
    run_kv,
)
from .outliers import (  # noqa: F401 (re-exported: the chapter's surface)
    FROM_SCRATCH_PARTS,
    OUTLIER_COLUMNS,
    OUTLIER_LAYER,
    OUTLIER_PROMPT,
    OutlierRow,
    median_feature_steps,
    outlier_rows,
    outliers_figure,
    outliers_table,
    outliers_text,
    run_outliers,
    weight_only_text,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    ALL_METHODS,
    FORMAT_GROUP,
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    SLUG,
    TITLE,
    Sizes,
    format_methods,
    part_number,
    sizes,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
