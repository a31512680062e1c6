# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "marimo>=0.25",
#     "torch>=2.6",
#     "transformers>=5.17",
#     "matplotlib>=3.9",
#     "pandas>=2.2",
# ]
# ///
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone,
# or `pip install git+<this repository's URL>`. No GPU and no model download are needed here.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo
    import pandas as pd

    from infer_lab.analysis import capacity, memory, plots, widgets
    from infer_lab.catalog import get_gpu, gpu_catalog_about

    return capacity, get_gpu, gpu_catalog_about, memory, mo, pd, plots, widgets


@app.cell(hide_code=True)
def _(gpu_catalog_about, mo):
    _about = gpu_catalog_about()
    mo.md(f"""
    # 04 · Capacity planner

    Which GPU, how many of them, how many users, what latency, and what a million tokens costs.
    The planner joins the memory equation (module 02: what fits) with the roofline (module 03:
    how fast) for every GPU in the catalog.

    - **Max users** = KV budget ÷ KV per user, and then the ITL SLO caps the batch: a bigger
      batch makes every step slower because each sequence adds its KV reads.
    - **$ per million output tokens** = $/hour ÷ (tokens/s × 3600) × 10⁶.

    These are roofline **bounds**: module 03 shows how far a real engine is from them.
    Prices: {_about["price_note"]} (dated {_about["price_date"]}).
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The calculator

    `GPU = all` compares the catalog, each GPU type at the smallest count (1, 2, 4, 8) that fits.
    `users = 0` takes as many users as memory and the ITL SLO allow; an SLO of 0 means none.
    """)
    return


@app.cell(hide_code=True)
def _(mo, widgets):
    cap_controls = widgets.capacity_controls(mo)
    cap_controls.vstack()
    return (cap_controls,)


@app.cell(hide_code=True)
def _(cap_controls, mo, widgets):
    cap_table, cap_verdict = widgets.capacity_table(**cap_controls.value)
    mo.vstack([mo.md(cap_verdict), cap_table])
    return (cap_table,)


@app.cell(hide_code=True)
def _(cap_controls, cap_table, plots):
    plots.cost_figure(
        cap_table.to_dict("records"),
        f"{cap_controls.value['model']}, context {cap_controls.value['context']:,}: roofline bounds, "
        "catalog prices (no hardware measured)",
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The triangle: quality, latency, throughput (pick two)

    Three workload presets. Each is a promise to users, not a fact about hardware:
    premium chat buys quality and latency; async agents buy quality and throughput with long
    contexts; batch summarization gives up latency (and some precision: fp8) for cost.
    """)
    return


@app.cell(hide_code=True)
def _(capacity, pd):
    pd.DataFrame([w.as_dict() for w in capacity.PRESETS.values()])
    return


@app.cell(hide_code=True)
def _(mo):
    preset_model = mo.ui.dropdown(
        ["mistral-7b", "llama-3-8b", "qwen2.5-7b", "llama-3-70b", "gpt-oss-120b"],
        value="mistral-7b",
        label="model for the presets",
    )
    preset_model
    return (preset_model,)


@app.cell(hide_code=True)
def _(capacity, mo, pd, preset_model):
    _items = []
    for _name in capacity.PRESETS:
        _plans = capacity.plan_preset(preset_model.value, _name)
        _best = capacity.cheapest(_plans)
        _pvc = capacity.price_vs_cost(_plans)
        _line = (
            f"**{_name}**: cheapest meeting the SLOs: {_best.n_gpus}x {_best.gpu}, {_best.users} users, "
            f"${_best.usd_per_m_output_tokens:.3f} per M output tokens."
            if _best
            else f"**{_name}**: no configuration meets the SLOs."
        )
        if _pvc and _pvc["expensive_gpu_wins"]:
            _line += (
                f" The cheapest per hour, {_pvc['cheapest_per_hour']} at "
                f"${_pvc['cheapest_per_hour_usd_per_hour']:.2f}/h, costs {_pvc['cost_per_token_ratio']:.1f}x "
                f"more per token than {_pvc['cheapest_per_token']} at "
                f"${_pvc['cheapest_per_token_usd_per_hour']:.2f}/h."
            )
        elif _pvc:
            _line += " Here the cheapest GPU per hour is also the cheapest per token."
        _cols = [
            "gpu",
            "n_gpus",
            "users",
            "itl_ms",
            "ttft_ms",
            "tokens_per_s",
            "usd_per_hour",
            "usd_per_m_output_tokens",
            "usd_per_m_input_tokens",
            "meets_slo",
            "why_not",
        ]
        _items += [mo.md(_line), pd.DataFrame([p.row() for p in _plans])[_cols]]
    mo.vstack(_items)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Why an expensive GPU can be the cheapest per token

    Decode is memory-bound, so a GPU's tokens per second scale with its bandwidth **and** with
    how many users fit in its memory at once. A GPU with twice the price but three times the
    bandwidth and room for many more users serves more than twice the tokens per hour. The lines
    above compute it for each preset rather than assert it.

    ## Context against users

    At a fixed GPU and model, every token of context you grant one user is memory another user
    cannot have.
    """)
    return


@app.cell(hide_code=True)
def _(get_gpu, memory, plots, preset_model):
    _gpu = get_gpu("H100-SXM")
    _rows = memory.context_users_tradeoff(
        preset_model.value, _gpu.memory_bytes, [1024 * 2**_i for _i in range(8)]
    )
    plots.tradeoff_figure(
        _rows, f"{preset_model.value} bf16 on one {_gpu.name} (analytic, 90% of memory)"
    )
    return


if __name__ == "__main__":
    app.run()
