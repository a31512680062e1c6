"""Tour step for notebook 05: quantization on real weights (bytes, speed, quality)."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "05 · Quantization: exact bytes, decode speed and quality"


def run(ctx: TourContext) -> StepResult:
    import pandas as pd

    from ..quant.figures import layer_errors, memory_quality
    from ..quant.model import linear_input_outliers
    from ..quant.workflow import compare_methods

    lm = ctx.load()
    methods = ["int8", "int4-g64"] if ctx.quick else ["int8", "fp8", "int4-g128", "int4-g64", "nf4"]
    evaluate = lm.tokenizer is not None and not lm.is_random
    quick = ctx.quick
    result = compare_methods(
        lm,
        methods,
        evaluate=evaluate,
        eval_tokens=128 if quick else 2048,
        eval_window=128 if quick else 256,
        new_tokens=3 if quick else 32,
        repeats=1 if quick else 5,
        prompt_tokens=32 if quick else 96,
    )
    method, layers = next(iter(result["layers"].items()))
    outliers = linear_input_outliers(lm.model, lm.random_ids(1, 32), "q_proj")
    src = lm.describe()
    figs = [
        ctx.save_figure(memory_quality(result, src), "m05_memory_quality"),
        ctx.save_figure(layer_errors(layers, method, src), "m05_layer_errors"),
    ]
    table = pd.DataFrame([result["baseline"], *result["methods"]])
    worst = max(outliers, key=lambda r: r["max_over_median"])
    md = "\n\n".join(
        [
            f"Model: {src}. Weight bytes are exact, counted from the stored tensors.",
            table.round(4).to_markdown(index=False),
            f"Activation outliers (LLM.int8's motivation): in `{worst['layer']}` feature {worst['top_features'][0]} "
            f"reaches {worst['top_absmax'][0]:.1f}, {worst['max_over_median']:.0f}x the median feature.",
        ]
    )
    records = {
        "baseline": result["baseline"],
        "methods": result["methods"],
        "outliers": outliers[:5],
    }
    return StepResult(TITLE, md, records, figs)
