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

with app.setup:
    # The library's planner, called directly by the cell "One plan by hand" below.
    from infer_lab.analysis.capacity import plan


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.catalog import list_gpus
    from infer_lab.course import calculator, nb
    from infer_lab.course import ch05_capacity_planner as ch05
    return calculator, ch05, list_gpus, mo, nb


@app.cell(hide_code=True)
def _(ch05, mo):
    mo.md(f"""
    # 05 · Capacity planner

    Which GPU, how many of them, how many users, what latency, and what a million tokens costs.
    The planner joins the memory equation (chapter 03: what fits) with the roofline (chapter 04:
    how fast) for every GPU in the catalog. It is all arithmetic, so everything here follows the
    controls live: no button, no GPU.

    - **Max users** = KV budget ÷ KV per user, and then the ITL SLO caps the batch: a bigger
      batch makes every step slower because each sequence adds its KV reads.
    - **$ per million output tokens** = $/hour ÷ (tokens/s × 3600) × 10⁶. It prices decode
      alone; a request also pays for its prompt's prefill (the same formula over prompt tokens
      per second), so the presets below also price a whole request, prefill and decode apart.

    These are roofline **bounds**: chapter 04 shows how far a real engine is from them.
    Prices: {ch05.price_note()}.
    """)
    return


@app.cell(hide_code=True)
def _(ch05, mo):
    mo.vstack([mo.md("""
    ## One plan by hand

    The cell below calls the library's planner (`analysis.capacity.plan`) on one GPU. Its
    memory half is `fit` (`src/infer_lab/analysis/memory.py`): usable memory minus the weights
    and the overhead is the KV budget, and the budget over one user's KV is the most users.
    **Predict first:** quadruple the context in the cell; how many users are left?
    """), mo.md(ch05.fit_code())])
    return


@app.cell
def by_hand(ch05, mo, nb):
    context = 4096  # tokens per user: try 16384, then compare the users
    one = plan("mistral-7b", "H100-SXM", n_gpus=1, context=context, itl_slo_ms=50.0)
    mo.vstack([mo.md(ch05.plan_line(one)), nb.table(ch05.plans_table([one]))])
    return (one,)


@app.cell(hide_code=True)
def _(calculator, ch05, mo):
    mo.md(f"""
    ## The calculator

    Fix one dimension first, as the workshop's capacity-calculator demo does: for chat the ITL
    SLO; for asynchronous work the **minimum batch**, the concurrent users the deployment must
    serve (the demo fixes it per GPU; here it counts all GPUs of a configuration, the same on
    one GPU). A configuration that cannot hold that many users within memory and the ITL SLO
    misses, so with `GPU = all` a larger minimum buys more GPUs.

    `GPU = all` compares the catalog, each GPU type at the smallest count
    ({", ".join(map(str, ch05.GPU_COUNTS))}) that meets the SLOs and the minimum batch.
    `users = 0` takes as many users as memory and the ITL SLO allow; an SLO of 0 means none.

    **Predict first:** with the ITL SLO at its default of {calculator.DEFAULTS_CAPACITY["itl_slo_ms"]:g} ms,
    raise the minimum batch from {calculator.DEFAULTS_CAPACITY["min_users"]:,} to 300. Which
    GPUs now need more than one, and does the cheapest configuration change?
    """)
    return


@app.cell(hide_code=True)
def _(calculator, mo):
    cap_controls = calculator.capacity_controls(mo)
    cap_controls.hstack(wrap=True)
    return (cap_controls,)


@app.cell
def _(calculator, cap_controls, mo, nb):
    calc = calculator.capacity_plans(**cap_controls.value)
    mo.vstack([mo.md(calc.verdict), nb.table(calculator.plans_table(calc.plans))])
    return (calc,)


@app.cell
def _(calc, ch05):
    ch05.calculator_figure(calc)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The triangle: quality, latency, throughput (pick two)

    Three workload presets. Each is a promise to users, not a fact about hardware:
    premium chat buys quality and latency; async agents buy quality and throughput with long
    contexts; batch summarization keeps only throughput, giving up latency and some precision
    (fp8). Cost is not a corner: it is what each choice is priced in, in the tables below.
    """)
    return


@app.cell
def _(ch05, nb):
    nb.table(ch05.workloads_table())
    return


@app.cell(hide_code=True)
def _(ch05, list_gpus, mo):
    preset_model = mo.ui.dropdown(list(ch05.PRESET_MODELS), value=ch05.PRESET_MODELS[0], label="model")
    tradeoff_gpu = mo.ui.dropdown(list_gpus(), value=ch05.sizes().tradeoff_gpu, label="GPU for the trade-off")
    mo.hstack([preset_model, tradeoff_gpu], justify="start")
    return preset_model, tradeoff_gpu


@app.cell
def _(ch05, mo, nb, preset_model):
    presets = ch05.plan_presets(preset_model.value)
    mo.vstack([item for p in presets for item in (mo.md(ch05.preset_line(p)), nb.table(ch05.plans_table(p.plans)))])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Why an expensive GPU can be the cheapest per token

    Decode is memory-bound, so a GPU's tokens per second scale with its bandwidth **and** with
    how many users fit in its memory at once. A GPU that costs more per hour but has much more
    bandwidth and room for many more users serves more tokens per hour than it costs extra. The
    lines above compute it for each preset rather than assert it.

    ## Context against users

    At a fixed GPU and model, every token of context you grant one user is memory another user
    cannot have.
    """)
    return


@app.cell
def _(ch05, mo, preset_model, tradeoff_gpu):
    trade = ch05.tradeoff([preset_model.value], tradeoff_gpu.value)
    mo.vstack([ch05.tradeoff_figure(trade), mo.md(ch05.tradeoff_text(trade))])
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("05")
    return


if __name__ == "__main__":
    app.run()
