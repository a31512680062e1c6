"""Tour step for notebook 08: static vs continuous batching, and the concurrency sweep."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "08 · Batching: static vs continuous"


def run(ctx: TourContext) -> StepResult:
    import matplotlib.pyplot as plt
    import pandas as pd

    from ..engine import demos, plots, predicted

    lm = ctx.load()
    n = 12 if ctx.quick else 32
    rows = demos.static_vs_continuous(
        lm,
        requests=n,
        concurrency=4 if ctx.quick else 8,
        prompt_len=16,
        max_output=16 if ctx.quick else 64,
    )
    sweep = demos.concurrency_sweep(
        lm,
        [1, 4] if ctx.quick else [1, 2, 4, 8, 16],
        requests=4 if ctx.quick else 16,
        prompt_len=16,
        output_len=8 if ctx.quick else 32,
    )
    df = pd.DataFrame(sweep)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(df.tokens_per_s_per_user, df.output_tokens_per_s, marker="o")
    for _, r in df.iterrows():
        ax.annotate(str(r.concurrency), (r.tokens_per_s_per_user, r.output_tokens_per_s))
    ax.set(
        xlabel="tokens/s per user",
        ylabel="total output tokens/s",
        title=f"Concurrency sweep\n{lm.describe()}",
    )
    figs = [ctx.save_figure(fig, "m08_pareto")]
    pvm = predicted.decode_step_predicted_vs_measured(
        lm, decode_steps=4 if ctx.quick else 16, quick=ctx.quick
    )
    figs.append(
        ctx.save_figure(
            plots.predicted_vs_measured_steps(pvm, lm.describe()), "m08_predicted_vs_measured"
        )
    )
    paths = demos.decode_paths(
        lm, batch=1, prompt_len=16 if ctx.quick else 128, output_len=6 if ctx.quick else 64
    )
    figs.append(ctx.save_figure(plots.decode_paths_bars(paths, lm.describe()), "m08_decode_paths"))
    pvm_cols = ["batch", "context", "predicted_ms", "measured_ms", "measured_over_predicted"]
    md = (
        pd.DataFrame(rows).round(2).to_markdown(index=False)
        + "\n\n"
        + df.round(2).to_markdown(index=False)
        + f"\n\nDecode step, predicted (roofline on {pvm[0]['roof']}) vs measured (engine):\n\n"
        + pd.DataFrame(pvm)[pvm_cols].round(3).to_markdown(index=False)
        + "\n\nDecode paths at batch 1 (CUDA graphs only on a GPU):\n\n"
        + pd.DataFrame(paths).round(2).to_markdown(index=False)
    )
    records = {
        "static_vs_continuous": rows,
        "sweep": sweep,
        "predicted_vs_measured": pvm,
        "decode_paths": paths,
    }
    return StepResult(TITLE, md, records, figs)
