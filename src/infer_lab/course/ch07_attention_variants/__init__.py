"""Chapter 07, "Attention variants and FlashAttention": cache less per token, and what it costs.

Measured (behind buttons):

1. Every variant (MHA, GQA, MQA, sliding window, MLA naive and absorbed) and the tiled
   online-softmax attention equal torch SDPA, in prefill and in token-by-token cached decode.
2. The quality price on real weights: SmolLM2's GQA mean-pooled to MQA, a sliding window, and
   (at full size) int8/fp8 KV caches, by perplexity on the shipped text.
3. This machine's SDPA backends across lengths, and decode attention time vs KV heads.

Analytic (live): KV bytes per token and max users per variant on real shapes, the MLA ratio
against each baseline, the scorecard, constant-state architectures, FlashAttention's HBM
bytes and the roofline decode time vs KV heads. The layers are library code in
:mod:`infer_lab.attention`; the timing is :mod:`infer_lab.bench.attention`.

The measured parts are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/07_attention_variants.py`` (``against_sdpa``, ``attention_quality``,
``attention_times``) that call the library directly. This module sizes them, shows what they
return, and runs the very same functions for the tour, the tests and the Jupyter edition
(``run_*``, through :mod:`infer_lab.course.notebook_code`).

One file per part of the page: ``scenario`` (the chapter's identity, the GPU and context its analytic
parts default to, and sizes), ``equivalence`` (part 1, with the online-softmax tile), ``memory`` (2, KV
memory per variant), ``mla`` (2, the MLA ratio against each baseline and the talk's claim), ``quality``
(3), ``card`` (4, the scorecard), ``beyond_kv`` (5, constant-state architectures and DSA's sparse reads),
``flash`` (6, FlashAttention's HBM traffic), ``roofline`` (7, decode time vs KV heads), ``timing`` (8),
``shared`` (what several parts use) and ``whole`` (the chapter surface: ``measure``, ``summary``,
``tables``, ``figures``, ``saved``). This file re-exports every name, so ``ch07.<name>`` reads as before.
"""

from __future__ import annotations

from ...analysis import memory as kv_memory  # noqa: F401 (re-exported, as the single module had it)
from ...attention import (  # noqa: F401 (re-exported, as the single module had it)
    PAPER_HBM_TRAFFIC,
    CitedHBMTraffic,
    FlashTiling,
    naive_attention_hbm_bytes,
    online_softmax_tile,
    score_matrix_bytes,
    tiled_attention_hbm_bytes,
)
from ...attention.kv_sizing import (  # noqa: F401 (re-exported, as the single module had it)
    DSA_TOP_K,
    WEIGHT_SPARE,
    MLARatio,
    PredictedDecode,
    ScorecardRow,
    SparseRead,
    StateSize,
    VariantMemory,
    constant_state_models,
    decode_time_vs_kv_heads,
    dsa_read_per_step,
    mla_ratio_explained,
    scorecard,
    variant_memory_table,
)
from ...attention.quality import VariantQuality  # noqa: F401 (re-exported, as the single module had it)
from ...bench.attention import BackendTime, DecodeAttentionTime  # noqa: F401 (re-exported, as the single module had it)
from ...catalog import (  # noqa: F401 (re-exported, as the single module had it)
    OnChipMemory,
    get_gpu,
    get_on_chip_memory,
    gpu_catalog_about,
)
from ...figures import finish  # noqa: F401 (re-exported, as the single module had it)
from ...hardware import device_label  # noqa: F401 (re-exported, as the single module had it)
from ...units import fmt_bytes, human  # noqa: F401 (re-exported, as the single module had it)
from ..ch06_quantization import baseline_note  # noqa: F401 (re-exported, as the single module had it)
from ..chapter import NO_MODEL, ChapterResult, choose_size, run_parts  # noqa: F401 (re-exported, as the single module had it)
from ..library_code import code_block  # noqa: F401 (re-exported, as the single module had it)
from ..notebook_code import notebook_function  # noqa: F401 (re-exported, as the single module had it)
from ..saved import SavedView, load_saved  # noqa: F401 (re-exported, as the single module had it)
from ..tables import Column, people_table  # noqa: F401 (re-exported, as the single module had it)
from .beyond_kv import (  # noqa: F401 (re-exported: the chapter's surface)
    DSA_TOP_K_RANGE,
    STATE_COLUMNS,
    dsa_reads,
    dsa_text,
    state_table,
)
from .card import (  # noqa: F401 (re-exported: the chapter's surface)
    SCORECARD_COLUMNS,
    quality_notes,
    scorecard_figure,
    scorecard_rows,
    scorecard_table,
)
from .equivalence import (  # noqa: F401 (re-exported: the chapter's surface)
    EQUIVALENCE_COLUMNS,
    EQUIVALENCE_KV_HEADS,
    EQUIVALENCE_TOKENS,
    EQUIVALENCE_TOL,
    EQUIVALENCE_WINDOW,
    EquivalenceRow,
    equivalence_rows,
    equivalence_table,
    equivalence_text,
    flash_tile_code,
    run_equivalence,
)
from .flash import (  # noqa: F401 (re-exported: the chapter's surface)
    FLASH_COLUMNS,
    FLASH_LENGTHS,
    FLASH_SHAPE,
    FLASH_SHARED_KIB_RANGE,
    FlashResult,
    HBMRow,
    ReuseCache,
    cache_text,
    figure_sources_text,
    flash_assumptions_text,
    flash_result,
    flash_rows,
    flash_table,
    flash_text,
    flash_tiling,
    flash_title,
    hbm_figure,
    naive_memory_text,
    reuse_cache,
    saving_across_lengths,
    times_fewer,
    unit_words,
)
from .memory import (  # noqa: F401 (re-exported: the chapter's surface)
    MEMORY_COLUMNS,
    deployment_text,
    kv_figure,
    memory_rows,
    memory_table,
    memory_text,
)
from .mla import (  # noqa: F401 (re-exported: the chapter's surface)
    MLA_COLUMNS,
    TALK_MATCH,
    TALK_MLA_CORRECTED,
    TALK_MLA_FIRST,
    mla_rope_text,
    mla_table,
    mla_text,
    ratio_matching,
    talk_mla_text,
)
from .quality import (  # noqa: F401 (re-exported: the chapter's surface)
    QUALITY_COLUMNS,
    QUALITY_WINDOW,
    QualityResult,
    perplexity_change_text,
    quality_figure,
    quality_result,
    quality_table,
    quality_text,
    run_quality,
)
from .roofline import (  # noqa: F401 (re-exported: the chapter's surface)
    PREDICTED_COLUMNS,
    decode_prediction,
    prediction_table,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    DEFAULT_CONTEXT,
    DEFAULT_GPU,
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    SLUG,
    TITLE,
    Sizes,
    sizes,
)
from .shared import (  # noqa: F401 (re-exported: the chapter's surface)
    threads_text,
)
from .timing import (  # noqa: F401 (re-exported: the chapter's surface)
    BACKEND_COLUMNS,
    DECODE_COLUMNS,
    TimingResult,
    backend_table,
    decode_table,
    plain_reason,
    run_timing,
    timing_figure,
    timing_result,
    timing_text,
    unavailable_text,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
