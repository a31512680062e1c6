"""Tour step for notebook 00: the device and its measured ceilings vs the datasheet."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "00 · Setup: your hardware and its measured ceilings"


def run(ctx: TourContext) -> StepResult:
    import pandas as pd

    from .. import hardware, plots

    info = hardware.detect()
    ceilings = hardware.measure_ceilings(quick=ctx.quick)
    rows = hardware.ceilings_vs_spec(ceilings, hardware.catalog_spec(info))
    fig = ctx.save_figure(plots.ceilings_bar(rows, ceilings.device_name), "m00_ceilings")
    md = f"Device: **{hardware.device_label()}**.\n\n" + pd.DataFrame(rows).round(3).to_markdown(
        index=False
    )
    return StepResult(
        TITLE,
        md,
        {"device": info.as_dict(), "ceilings": ceilings.as_dict(), "vs_spec": rows},
        [fig],
    )
