"""Tour step for notebook 12: the same loadgen against the HF baseline and our engine's variants."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "12 · Engines: one load generator, every engine, and the decision chart"


def run(ctx: TourContext) -> StepResult:
    from .. import engines
    from ..loadgen.report import pareto_front

    lm = ctx.load()
    if lm.tokenizer is None:
        return StepResult(
            TITLE, f"Skipped: {lm.name} has no tokenizer, so it cannot be served as text."
        )
    names = (
        ["hf (one at a time)", "ours: paged + continuous", "+ prefix cache (radix)"]
        if ctx.quick
        else list(engines.OUR_VARIANTS)
    )
    variants = {n: engines.OUR_VARIANTS[n] for n in names}
    size = engines.module_sizes(ctx.quick)
    rows = engines.compare_local_engines(lm, variants, workload="shared-prefix", **size)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.barh([r["variant"] for r in rows], [r["output_tokens_per_s"] or 0 for r in rows])
    ax.set_xlabel("output tokens/s")
    ax.set_title(f"shared-prefix, concurrency {size['concurrency']}: {lm.describe()}", fontsize=8)
    fig.tight_layout()
    figs = [
        ctx.save_figure(fig, "m12_engines_throughput"),
        ctx.save_figure(engines.plot_decision_chart(), "m12_decision_chart"),
    ]
    cols = [
        "variant",
        "completed",
        "failed",
        "output_tokens_per_s",
        "ttft_ms_p50",
        "ttft_ms_p99",
        "itl_ms_p50",
        "tpot_ms_p50",
        "e2e_ms_p50",
        "prefix_hit_rate",
    ]
    import pandas as pd

    table = pd.DataFrame(rows)[cols].round(2).to_markdown(index=False)
    front = pareto_front(
        [
            (r["output_tokens_per_s"], r["tokens_per_s_per_user"])
            for r in rows
            if r.get("tokens_per_s_per_user")
        ]
    )
    installed = engines.which_engines()
    missing = [e for e, d in installed.items() if not d["installed"]]
    md = "\n\n".join(
        [
            f"Same workload (shared-prefix, seed 0), same concurrency ({size['concurrency']}), warm-up, "
            f"percentiles; model {lm.describe()}.",
            table,
            f"Pareto frontier (total tok/s, tok/s per user): {[(round(a, 1), round(b, 1)) for a, b in front]}.",
            (
                f"Not installed here: {', '.join(missing)} (launch them on a GPU with `infer-lab engines launch`)."
                if missing
                else "vLLM and SGLang are installed: `infer-lab engines launch` them and run the same loadgen."
            ),
            engines.decision_table(rows).to_markdown(index=False),
        ]
    )
    return StepResult(TITLE, md, rows, figs)
