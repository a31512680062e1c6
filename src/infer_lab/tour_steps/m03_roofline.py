"""Module 03 in the tour: roofline predictions against the harness, on this machine's measured ceilings."""

from __future__ import annotations

TITLE = "03 Prefill vs decode and the roofline: predicted vs measured"


def run(ctx):
    from ..analysis import plots
    from ..analysis.compare import (
        comparison_sizes,
        dtype_name,
        explain_gaps,
        predicted_vs_measured,
        shape_of,
    )
    from ..analysis.roofline import (
        decode_ops,
        measured_roof,
        predict_decode,
        predict_prefill,
        prefill_ops,
    )
    from ..hardware import measure_ceilings
    from ..tour import StepResult

    lm = ctx.load()
    roof = measured_roof(measure_ceilings(lm.device, quick=ctx.quick))
    sizes = comparison_sizes(ctx.quick)
    rows = predicted_vs_measured(lm, roof=roof, quick=ctx.quick, **sizes)
    shape, dtype = shape_of(lm), dtype_name(lm)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype, logits="all")
    n = max(sizes["prompt_lengths"])
    steps = [predict_prefill(shape, roof, 1, n, **kw), predict_decode(shape, roof, 1, n, **kw)]
    ops = {"prefill": prefill_ops(shape, 1, n, **kw), "decode": decode_ops(shape, 1, n, **kw)}
    timed = [r for r in rows if r["unit"] == "ms"]
    figs = [
        ctx.save_figure(
            plots.roofline_figure(
                roof, steps, ops, timed, title=f"{lm.describe()}: predicted (*) and measured (x)"
            ),
            "m03_roofline",
        ),
        ctx.save_figure(
            plots.predicted_vs_measured_figure(rows, f"{lm.describe()}: measured / predicted"),
            "m03_ratio",
        ),
    ]
    table = [
        "| quantity | batch | context | predicted | measured | measured/predicted |",
        "|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['quantity']} ({r['unit']}) | {r.get('batch', '')} | {r.get('context', '')} | {r['predicted']:,.4g} | "
        f"{r['measured']:,.4g} | {r['measured_over_predicted']:.3f} |"
        for r in rows
    ]
    summary = (
        f"Roof: {roof.name}, {roof.peak_flops / 1e9:.1f} GFLOP/s, {roof.bandwidth_Bps / 1e9:.1f} GB/s.\n\n"
        + "\n".join(table)
        + "\n\n"
        + "\n".join(f"- {line}" for line in explain_gaps(rows))
    )
    return StepResult(TITLE, summary, {"roof": roof.as_dict(), "rows": rows}, figs)
