"""Tour step for notebook 10: a long prompt arrives while others decode, with and without chunking."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "10 · Chunked prefill"


def run(ctx: TourContext) -> StepResult:
    import matplotlib.pyplot as plt
    import pandas as pd

    from ..engine import demos

    lm = ctx.load()
    rows = demos.chunked_prefill_effect(
        lm,
        long_prompt=256 if ctx.quick else 1024,
        decoders=3,
        decode_tokens=16 if ctx.quick else 48,
        chunk_tokens=32 if ctx.quick else 64,
        arrive_at_step=4,
    )
    df = pd.DataFrame(rows)
    steps = df[df.kind == "step"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for chunking, part in steps.groupby("chunking"):
        ax.plot(
            part.step, part.step_ms, marker=".", label="chunked" if chunking else "whole prompt"
        )
    ax.set(
        xlabel="engine step",
        ylabel="step time = ITL of running requests (ms)",
        title=f"A long prompt arrives at step 4\n{lm.describe()}",
    )
    ax.legend()
    figs = [ctx.save_figure(fig, "m10_chunked_prefill")]
    summary = df[df.kind == "summary"].dropna(axis=1, how="all")
    return StepResult(TITLE, summary.round(2).to_markdown(index=False), rows, figs)
