"""Tour step for notebook 06: attention variants, their KV memory and the MQA conversion."""

from __future__ import annotations

from ..tour import StepResult, TourContext

TITLE = "06 · Attention variants and FlashAttention"


def run(ctx: TourContext) -> StepResult:
    import pandas as pd

    from ..attention.figures import hbm_bytes, kv_per_token, scorecard_chart
    from ..attention.flash import naive_attention_hbm_bytes, tiled_attention_hbm_bytes
    from ..attention.memory import scorecard, variant_memory_table
    from ..attention.quality import equivalence_report, measure_variant_quality, quality_notes

    checks = equivalence_report()
    memory = variant_memory_table(context=32768)
    lengths = [1024, 4096, 16384, 65536]
    naive = [naive_attention_hbm_bytes(n, 128) for n in lengths]
    tiled = [tiled_attention_hbm_bytes(n, 128) for n in lengths]
    lm = ctx.load()
    quality = (
        measure_variant_quality(
            lm, eval_tokens=128 if ctx.quick else 1024, eval_window=128 if ctx.quick else 256
        )
        if lm.tokenizer is not None and not lm.is_random
        else []
    )
    measured = quality_notes(quality, lm.name)
    card = scorecard("mistral-7b", "H100-SXM", measured_quality=measured) + scorecard(
        "deepseek-v3", "H100-SXM"
    )
    figs = [
        ctx.save_figure(
            kv_per_token(memory, "KV bytes per token, analytic model (all layers)"), "m06_kv"
        ),
        ctx.save_figure(
            hbm_bytes(
                lengths, naive, tiled, "Attention HBM traffic, head_dim 128, bf16 (analytic)"
            ),
            "m06_hbm",
        ),
        ctx.save_figure(
            scorecard_chart(card, "Scorecard on H100-SXM at 32k (analytic memory, roofline speed)"),
            "m06_scorecard",
        ),
    ]
    parts = [
        "Every variant against torch SDPA (max |difference|):\n\n"
        + pd.DataFrame(checks).to_markdown(index=False),
        "KV memory from the analytic model at 32k context:\n\n"
        + pd.DataFrame(memory).to_markdown(index=False),
        "Scorecard (quality measured on the tour model where marked, otherwise cited):\n\n"
        + pd.DataFrame(card).round(1).to_markdown(index=False),
    ]
    if quality:
        parts.append(
            f"Quality on {lm.describe()}:\n\n"
            + pd.DataFrame(quality).round(4).to_markdown(index=False)
        )
    return StepResult(
        TITLE,
        "\n\n".join(parts),
        {"equivalence": checks, "memory": memory, "quality": quality, "scorecard": card},
        figs,
    )
