# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "marimo>=0.25",
#     "torch>=2.6",
#     "transformers>=5.17",
#     "accelerate>=1.10",
#     "gguf>=0.17",
#     "safetensors>=0.5",
#     "matplotlib>=3.9",
#     "pandas>=2.2",
#     "nvidia-ml-py>=12.560",
#     "tqdm>=4.66",
# ]
# ///
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import inspect

    import marimo as mo

    from infer_lab import nb
    from infer_lab.course import ch13_beyond_one_gpu as ch13
    from infer_lab.parallel import layers as tp_layers
    return ch13, inspect, mo, nb, tp_layers


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 13 · Beyond one GPU

    One GPU runs out of two things: memory for the weights and KV, and speed for each user.
    This chapter splits one model across several workers, for real, and then scales the
    same arithmetic up to GPU clusters:

    1. **Tensor parallelism, run on this machine**: the embedded model split over 2 CPU
       processes, with every all-reduce counted and timed.
    2. **Scaling on real GPUs** (the model): why 4 GPUs are not 4× faster, when replicas beat
       tensor parallelism, and what a "fast mode" costs per token.
    3. **Serving a cluster** (a simulator): prefill and decode on the same GPUs or on separate
       pools.
    4. **Heterogeneous hardware**, a cited wafer-scale chip, and splitting attention from the
       FFN.
    5. **The planner's answer**, with the exact launch command for a distributed engine.
    6. **The simulator, checked** against our own engine.

    Our engine stays on one device: part 1 is the mechanism, small enough to read. To serve
    across GPUs, use vLLM or SGLang (part 5).
    """)
    return


@app.cell(hide_code=True)
def _(nb):
    size_picker = nb.size_picker()
    size_picker
    return (size_picker,)


@app.cell
def _(ch13, mo, nb, size_picker):
    lm = nb.load_model_or_explain("smollm2-135m", "pretrained")
    sizes = ch13.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch13, mo):
    _rows, _refused = ch13.split_rows("smollm2-135m")
    mo.md(f"""
    ## 1 · Tensor parallelism, for real

    Each layer's matmuls are split across the ranks. **Column-parallel** q/k/v and gate/up give
    each rank some output features: its own attention heads, its own slice of the MLP. No rank
    needs another's heads, so attention runs locally. **Row-parallel** o and down give each rank
    a *partial sum* of the full output; an **all-reduce** adds them up. Two per layer, every
    step, whatever the batch.

    {ch13.split_text("smollm2-135m", 2)} The embedding, the LM head and the norms are
    **replicated**: every rank computes the full logits and picks the same greedy token, so no
    other message is needed. The table shows every split the rule allows; one more rank is refused:

    > {_refused}
    """)
    return


@app.cell
def _(ch13, nb):
    nb.table(ch13.split_table("smollm2-135m"))
    return


@app.cell(hide_code=True)
def _(inspect, mo, tp_layers):
    mo.vstack([
        mo.md("""
    The whole tensor-parallel layer, on one rank (`infer_lab.parallel.layers`). The first half
    is the engine's own `attention_inputs`, called with this rank's head counts:
    """),
        mo.md(f"```python\n{inspect.getsource(tp_layers.tp_decoder_layer)}\n```"),
    ])
    return


@app.cell(hide_code=True)
def _(ch13, mo, nb):
    tp_button = mo.ui.run_button(label=ch13.PARTS["tp"])
    mo.md(f"""
    The run starts 2 worker processes (each imports torch: a few seconds), hands each its
    shard, joins them with **gloo** and generates greedily from the same prompts as one process
    does here. It then times all-reduces of growing size on the same two processes and fits
    *t = latency + bytes / bandwidth*, the ring model of `analysis.parallel` with a CPU link.
    **Predict:** on a 2-core CPU, will 2 ranks be faster or slower than 1? The numbers below
    answer, and say why.

    {tp_button} {nb.button_time(ch13, "tp")}
    """)
    return (tp_button,)


@app.cell
def _(ch13, lm, mo, nb, sizes, tp_button):
    mo.stop(not nb.pressed(tp_button), nb.placeholder(tp_button))
    tp = ch13.measure_tp(lm, sizes)
    mo.vstack([
        ch13.tp_figure(tp),
        mo.md(ch13.tp_text(tp)),
        nb.table(ch13.tp_steps_table(tp)),
        nb.table(ch13.sweep_table(tp)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    scaling_model = mo.ui.dropdown(options=["llama-3-70b", "llama-3-8b", "mistral-7b", "qwen2.5-7b"],
                                   value="llama-3-70b", label="model")
    scaling_batch = mo.ui.slider(1, 128, value=16, step=1, label="users (batch)", show_value=True)
    scaling_context = mo.ui.dropdown(options=["1024", "4096", "8192", "32768"], value="8192",
                                     label="context (tokens)")
    mo.vstack([
        mo.md(r"""
    ## 2 · Scaling on real GPUs: the model

    The same arithmetic on catalogued GPUs: a TP step is the compute and memory time divided
    across ranks, plus 2 × layers all-reduces of (batch × hidden × 2 bytes) on the GPUs' link
    (NVLink or PCIe, ring all-reduce with NCCL's latencies). Decode messages are small, so the
    per-call latency dominates and does not shrink with more GPUs. Nothing runs here: this part
    is analytic and answers at once.
    """),
        mo.hstack([scaling_model, scaling_batch, scaling_context], justify="start"),
    ])
    return scaling_batch, scaling_context, scaling_model


@app.cell
def _(ch13, mo, nb, scaling_batch, scaling_context, scaling_model):
    scaling = ch13.scaling_result(scaling_model.value, scaling_batch.value, int(scaling_context.value))
    _figs = ch13.scaling_figures(scaling)
    mo.vstack([
        _figs["tp_scaling"],
        mo.md(ch13.scaling_text(scaling)),
        *[item for name, frame in ch13.scaling_tables(scaling).items() for item in (mo.md(f"**{name}**"), nb.table(frame))],
        _figs["frontier"],
    ])
    return


@app.cell(hide_code=True)
def _(ch13, mo, nb):
    cluster_button = mo.ui.run_button(label=ch13.PARTS["cluster"])
    mo.md(f"""
    ## 3 · Serving a cluster: colocated vs disaggregated

    A discrete-event simulator of a GPU cluster (`infer_lab.cluster`), each step costed by the
    roofline. **Colocated**: every GPU prefills and decodes, so a new prompt's prefill delays the
    running decodes (the ITL spikes); chunked prefill spreads it out. **Disaggregated**: P GPUs
    only prefill, D only decode, and each prompt's KV cache travels between them. Two workloads:
    summarization (long prompts: prefill-heavy) and story writing (long answers: decode-heavy).

    {cluster_button} {nb.button_time(ch13, "cluster")}
    """)
    return (cluster_button,)


@app.cell
def _(ch13, cluster_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(cluster_button), nb.placeholder(cluster_button))
    cluster = ch13.measure_cluster(lm, sizes)
    _tables = ch13.tables(ch13.Result(cluster=cluster))
    mo.vstack([
        ch13.cluster_figure(cluster),
        mo.md(ch13.cluster_text(cluster)),
        *[item for name, frame in _tables.items() for item in (mo.md(f"**{name}**"), nb.table(frame))],
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4 · Heterogeneous hardware, a wafer-scale chip, attention/FFN split

    Prefill is compute-bound and wants FLOP/s per dollar; decode is memory-bound and wants
    bandwidth and memory for KV. So the two phases can run on different GPU types. The
    wafer-scale SRAM chip that a public talk on inference held up as the fast alternative is
    shown as a **cited** data point: its numbers are the vendor's and those quoted in that talk,
    not the catalog's, and the ratio is computed from them. Last, the
    split of a large MoE's attention (memory-bound on KV) from its expert FFN (dense matmul).
    """)
    return


