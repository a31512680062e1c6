"""Module 02 in the tour: the memory equation, analytic numbers checked against this machine's tensors."""

from __future__ import annotations

TITLE = "02 The memory equation: weights + KV per token"


def run(ctx):
    from ..analysis import plots
    from ..analysis.compare import dtype_name, shape_of
    from ..analysis.memory import attention_variants, kv_report, weight_bytes
    from ..catalog import list_models
    from ..harness import timed_generate
    from ..tour import StepResult
    from ..units import fmt_bytes

    records = []
    for name in list_models():
        r = kv_report(name, context=4096, users=1)
        records.append(
            {
                "model": name,
                "attention": r.attention,
                "kv_bytes_per_token": r.kv_bytes_per_token,
                "kv_bytes_4k_context": r.kv_bytes_per_user,
                "weight_bytes_bf16": weight_bytes(name, "bf16").total,
            }
        )
    lm = ctx.load()
    shape, dtype = shape_of(lm), dtype_name(lm)
    rec = timed_generate(lm, lm.random_ids(2, 16 if ctx.quick else 128), new_tokens=3)
    from ..analysis.memory import kv_bytes

    kv_pred = kv_bytes(shape, rec.prompt_len + rec.new_tokens - 1, rec.batch, dtype)
    w_pred = weight_bytes(shape, dtype).total
    check = {
        "model": lm.describe(),
        "weight_bytes_predicted": w_pred,
        "weight_bytes_measured": lm.weight_bytes,
        "kv_bytes_predicted": kv_pred,
        "kv_bytes_measured": rec.kv_bytes,
    }
    mla = attention_variants("deepseek-v3")
    fig = plots.kv_growth_figure("mistral-7b", max_tokens=32768)
    lines = [
        "| model | attention | KV B/token | KV at 4k | weights bf16 |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['attention']} | {r['kv_bytes_per_token']:,} | {fmt_bytes(r['kv_bytes_4k_context'])} "
        f"| {fmt_bytes(r['weight_bytes_bf16'])} |"
        for r in records
    ]
    summary = "\n".join(lines) + (
        f"\n\nOn this machine ({check['model']}): weights predicted {w_pred:,} B vs {lm.weight_bytes:,} B measured "
        f"from the parameters; KV predicted {kv_pred:,} B vs {rec.kv_bytes:,} B measured from the cache tensors.\n\n"
        f"DeepSeek-V3 MLA: {mla[1]['kv_bytes_per_token']:,} B/token vs {mla[0]['kv_bytes_per_token']:,} for "
        f"same-shape MHA ({mla[1]['mha_over_variant']:.1f}x less, all layers "
        "on both sides)."
    )
    return StepResult(
        TITLE,
        summary,
        {"models": records, "check": check, "deepseek_variants": mla},
        [ctx.save_figure(fig, "m02_kv_growth")],
    )
