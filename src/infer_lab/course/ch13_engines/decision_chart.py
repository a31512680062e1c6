"""The page's engine decision chart: when to pick which engine, why, and what supports each row."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..ch10_prefix_caching import SGLANG_AGENTIC_CLAIM
from .scenario import HF_VARIANT
from .variants import VariantsResult
from .workshop import VLLM_V1_DEFAULT_SINCE


@dataclass(frozen=True)
class EngineChoice:
    """One row of the decision chart: when to pick which engine, why, and what supports the row.

    ``evidence`` starts with what kind of support it is: "cited" (reported elsewhere, named),
    "measured here" (this course's own runs, which are our engine's or HF's, never the named
    engine's), "analytic" or "not measured here".
    """

    need: str
    engine: str
    reason: str
    evidence: str


# Sources of the engine facts below (versions named where a default changed):
# - vLLM: V1 the default engine since 0.8.0, prefix caching and chunked prefill on by default (see
#   VLLM_V1_DEFAULT_SINCE in workshop.py).
# - SGLang: RadixAttention keeps the KV of finished and running requests in a radix tree shared by
#   every request; cache-aware scheduling (longest prefix match first) is from the SGLang paper (Zheng et
#   al., 2024) and is `--schedule-policy lpm`. Its KV pool's default page size is 1 token; with
#   `--page-size` > 1 it matches whole pages, as vLLM matches whole blocks (chapter 10).
# - TensorRT-LLM: the LLM API and `trtllm-serve` default to the PyTorch backend since 1.0 (NVIDIA/TensorRT-LLM
#   PR #5312, "promote PyTorch to be the default LLM backend"); HF checkpoints load directly, no
#   engine build. The current docs' "Migration Guide: TensorRT Backend Removed" drops the legacy backend.
# - transformers: `generate_batch` and `ContinuousBatchingManager` (paged KV, requests join and leave),
#   and `transformers serve` built on them (transformers 5.x docs, "Continuous batching").
# - TGI: continuous batching, paged and flash attention, tensor parallelism (its README); put in
#   maintenance mode on 2025-12-11 (README commit "Maintenance mode", PR #3344); last release v3.3.7
#   (2025-12-19), reported; the repository reported archived read-only on 2026-03-21 (secondary sources,
#   not checked against GitHub here).
# - vLLM-Omni: the vLLM project's omni-modality serving (text, image, audio, video; diffusion
#   outputs), announced 2025-11-30 on the vLLM blog.
_SGLANG_REPORTED_LO, _SGLANG_REPORTED_HI = SGLANG_AGENTIC_CLAIM

DECISION_CHART: tuple[EngineChoice, ...] = (
    EngineChoice(
        "standard API traffic (chat, ShareGPT-like)",
        "vLLM",
        f"the production default: paged KV, continuous batching, and (V1, vLLM ≥ {VLLM_V1_DEFAULT_SINCE}) prefix "
        "caching and chunked prefill on by default; broad model and hardware support",
        "cited: talk 1 (line 125) found no statistical difference between vLLM and SGLang on ShareGPT questions on an H100 "
        "(requests/s, TTFT, latency); not measured here (loadgen --workload sharegpt on both, on a GPU)",
    ),
    EngineChoice(
        "agentic / multi-turn: many requests sharing long histories",
        "SGLang",
        "its radix-tree cache (RadixAttention) shares the KV of every history many requests have in common "
        "(agent branches, chat turns), and cache-aware scheduling (`--schedule-policy lpm`, longest prefix "
        "first) runs requests while their prefix is still cached; chapter 10 measures what matching granularity "
        "alone is worth on its workloads (hash blocks against a radix tree)",
        f"cited: talk 1 (line 127) reported SGLang {_SGLANG_REPORTED_LO:.0f}–{_SGLANG_REPORTED_HI:.0f}× better than vLLM "
        "on a two-turn propose-and-review loop on an H100, adding \"this depends upon the different setup\"; "
        "measured here: our engine's hash and radix caches (chapter 10), not SGLang",
    ),
    EngineChoice(
        "peak NVIDIA performance",
        "TensorRT-LLM",
        "NVIDIA's engine and kernels; since TensorRT-LLM 1.0 it defaults to a PyTorch backend that loads Hugging "
        "Face checkpoints with no build step (the legacy TensorRT backend compiled an engine per model, GPU "
        "and parallelism for maximum batch and sequence sizes)",
        "not measured here: compare its loadgen numbers with vLLM's on the same GPU",
    ),
    EngineChoice(
        "multi-node, disaggregated prefill/decode, session routing",
        "Dynamo / llm-d",
        "route sessions to the worker holding their KV; separate prefill and decode pools",
        "analytic: the capacity planner's GPUs needed; then loadgen against the cluster endpoint",
    ),
    EngineChoice(
        "images, audio or video in or out (multimodal)",
        "vLLM or SGLang; vLLM-Omni",
        "vLLM and SGLang serve vision-language models behind the same OpenAI API; vLLM-Omni (2025) adds "
        "audio, video and diffusion outputs. Talk 1 (line 131) also named a new multimodal engine from Stanford",
        "not measured here: this course's workloads are text",
    ),
    EngineChoice(
        "laptop / edge, CPU or Apple silicon",
        "llama.cpp",
        "quantized GGUF weights, no GPU required",
        "measured here: chapter 06 memory per precision; loadgen at concurrency 1 on the laptop",
    ),
    EngineChoice(
        "an existing Hugging Face TGI deployment",
        "TGI (text-generation-inference)",
        "Hugging Face's server: continuous batching, paged attention, tensor parallelism; in maintenance "
        "mode since December 2025 and reported archived read-only on 2026-03-21 (secondary sources), so new "
        "deployments pick from the rows above",
        "not measured here; loadgen speaks its OpenAI-compatible API",
    ),
    EngineChoice(
        "prototyping in Python, one model, few users",
        "HF transformers",
        "no server stack to run; `generate` serves one request at a time, while `generate_batch` / "
        "`ContinuousBatchingManager` (and `transformers serve` on them) batch continuously with paged KV",
        f"measured here: the \"{HF_VARIANT}\" variant in this chapter, transformers' `ContinuousBatchingManager` "
        "(through `continuous_batching_context_manager`) in chapter 09",
    ),
)

MEASURED_HERE = "measured here (our engine or HF, not the named engine)"


def _measured_note(choice: EngineChoice, by_variant: dict[str, dict[str, Any]]) -> str:
    """This machine's numbers for the one row they bear on, each saying whose numbers they are."""
    if choice.engine == "HF transformers" and HF_VARIANT in by_variant:
        r = by_variant[HF_VARIANT]
        return (f"HF `generate`, one at a time: {r['output_tokens_per_s']:.1f} output tok/s, "
                f"TTFT p50 {r['ttft_ms_p50']:.0f} ms")
    if choice.engine == "SGLang":
        parts = [f"{k}: hit rate {r['prefix_hit_rate']:.0%}, TTFT p50 {r['ttft_ms_p50']:.0f} ms"
                 for k, r in by_variant.items() if r.get("prefix_hit_rate") is not None]
        return "our engine's prefix caches (not SGLang): " + "; ".join(parts) if parts else ""
    if choice.engine == "vLLM":
        name = next((n for n in ("+ prepacked weights", "ours: paged + continuous") if n in by_variant), None)
        if name:
            return (f"our engine with vLLM's mechanisms (paged KV, continuous batching; not vLLM), {name}: "
                    f"{by_variant[name]['output_tokens_per_s']:.1f} output tok/s")
    return ""


def decision_chart_frame(measured: list[dict[str, Any]] | None = None):
    """The decision chart as a DataFrame; ``measured`` (one dict per variant: ``variant``,
    ``output_tokens_per_s`` in tokens/s, ``ttft_ms_p50`` in ms, ``prefix_hit_rate`` a fraction or
    ``None``) adds this machine's numbers to the rows they bear on, in a column that says they are
    our engine's or HF's, not the named engine's."""
    df = pd.DataFrame([dataclasses.asdict(c) for c in DECISION_CHART])
    if measured:
        by_variant = {r["variant"]: r for r in measured}
        df[MEASURED_HERE] = [_measured_note(choice, by_variant) for choice in DECISION_CHART]
    return df


def plot_decision_chart():
    """A flowchart-style figure: questions on the left, the engine each answer leads to on the right."""
    from ...figures import subplots  # defers matplotlib

    fig, ax = subplots(figsize=(10, 0.75 * len(DECISION_CHART) + 0.8))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.5, len(DECISION_CHART) - 0.2)
    ax.axis("off")
    for i, choice in enumerate(reversed(DECISION_CHART)):
        ax.text(
            0.1,
            i,
            choice.need,
            va="center",
            ha="left",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "#eef3fb", "ec": "#7a9cc6"},
        )
        ax.annotate(
            "", xy=(6.6, i), xytext=(5.6, i), arrowprops={"arrowstyle": "->", "color": "gray"}
        )
        ax.text(
            6.7,
            i,
            choice.engine,
            va="center",
            ha="left",
            fontsize=10,
            fontweight="bold",
            bbox={"boxstyle": "round", "fc": "#fdf1e3", "ec": "#d49a52"},
        )
    ax.set_title(
        "Which engine? Pick the model first, shrink it, then pick the engine for the workload",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def decision_table(v: VariantsResult | None = None):
    """The engine decision chart; with ``v``, the numbers this machine measured for the rows they support."""
    measured = None
    if v:
        measured = [{"variant": r.variant, "output_tokens_per_s": r.served.output_tokens_per_s or 0.0,
                     "ttft_ms_p50": r.served.ttft_ms_p50 or 0.0, "prefix_hit_rate": r.prefix_hit_rate}
                    for r in v.runs]
    return decision_chart_frame(measured)


def decision_figure():
    """The decision chart as a flowchart-style figure (analytic: no measurement in it)."""
    return plot_decision_chart()