@app.cell
def _(ch13, lm, mo, nb, sizes):
    hetero = ch13.measure_hetero(lm, sizes)
    _tables = ch13.tables(ch13.Result(hetero=hetero))
    mo.vstack([
        mo.md(ch13.hetero_text(hetero)),
        *[item for name, frame in _tables.items() for item in (mo.md(f"**{name}**"), nb.table(frame))],
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5 · The planner's answer, and how to launch it

    The capacity planner (`analysis.capacity.recommend`) now knows what all-reduces cost: it
    picks the fewest GPUs and the layout (TP, replicas) that meet the latency SLO. The launch
    commands come from `infer_lab.launchers`, the same ones `infer-lab engines launch` runs.
    """)
    return


@app.cell
def _(ch13, lm, mo, nb, sizes):
    plan = ch13.measure_plan(lm, sizes)
    _tables = ch13.tables(ch13.Result(plan=plan))
    mo.vstack([
        mo.md(ch13.plan_text(plan)),
        *[item for name, frame in _tables.items() for item in (mo.md(f"**{name}**"), nb.table(frame))],
    ])
    return


@app.cell(hide_code=True)
def _(ch13, mo, nb):
    check_button = mo.ui.run_button(label=ch13.PARTS["check"])
    mo.md(f"""
    ## 6 · Is the simulator right? Check it against our engine

    Our engine serves a few requests with continuous batching; its step log gives each step's
    tokens and time; a line `a + b × tokens` is fitted to them; the simulator replays the same
    requests on that cost. Same steps? Same totals?

    {check_button} {nb.button_time(ch13, "check")}
    """)
    return (check_button,)


@app.cell
def _(ch13, check_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(check_button), nb.placeholder(check_button))
    check = ch13.measure_check(lm, sizes)
    mo.vstack([mo.md(ch13.check_text(check)), nb.table(ch13.check_table(check))])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Saved from a multi-GPU machine

    When tensor-parallel runs over NCCL are saved from a machine with several GPUs, they show
    here, labelled with their hardware and date.
    """)
    return


@app.cell
def _(ch13, nb):
    nb.saved_view(ch13.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("13")
    return


if __name__ == "__main__":
    app.run()
