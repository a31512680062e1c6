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


with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    # infer_lab first: it sets OpenMP's wait policy before torch loads (see infer_lab/__init__.py).
    import infer_lab  # noqa: F401, I001
    import torch

    from infer_lab.analysis.parallel import parallelism_frontier, scaling_table
    from infer_lab.parallel.reference import hf_greedy_tokens
    from infer_lab.parallel.runtime import TPGroup, run_local, tp_engine_model


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch14_tensor_parallel as ch14
    from infer_lab.course import nb
    return ch14, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 14 · Tensor parallelism

    One GPU runs out of two things: memory for the weights and KV, and speed for each user.
    Tensor parallelism splits every layer of one model across several workers. This chapter
    does it for real, then scales the same arithmetic up to GPUs:

    1. **Tensor parallelism, run on this machine**: the embedded model split over 2 CPU
       processes, with every all-reduce predicted, counted and timed.
    2. **Scaling on real GPUs** (the model): why 4 GPUs are not 4× faster, when replicas beat
       tensor parallelism, and what a "fast mode" costs per token.

    Serving a whole cluster (prefill and decode on separate GPUs, mixed hardware, the planner,
    the simulator checked against our engine) is the next chapter, chapter 15. Our engine stays
    on one device: part 1 is the mechanism, small enough to read.
    """)
    return


@app.cell(hide_code=True)
def _(nb):
    size_picker = nb.size_picker()
    size_picker
    return (size_picker,)


@app.cell
def _(ch14, mo, nb, size_picker):
    lm = nb.load_model_or_explain("smollm2-135m", "pretrained")
    sizes = ch14.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch14, mo):
    _rows, _refused = ch14.split_rows("smollm2-135m")
    mo.md(f"""
    ## 1 · Tensor parallelism, for real

    Each layer's matmuls are split across the ranks. **Column-parallel** q/k/v and gate/up give
    each rank some output features: its own attention heads, its own slice of the MLP. No rank
    needs another's heads, so attention runs locally. **Row-parallel** o and down give each rank
    a *partial sum* of the full output; an **all-reduce** adds them up. Two per layer, every
    step, whatever the batch.

    {ch14.split_text("smollm2-135m", 2)}

    {ch14.replicated_vocab_text("smollm2-135m")}

    The table shows every split the rule allows; one more rank is refused:

    > {_refused}
    """)
    return


@app.cell
def _(ch14, nb):
    nb.table(ch14.split_table("smollm2-135m"))
    return


@app.cell(hide_code=True)
def _(ch14, mo):
    mo.vstack([
        mo.md("""
    The whole tensor-parallel layer, on one rank: the library's real code
    (`tp_decoder_layer` in `src/infer_lab/parallel/layers.py`). The first half is the engine's own
    `attention_inputs`, called with this rank's head counts; `o_proj` and `down_proj` take only
    this rank's inputs (its heads, its MLP columns), so each gives a partial sum of the full
    output, and `comm.all_reduce` adds the ranks' sums up. (Stage 8 of the build track has you
    write this layer, and the split of the weights, yourself: `TPModel.layer_fn` is where yours
    plugs in, and `infer-lab check engine tp` runs it on 2 processes.)
    """),
        mo.md(ch14.layer_code()),
    ])
    return


@app.cell(hide_code=True)
def _(ch14, mo, nb, sizes):
    tp_button = mo.ui.run_button(label=ch14.PARTS["tp"])
    mo.md(f"""
    The experiment is the function below, `tensor_parallel`: it runs the same greedy generation in
    this process (world size 1) and on `world_size` worker processes (each imports torch: a few
    seconds), joined with **gloo**, then times all-reduces of growing size on those processes and
    fits *t = latency + bytes / bandwidth*, the ring model of `analysis.collectives` with a CPU
    link. transformers' own greedy tokens are the reference.

    {ch14.prediction_text("smollm2-135m", ch14.TP_WORLD_SIZE, sizes.tp_prompts)}

    **Predict** the time, too: on a 2-core CPU, will 2 ranks be faster or slower than 1? The
    numbers below answer, and say why.

    {tp_button} {nb.button_time(ch14, "tp")}
    """)
    return (tp_button,)


@app.function
def tensor_parallel(lm, prompts, new_tokens, world_size, sweep_sizes, repeats):
    """The same greedy run in this process and on `world_size` gloo processes (the cores shared
    out), the all-reduces timed on those processes, and transformers' tokens as the reference."""
    model = tp_engine_model(lm)  # the engine's decoder over lm's weights (shared, not copied)
    threads = torch.get_num_threads()
    per_rank = max(1, threads // world_size)
    single = [run_local(model, prompts, new_tokens, threads=t) for t in dict.fromkeys((threads, per_rank))]
    with TPGroup(model, world_size, backend="gloo", threads_per_rank=per_rank) as group:
        split = group.generate(prompts, new_tokens)  # every step's all-reduces counted and timed
        sweep = group.allreduce_sweep(sweep_sizes, repeats=repeats)
    return single, split, sweep, group.plan, hf_greedy_tokens(lm, prompts, new_tokens)


@app.cell
def tp_run(ch14, lm, mo, nb, sizes, tp_button):
    mo.stop(not nb.pressed(tp_button), nb.placeholder(tp_button))
    cpu_lm = ch14.tp_model(lm)  # the ranks are CPU processes, whatever device the page uses
    prompts = ch14.tp_prompts(cpu_lm, sizes)
    world_size = ch14.TP_WORLD_SIZE  # ranks: SmolLM2's 3 KV heads allow 2 or 3; change it, then press the button again
    _runs = tensor_parallel(cpu_lm, prompts, sizes.tp_new_tokens, world_size, sizes.sweep_sizes, sizes.sweep_repeats)
    tp = ch14.tp_result(cpu_lm, prompts, sizes.tp_new_tokens, *_runs)
    mo.vstack([ch14.tp_figure(tp), mo.md(ch14.tp_lead(tp)), nb.details(ch14.tp_details(tp))])
    return (tp,)


@app.cell(hide_code=True)
def _(ch14, mo):
    scaling_model = mo.ui.dropdown(options=["llama-3-70b", "llama-3-8b", "mistral-7b", "qwen2.5-7b"],
                                   value=ch14.SCALING_MODEL, label="model")
    scaling_batch = mo.ui.slider(1, 128, value=ch14.SCALING_BATCH, step=1, label="users (batch)", show_value=True)
    scaling_context = mo.ui.dropdown(options=["1024", "4096", "8192", "32768"], value=str(ch14.SCALING_CONTEXT),
                                     label="context (tokens)")
    mo.vstack([
        mo.md(r"""
    ## 2 · Scaling on real GPUs: the model

    The same arithmetic on catalogued GPUs: a TP step is the compute and memory time divided
    across ranks, plus 2 × layers all-reduces of (batch × hidden × 2 bytes) on the GPUs' link
    (NVLink or PCIe, ring all-reduce with NCCL's latencies). Decode messages are small, so the
    per-call latency dominates and does not shrink with more GPUs. Nothing runs here: this part
    is analytic and answers at once. **Predict first:** with 4× the GPUs, how much faster is
    each user's next token? The experiment below, `tp_scaling`, answers per GPU and TP size.
    """),
        mo.hstack([scaling_model, scaling_batch, scaling_context], justify="start"),
    ])
    return scaling_batch, scaling_context, scaling_model


@app.function
def tp_scaling(model, batch, context, gpus, tps=(1, 2, 4, 8)):
    """Predicted decode ITL at each TP size on each GPU (the roofline plus 2 x layers ring
    all-reduces on the GPUs' link), and every layout's speed vs throughput on the first GPU."""
    rows = scaling_table(model, gpus, batch, context, tps)  # one dict per (GPU, TP)
    frontier = parallelism_frontier(model, gpus[0], context)  # TP x replicas x batch, on_frontier marked
    return rows, frontier


@app.cell
def _(ch14, mo, nb, scaling_batch, scaling_context, scaling_model):
    _gpus = ch14.SCALING_GPUS  # the two links the text compares: NVLink (H100-SXM) and PCIe (H100-PCIe)
    _computed = tp_scaling(scaling_model.value, scaling_batch.value, int(scaling_context.value), _gpus)
    scaling = ch14.scaling_result(scaling_model.value, scaling_batch.value, int(scaling_context.value), _computed)
    _text, _, _title, _table = ch14.scaling_finding(scaling, "sublinear")
    mo.vstack([ch14.tp_scaling_figure(scaling), mo.md(_text), nb.details({_title: _table})])
    return (scaling,)


@app.cell(hide_code=True)
def _(ch14, mo, nb, scaling):
    _text, _lesson, _title, _table = ch14.scaling_finding(scaling, "small")
    mo.vstack([mo.md(_text), nb.table(_lesson), nb.details({f"{_title}: every column": _table})])
    return


@app.cell(hide_code=True)
def _(ch14, mo, nb, scaling):
    _text, _lesson, _title, _table = ch14.scaling_finding(scaling, "replicas")
    mo.vstack([mo.md(_text), nb.table(_lesson), nb.details({f"{_title}: every column": _table})])
    return


@app.cell(hide_code=True)
def _(ch14, mo, nb, scaling):
    _text, _, _title, _table = ch14.scaling_finding(scaling, "fast")
    _quote = ch14.scaling_paragraphs(scaling).get("quote", "")
    mo.vstack([ch14.frontier_figure(scaling), mo.md(_text), nb.details({
        "What the model shows, and where it differs from the quoted fast mode": _quote, _title: _table})])
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
def _(ch14, nb):
    nb.saved_view(ch14.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("14")
    return


if __name__ == "__main__":
    app.run()
