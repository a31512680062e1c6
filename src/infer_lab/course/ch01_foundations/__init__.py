"""Chapter 01, "Foundations": the loop, where one token's FLOPs are, memory levels, why decode waits.

The experiments are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/01_foundations.py`` that call the engine's pieces, :mod:`infer_lab.analysis` and
:mod:`infer_lab.bench` directly, called from the page's visible cells. This module sizes them,
draws and describes what they return, and runs the very same functions for the tour, the tests and
the Jupyter edition (``run_*``, through :mod:`infer_lab.course.notebook_code`).

0. **Why inference cost matters** (cited and analytic, no button): the opener's token volumes,
   what a month of them costs and why batching makes tokens cheaper, from
   :mod:`infer_lab.course.opener` (the deck's opener slides use the same functions), after the
   learner's guess of the latest volume's average tokens per second (:func:`rate_guess_text`).
1. **The loop** (counted; ``generate_step_by_step``): tokenize, embed, every decoder layer, the
   LM head's logits, a greedy choice, append; one full forward pass per token (no KV cache), with
   the engine's greedy tokens beside it.
2. **Where the FLOPs are** (analytic; ``flop_shares``): one decode step's FLOPs by component for
   the learner's model and a 7B of the catalog, against the "95 % in the layers" rule of thumb.
3. **Bandwidth by working set** (measured; ``bandwidth_curve``): copies from a few KiB to beyond
   the last cache, GB/s against the working set, the cache sizes marked.
   Beside it, a GPU's two levels as the talks drew them (HBM and on-chip SRAM) with catalog
   figures (:func:`gpu_memory_text`, chapter 04's ``hierarchy_text``).
4. **Why decode waits on memory** (predicted, then measured; ``decode_prediction`` and
   ``decode_measured``): first the share of a datasheet GPU's decode step spent waiting on memory
   (:func:`gpu_decode_wait_text`, chapter 04's ``decode_wait_text``), then a decode step's bytes /
   measured bandwidth against its FLOPs / measured FLOP/s on this machine, then the engine's own
   step beside the prediction.

One file per part of the page: ``scenario`` (the chapter's identity, the opener it starts with, and its
sizes), ``cost`` (section 0, why inference cost matters), ``loop`` (1), ``flops`` (2), ``bandwidth`` (3, with
a GPU's two memory levels), ``decode`` (4, with a datasheet GPU's wait) and ``whole`` (the chapter surface:
``measure``, ``summary``, ``tables``, ``figures``, ``saved``). This file re-exports every name, so
``ch01.<name>`` reads as before.
"""

from __future__ import annotations

from .bandwidth import (  # noqa: F401 (re-exported: the chapter's surface)
    BANDWIDTH_COLUMNS,
    BandwidthResult,
    _binary,
    bandwidth_figure,
    bandwidth_result,
    bandwidth_table,
    bandwidth_text,
    gpu_memory_text,
    levels_text,
    run_bandwidth,
)
from .cost import (  # noqa: F401 (re-exported: the chapter's surface)
    GUESS_WITHIN,
    rate_guess_text,
)
from .decode import (  # noqa: F401 (re-exported: the chapter's surface)
    DecodeResult,
    _times_ms,
    budget_figure,
    budget_text,
    byte_split,
    decode_rows,
    decode_table,
    decode_text,
    gpu_decode_wait_text,
    run_decode,
)
from .flops import (  # noqa: F401 (re-exported: the chapter's surface)
    COLOURS,
    RULE_OF_THUMB,
    SEVEN_B,
    SMALL,
    _same_shape,
    flops_figure,
    flops_models,
    flops_rows,
    flops_table,
    flops_text,
    run_flops,
)
from .loop import (  # noqa: F401 (re-exported: the chapter's surface)
    LOOP_COLUMNS,
    NO_TOKENIZER,
    LoopResult,
    _shape,
    loop_question,
    loop_result,
    loop_rows,
    loop_table,
    loop_text,
    prompt_ids,
    run_loop,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    ANALYTIC_PARTS,
    NEEDS_MODEL,
    NUMBER,
    OPENER_TITLE,
    PARTS,
    SLUG,
    TITLE,
    Sizes,
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
