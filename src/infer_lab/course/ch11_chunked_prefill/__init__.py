"""Chapter 11, "Chunked prefill": a long prompt arrives while other requests decode.

Without chunking, the step that admits the long prompt runs its whole prefill, and every
decoding request waits for that step: a spike in their inter-token latency (ITL). With chunked
prefill, each step has a token budget; the long prefill is split into chunks spread over
several steps, each mixed with the running decodes. The decoders see many slightly slower
steps instead of one very slow one; the long request usually pays with a later first token (TTFT),
each extra step having a fixed cost (the words say whether a run shows it beyond the noise).

The experiment is the notebook's own code: ``serve`` in ``infer_lab/notebooks/11_chunked_prefill.py``
builds ``EngineConfig(chunked_prefill=..., max_num_batched_tokens=...)``, serves the workload of
:func:`infer_lab.bench.long_prompt.long_prompt_among_decoders` and keeps the engine's step
records. This module sizes it, predicts, draws and describes what it returns, and runs the
same function for the tour, the tests and the Jupyter edition (:func:`run_chunking`, through
:mod:`infer_lab.course.notebook_code`). Every time is a measured engine step.

One file per part of the page: ``scenario`` (the chapter's identity and sizes), ``chunking`` (the long
prompt among running decodes: the notebook's ``serve``, its prediction, the scheduler's code, the words,
tables and figure), ``agents`` (coding agents: a repository in the prompt, analytic) and ``whole`` (the
chapter surface: ``measure``, ``summary``, ``tables``, ``figures``, ``saved``, ``gpu_note``). This file
re-exports every name, so ``ch11.<name>`` reads as before.
"""

from __future__ import annotations

from .agents import (  # noqa: F401 (re-exported: the chapter's surface)
    AGENT_BUDGETS,
    AGENT_DECODER_CONTEXT,
    AGENT_DECODERS,
    AGENT_MAX_NUM_BATCHED_TOKENS,
    AGENT_MODEL,
    AGENT_PROMPTS,
    AgentPromptRow,
    agent_prompt_rows,
    agent_prompt_text,
    budgets_words,
    chunking_verdict_text,
    largest_budget_meeting,
    serving_tpot_slo_s,
)
from .chunking import (  # noqa: F401 (re-exported: the chapter's surface)
    RUN_COLUMNS,
    STEP_COLUMNS,
    ChunkingResult,
    RunSummary,
    StepPoint,
    chunking_figure,
    chunking_result,
    chunking_text,
    predicted_step_tokens,
    prediction_text,
    run_chunking,
    run_summary,
    runs_table,
    schedule_code,
    shrink_text,
    spike_text,
    steps_table,
    ttft_text,
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
    Result,
    figures,
    gpu_note,
    measure,
    saved,
    summary,
    tables,
)
