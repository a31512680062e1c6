"""Tour step for notebook 01: the four pain points, measured."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "01 · Feel the pain: memory, TTFT, sequential serving, ITL"


def run(ctx: TourContext) -> StepResult:
    import pandas as pd

    from .. import hardware, pain, plots

    lm = ctx.load()
    sizes = pain.PainSizes.for_device(lm.device, ctx.quick)
    res = pain.run_all(lm, sizes)
    src = lm.describe()
    info = hardware.detect(lm.device)
    figs = [
        ctx.save_figure(
            plots.memory_growth(
                res["memory"],
                src,
                info.memory_total_bytes,
                max_context=lm.config.max_position_embeddings,
            ),
            "m01_memory",
        ),
        ctx.save_figure(plots.ttft_curve(res["ttft"], src), "m01_ttft"),
        ctx.save_figure(plots.serving_gantt(res["serving"], src), "m01_serving"),
        ctx.save_figure(plots.itl_grid(res["itl"], src), "m01_itl"),
    ]
    s = {r["mode"]: r for r in res["serving"]["summary"]}
    md = "\n\n".join(
        [
            f"Model: {src}.",
            f"KV per token (measured from cache tensors): **{res['memory'][0]['kv_bytes_per_token']:,.0f} B**.",
            "TTFT vs prompt length:\n\n"
            + pd.DataFrame(res["ttft"]).round(2).to_markdown(index=False),
            f"Sequential vs batched: {s['sequential']['output_tokens_per_s']:.1f} vs "
            f"{s['batched']['output_tokens_per_s']:.1f} output tok/s.",
            "Decode step (ITL) vs context and batch:\n\n"
            + pd.DataFrame(res["itl"]).round(2).to_markdown(index=False),
        ]
    )
    return StepResult(TITLE, md, res, figs)
