"""Module 04 in the tour: the capacity planner over the GPU catalog for the workload presets."""

from __future__ import annotations

TITLE = "04 Capacity planner: users, latency and $ per million tokens"


def run(ctx):
    from ..analysis import plots
    from ..analysis.capacity import PRESETS, cheapest, plan_preset, price_vs_cost
    from ..analysis.memory import context_users_tradeoff
    from ..catalog import get_gpu
    from ..tour import StepResult

    model = "mistral-7b"
    records, lines, figs = {}, [], []
    for name, work in PRESETS.items():
        plans = plan_preset(model, name)
        best = cheapest(plans)
        paradox = price_vs_cost(plans)
        records[name] = {
            "workload": work.as_dict(),
            "plans": [p.row() for p in plans],
            "price_vs_cost": paradox,
        }
        lines.append(
            f"- **{name}** ({work.corner}): cheapest meeting the SLOs: "
            + (
                f"{best.n_gpus}x {best.gpu}, {best.users} users, ITL {best.itl_ms:.1f} ms, "
                f"${best.usd_per_m_output_tokens:.3f}/M output tokens"
                if best
                else "none"
            )
        )
        if paradox and paradox["expensive_gpu_wins"]:
            lines.append(
                f"  - cheapest per hour {paradox['cheapest_per_hour']} (${paradox['cheapest_per_hour_usd_per_hour']:.2f}/h) "
                f"costs {paradox['cost_per_token_ratio']:.1f}x more per token than {paradox['cheapest_per_token']} "
                f"(${paradox['cheapest_per_token_usd_per_hour']:.2f}/h)"
            )
        if name == "premium-chat":
            figs.append(
                ctx.save_figure(
                    plots.cost_figure(
                        records[name]["plans"], f"{model}, {name}: roofline bounds, catalog prices"
                    ),
                    "m04_cost",
                )
            )
    gpu = get_gpu("H100-SXM")
    trade = context_users_tradeoff(model, gpu.memory_bytes, [1024 * 2**i for i in range(8)])
    records["tradeoff_h100"] = trade
    figs.append(
        ctx.save_figure(
            plots.tradeoff_figure(
                trade, f"{model} bf16 on one {gpu.name}: context vs users (analytic)"
            ),
            "m04_tradeoff",
        )
    )
    summary = (
        f"Model {model}; predictions are roofline bounds on catalog datasheets.\n\n"
        + "\n".join(lines)
    )
    return StepResult(TITLE, summary, records, figs)
