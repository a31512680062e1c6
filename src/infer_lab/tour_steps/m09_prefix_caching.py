"""Tour step for notebook 09: hash vs radix prefix caching on three workloads."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "09 · Prefix caching: hash blocks vs radix tree"


def run(ctx: TourContext) -> StepResult:
    import pandas as pd

    from ..engine import demos

    lm = ctx.load()
    rows = demos.prefix_cache_comparison(
        lm, output_len=2 if ctx.quick else 8, system_len=48 if ctx.quick else 96
    )
    md = (
        f"{lm.describe()}. Prefill tokens computed and saved, hit rate and TTFT per cache.\n\n"
        + pd.DataFrame(rows).round(3).to_markdown(index=False)
    )
    return StepResult(TITLE, md, rows, [])
