"""Chapter 03, "The memory equation": weights + overhead + KV per token, checked against real tensors.

Everything but the last part is arithmetic on a model's ``config.json``
(:mod:`infer_lab.analysis.memory` and :mod:`infer_lab.analysis.params`): no weights, no GPU,
so the notebook runs it live as the learner moves the controls. The last part loads a model
and counts its bytes from the tensors themselves: the weights from the parameters, the KV
from the cache's K and V tensors after a generation.

One file per part of the page: ``scenario`` (the chapter's identity and sizes), ``kv`` (the KV formula on
one model, its growth with context and talk 2's rule of thumb), ``models`` (every catalogued model side by
side), ``params`` (where the parameters are, and the weights in each storage format), ``mla`` (the MLA
trap), ``fit`` (what fits on one GPU), ``check`` (the last part: the bytes of a loaded model's tensors),
``foundations`` (the deck's autoregressive loop and where its FLOPs are) and ``whole`` (the chapter
surface: ``equation``, ``measure``, ``summary``, ``tables``, ``figures``, ``saved``). This file
re-exports every name, so ``ch03.<name>`` reads as before.
"""

from __future__ import annotations

import inspect  # noqa: F401 (re-exported, as the single module had it)
from dataclasses import dataclass, field  # noqa: F401 (re-exported, as the single module had it)
from typing import Any  # noqa: F401 (re-exported, as the single module had it)

import torch  # noqa: F401 (re-exported, as the single module had it)

from ...analysis import memory  # noqa: F401 (re-exported, as the single module had it)
from ...analysis.compare import dtype_name  # noqa: F401 (re-exported, as the single module had it)
from ...analysis.memory import ModelLike, as_shape  # noqa: F401 (re-exported, as the single module had it)
from ...analysis.params import param_counts  # noqa: F401 (re-exported, as the single module had it)
from ...attention.kv_sizing import mla_ratio_explained  # noqa: F401 (re-exported, as the single module had it)
from ...figures import finish  # noqa: F401 (re-exported, as the single module had it)
from ...units import GB, KiB, fmt_bytes, human  # noqa: F401 (re-exported, as the single module had it)
from ..calculator import (  # noqa: F401 (re-exported, as the single module had it)
    DEFAULTS_KV,
    KVCurves,
    kv_curves,
    kv_visualizer_figure,
)
from ..chapter import (  # noqa: F401 (re-exported, as the single module had it)
    ChapterResult,
    chapter_number,
    choose_size,
)
from ..library_code import code_block  # noqa: F401 (re-exported, as the single module had it)
from ..notebook_code import notebook_function  # noqa: F401 (re-exported, as the single module had it)
from ..tables import Column, people_table  # noqa: F401 (re-exported, as the single module had it)
from .check import (  # noqa: F401 (re-exported: the chapter's surface)
    CHECK_COLUMNS,
    BytesCheck,
    CheckResult,
    check_result,
    check_table,
    check_text,
    run_check,
)
from .fit import (  # noqa: F401 (re-exported: the chapter's surface)
    PLANNER_MEMORY_FRACTION,
    TRADEOFF_COLUMNS,
    VLLM_MEMORY_UTILIZATION,
    VLLM_OLD_MEMORY_UTILIZATION,
    FitView,
    TradeoffPoint,
    fit_intro,
    fit_text,
    fit_view,
    memory_fraction_text,
    one_user_text,
    tradeoff_table,
)
from .foundations import (  # noqa: F401 (re-exported: the chapter's surface)
    FlopShare,
    LoopStage,
    attention_claim_text,
    attention_crossover_context,
    flop_share,
    flop_share_figure,
    flop_share_rows,
    flop_share_table,
    loop_stages,
    loop_table,
    loop_text,
)
from .kv import (  # noqa: F401 (re-exported: the chapter's surface)
    RULE_OF_THUMB_BYTES,
    RULE_OF_THUMB_MODEL,
    RULE_OF_THUMB_TOKENS,
    RuleOfThumb,
    attention_line,
    kv_formula_code,
    kv_growth_figure,
    kv_summary,
    kv_summary_text,
    rule_of_thumb,
    rule_of_thumb_text,
    units_example,
)
from .mla import (  # noqa: F401 (re-exported: the chapter's surface)
    MLA_EXAMPLE,
    VARIANT_COLUMNS,
    MLATrap,
    VariantRow,
    mla_text,
    mla_trap,
    talk_figure_words,
    variants_table,
)
from .models import (  # noqa: F401 (re-exported: the chapter's surface)
    MODEL_COLUMNS,
    ModelMemoryRow,
    model_rows,
    models_notes,
    models_table,
)
from .params import (  # noqa: F401 (re-exported: the chapter's surface)
    KEPT_DTYPE,
    PARAM_COLUMNS,
    WEIGHT_FORMAT_COLUMNS,
    ParamRow,
    WeightFormatRow,
    kept_dtype_text,
    param_rows,
    params_table,
    weight_format_rows,
    weight_formats_table,
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
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    EquationResult,
    Result,
    equation,
    figures,
    measure,
    saved,
    summary,
    tables,
)
