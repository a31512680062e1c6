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
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone.
# No GPU and no model are needed here: everything is arithmetic on the catalog and saved results.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    from dataclasses import replace

    import marimo as mo

    from infer_lab.catalog import list_gpus, list_models
    from infer_lab.course import ch16_where_next as ch16
    from infer_lab.course import nb
    return ch16, list_gpus, list_models, mo, nb, replace


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 16 · Where to go next

    The course measured four walls: the KV cache fills memory, a long prompt blocks everyone's
    decode, one GPU runs out of room or speed, and real kernels stop short of the roofline.
    Each has a field of work behind it. This chapter puts a number on each wall, computed with
    the same memory equation, roofline and catalog the earlier chapters used, and says where to
    read on. Everything follows the controls live: no button, no GPU.
    """)
    return


@app.cell(hide_code=True)
def _(ch16, list_gpus, list_models, mo):
    _s = ch16.sizes()
    next_model = mo.ui.dropdown(list_models(), value=_s.model, label="model")
    next_gpu = mo.ui.dropdown(list_gpus(), value=_s.gpu, label="GPU")
    next_context = mo.ui.slider(4096, 262144, step=4096, value=_s.long_context, label="long request (tokens)",
                                show_value=True)
    mo.hstack([next_model, next_gpu, next_context], justify="start", wrap=True)
    return next_context, next_gpu, next_model


@app.cell
def _(ch16, mo, next_context, next_gpu, next_model, replace):
    workload = replace(ch16.sizes(), model=next_model.value, gpu=next_gpu.value, long_context=next_context.value)
    mo.md(ch16.directions_text(ch16.directions(workload)))
    return (workload,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Memory tiers: fetch a cached prefix's KV, or recompute it?

    A prefix cache in GPU memory (chapter 10) saves the prefill of
    a shared prompt only while its KV stays there. Tiered caches such as LMCache spill it to CPU
    memory, local disks or other servers. Whether that pays is a race between a prefill, which
    grows faster than linearly with the prefix, and a copy, which grows linearly.
    """)
    return


@app.cell
def _(ch16, mo, nb, workload):
    tier_view = ch16.tiers(workload.model, workload.gpu, workload.contexts)
    mo.vstack([ch16.tiers_figure(tier_view), mo.md(ch16.tiers_text(tier_view)), nb.table(ch16.tiers_table(tier_view))])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Kernels: what a GPU measured against its roofline

    A plain decode loop captured in a CUDA graph, saved from a GPU with its hardware and date.
    The gap to the roofline is what fused kernels, paged attention and a good engine close.
    """)
    return


@app.cell
def _(ch16, nb):
    nb.saved_view(ch16.saved(), only_without_gpu=False)
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("16")
    return


if __name__ == "__main__":
    app.run()
