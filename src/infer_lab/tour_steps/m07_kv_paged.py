"""Tour step for notebook 07: no cache vs KV cache, and contiguous reservation vs paged blocks."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "07 · KV cache and PagedAttention"


def run(ctx: TourContext) -> StepResult:
    import matplotlib.pyplot as plt
    import pandas as pd

    from ..engine import demos
    from ..engine.model import ModelShape
    from ..models import hf_config

    lm = ctx.load()
    steps = demos.no_cache_vs_kv_cache(lm, prompt_len=16, new_tokens=16 if ctx.quick else 96)
    shape = ModelShape.from_hf_config(hf_config("mistral-7b"))
    prompts, outputs = demos.mixed_lengths(64, seed=0)
    waste = demos.kv_memory_waste(shape, prompts, outputs, max_model_len=2048)
    fit = demos.requests_that_fit(shape, 8 * 2**30, prompts, outputs, max_model_len=2048)
    df = pd.DataFrame(steps)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for mode, part in df[df.phase == "decode"].groupby("mode"):
        ax.plot(part.position, part.step_ms, marker=".", label=mode)
    ax.set(
        xlabel="position (tokens in context)",
        ylabel="ms per token",
        title=f"Decode step time\n{lm.describe()}",
    )
    ax.legend()
    figs = [ctx.save_figure(fig, "m07_nocache_vs_cache")]
    md = (
        "Per-token time without a cache grows with the position; with a KV cache it stays flat.\n\n"
        + pd.DataFrame(waste).round(3).to_markdown(index=False)
        + "\n\nMistral-7B shape, bf16, 64 mixed-length requests, max_model_len 2048 (allocator counts).\n\n"
        + pd.DataFrame(fit).to_markdown(index=False)
    )
    return StepResult(TITLE, md, {"steps": steps, "waste": waste, "fit": fit}, figs)
