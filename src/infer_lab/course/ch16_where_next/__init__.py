"""Chapter 16, "Where to go next": four directions, each tied to a number the course computed or measured.

1. **KV eviction and compression**: how much KV one long request needs, and what fp8 KV and
   MLA-style compression take off it (the memory equation of chapter 03).
2. **Memory tiers and offload** (LMCache and friends): when fetching a cached prefix's KV from
   CPU memory or another machine beats recomputing it with a prefill (the roofline of chapter 04
   against the catalog's links).
3. **Disaggregated and multi-node serving** (NVIDIA Dynamo, llm-d): how many decode steps one
   long prefill stalls when both share a GPU, and what moving its KV to a decode pool costs.
4. **Kernels**: how far a plain CUDA-graph decode measured on an H200 is from the roofline, and
   how long decode waits on memory even at the roof.

Everything is arithmetic on the catalog plus the saved GPU results: no model, no GPU. The chapter
references name the course chapters present in this checkout.

One file per part of the page: ``scenario`` (the chapter's identity, the links and GPU counts it uses,
and its sizes), ``four_directions`` (the directions part, its text and table), ``memory_tiers`` (the
tiers part: recompute a prefix or fetch its KV), ``kernel_gap`` (the kernels section: a saved CUDA-graph
decode against the roofline), ``shared`` (chapter references, the fewest serving GPUs and link times
several parts use) and ``whole`` (the chapter surface: ``measure``, ``summary``, ``tables``,
``figures``, ``saved``). This file re-exports every name, so ``ch16.<name>`` reads as before.
"""

from __future__ import annotations

from ...analysis import memory  # noqa: F401 (read as ch16.memory)
from .four_directions import (  # noqa: F401 (re-exported: the chapter's surface)
    DIRECTION_COLUMNS,
    TALK_KERNEL_AGENT,
    Direction,
    directions,
    directions_table,
    directions_text,
    disaggregation_direction,
    eviction_direction,
    kernel_agents_text,
    kernels_direction,
    kv_transfer_text,
    links_words,
    tiers_direction,
)
from .kernel_gap import (  # noqa: F401 (re-exported: the chapter's surface)
    SOL_COLUMNS,
    SolRow,
    sol_decode_rows,
    sol_figure,
)
from .memory_tiers import (  # noqa: F401 (re-exported: the chapter's surface)
    TierRow,
    TiersResult,
    tiers,
    tiers_figure,
    tiers_table,
    tiers_text,
)
from .scenario import (  # noqa: F401 (re-exported: the chapter's surface)
    GPU_COUNTS,
    NEEDS_MODEL,
    NUMBER,
    PARTS,
    SLUG,
    TIER_LINKS,
    TITLE,
    Sizes,
    sizes,
)
from .shared import (  # noqa: F401 (re-exported: the chapter's surface)
    chapter_refs,
    link_time_s,
    scenarios,
    serving_gpus,
)
from .whole import (  # noqa: F401 (re-exported: the chapter's surface)
    Result,
    figures,
    measure,
    saved,
    summary,
    tables,
)
