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
    from infer_lab import launchers
    from infer_lab.analysis.capacity import recommend
    from infer_lab.cluster import attention_ffn, hetero, scenarios
    from infer_lab.cluster.engine_check import compare_with_engine


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch15_cluster as ch15
    from infer_lab.course import nb
    return ch15, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 15 · The cluster

    Chapter 14 split one model over two processes. A fleet serves many users on many GPUs, and
    decides more than the split: which GPUs prefill and which decode, which kind of GPU does
    which, how many GPUs to rent, and how to launch them. A simulator (`infer_lab.cluster`)
    answers at cluster scale, each step costed by the roofline; the last part checks that
    simulator against our own engine.

    1. **Serving a cluster**: prefill and decode on the same GPUs or on separate pools.
    2. **Heterogeneous hardware**, a cited wafer-scale chip, and splitting attention from the
       FFN.
    3. **The planner's answer**, with the exact launch command for a distributed engine.
    4. **The simulator, checked** against our engine.
    """)
    return


@app.cell(hide_code=True)
def _(nb):
    size_picker = nb.size_picker()
    size_picker
    return (size_picker,)


@app.cell
def _(ch15, mo, nb, size_picker):
    lm = nb.load_model_or_explain("smollm2-135m", "pretrained")
    sizes = ch15.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch15, mo, nb, sizes):
    cluster_button = mo.ui.run_button(label=ch15.PARTS["cluster"])
    mo.md(f"""
    ## 1 · Serving a cluster: colocated vs disaggregated

    **Colocated**: every GPU prefills and decodes, so a new prompt's prefill delays the running
    decodes (the ITL spikes); chunked prefill spreads it out. **Disaggregated**: P GPUs only
    prefill, D only decode, and each prompt's KV cache travels between them. Two workloads on
    {sizes.cluster_model} and {sizes.cluster_gpu}s: summarization (long prompts: prefill-heavy)
    and story writing (long answers: decode-heavy), each at 70 % of the cluster's rough capacity.

    **Predict first:** which mode has the lower ITL p99? Does the best P:D split give prefill
    more GPUs for summaries or for stories? And does disaggregation raise the throughput ceiling?

    {cluster_button} {nb.button_time(ch15, "cluster")}
    """)
    return (cluster_button,)


@app.function
def serve_cluster(model, gpu, n_gpus, workload, requests, slo, load=0.7):
    """One workload's trace through the simulator on the same GPUs: colocated, colocated with
    chunked prefill, every P:D split, and the best split's run (for its inter-token gaps)."""
    trace = scenarios.trace_for(model, workload, gpu, n_gpus, requests, load=load)
    plain = scenarios.run_colocated(model, trace, gpu, n_gpus, 1, False)
    chunked = scenarios.run_colocated(model, trace, gpu, n_gpus, 1, True)
    splits = [(p, n_gpus - p) for p in range(1, n_gpus)]  # P prefill GPUs, D decode GPUs
    best, reports = scenarios.best_pd_ratio(model, trace, gpu, n_gpus, 1, slo, splits)
    best_run = scenarios.run_disaggregated(model, trace, *splits[reports.index(best)], gpu)
    return dict(trace=trace, colocated=plain, chunked=chunked, splits=reports, best=best, best_run=best_run)


@app.function
def throughput_ceiling(model, gpu, n_gpus, requests):
    """Chat arriving 20x faster than the cluster's rough capacity: every mode runs flat out."""
    return scenarios.saturation(model, "chat", gpu, n_gpus, requests=requests)


@app.cell
def cluster_run(ch15, cluster_button, mo, nb, sizes):
    mo.stop(not nb.pressed(cluster_button), nb.placeholder(cluster_button))
    n_gpus = ch15.CLUSTER_GPUS  # GPUs in the cluster (2 or more): change it, then press the button again
    _model, _gpu, _n = sizes.cluster_model, sizes.cluster_gpu, sizes.cluster_requests
    _runs = {w: serve_cluster(_model, _gpu, n_gpus, w, _n, ch15.SERVING_SLO) for w in ch15.WORKLOADS}
    cluster = ch15.cluster_result(sizes, n_gpus, _runs, throughput_ceiling(_model, _gpu, n_gpus, 2 * _n))
    mo.vstack([
        ch15.cluster_figure(cluster),
        mo.md(ch15.cluster_text(cluster)),
        *[item for name, frame in ch15.cluster_tables(cluster).items() for item in (mo.md(f"**{name}**"), nb.table(frame))],
    ])
    return (cluster,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2 · Heterogeneous hardware, a wafer-scale chip, attention/FFN split

    Prefill is compute-bound and wants FLOP/s per dollar; decode is memory-bound and wants
    bandwidth and memory for KV. So the two phases can run on different GPU types: the
    experiment `heterogeneous` picks each phase's GPU by tokens per dollar-hour and simulates
    chat on the mix and on each GPU alone. The wafer-scale SRAM chip that a public talk on
    inference held up as the fast alternative is shown as a **cited** data point: its numbers are
    the vendor's and those quoted in that talk, not the catalog's, and the ratio is computed from
    them. Last, `attention_ffn_split`: a large MoE's attention (memory-bound on KV) on separate
    GPUs from its expert FFN (dense matmul). **Predict:** does the split pay if the token exchange
    between the pools cannot hide behind compute?
    """)
    return


@app.function
def heterogeneous(model, gpus, requests, slo, n_prefill, n_decode):
    """The prefill GPU and the decode GPU by tokens per dollar-hour, then chat simulated on the mix,
    on each GPU alone (same P:D) and colocated on the decode GPU."""
    pick = hetero.heterogeneous_pick(model, gpus=list(gpus), by="usd")
    trace = scenarios.trace_for(model, "chat", pick.prefill_gpu, n_prefill + n_decode, requests, load=0.6)
    reports = hetero.compare_heterogeneous(model, trace, pick.prefill_gpu, pick.decode_gpu, n_prefill, n_decode, slo)
    return pick, reports


@app.function
def attention_ffn_split(model, gpu, n_gpus, context):
    """A large MoE on ``n_gpus``: attention and expert FFN on the same GPUs vs on separate pools (analytic)."""
    return attention_ffn.compare_attention_ffn(model, gpu, n_gpus, context=context)


@app.cell
def _(ch15, mo, nb, sizes):
    _gpus = ch15.HETERO_GPUS  # the GPU types to pick from (catalog names)
    _split = ch15.HETERO_SPLIT  # prefill GPUs, decode GPUs
    _pick, _reports = heterogeneous(sizes.cluster_model, _gpus, sizes.cluster_requests, ch15.SERVING_SLO, *_split)
    _afd = attention_ffn_split(ch15.AFD_MODEL, ch15.AFD_GPU, ch15.AFD_GPUS, ch15.AFD_CONTEXT)
    hetero_result = ch15.hetero_result(sizes.cluster_model, _pick, _reports, _afd, split=_split)
    mo.vstack([
        mo.md(ch15.hetero_text(hetero_result)),
        *[item for name, frame in ch15.hetero_tables(hetero_result).items() for item in (mo.md(f"**{name}**"), nb.table(frame))],
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3 · The planner's answer, and how to launch it

    The capacity planner (`analysis.capacity.recommend`) knows what all-reduces cost (chapter
    14): it picks the fewest GPUs and the layout (TP, replicas) that meet the latency SLO. The
    launch commands come from `infer_lab.launchers`, the same ones `infer-lab engines launch`
    runs. **Predict:** how many H100s does Llama-3-70B need for 16 users at 8,192 tokens within
    30 ms per token?
    """)
    return


@app.function
def plan_cluster(model, gpu, context, itl_slo_ms, users):
    """The planner's fewest GPUs and layout within the ITL SLO, and the launch commands for it."""
    rec = recommend(model, gpu, context=context, itl_slo_ms=itl_slo_ms, min_users=users)
    commands = launchers.scale_out(model, gpu, context=context, itl_slo_ms=itl_slo_ms, min_users=users)
    return rec, commands


@app.cell
def _(ch15, mo, nb, sizes):
    users = sizes.plan_users  # concurrent users the deployment must hold: change it and watch the GPU count
    _rec, _commands = plan_cluster(sizes.plan_model, sizes.plan_gpu, sizes.plan_context, sizes.plan_itl_slo_ms, users)
    plan = ch15.plan_result(sizes, _rec, _commands, users=users)
    mo.vstack([
        mo.md(ch15.plan_text(plan)),
        *[item for name, frame in ch15.plan_tables(plan).items() for item in (mo.md(f"**{name}**"), nb.table(frame))],
    ])
    return


@app.cell(hide_code=True)
def check_intro(ch15, mo, nb):
    check_button = mo.ui.run_button(label=ch15.PARTS["check"])
    mo.md(f"""
    ## 4 · Is the simulator right? Check it against our engine

    The experiment `simulator_vs_engine`: our engine serves a few requests with continuous
    batching (one arrives first, the rest a step later); its step log gives each step's tokens
    and time; a line `a + b × tokens` is fitted to them; the simulator replays the same requests
    on that cost. **Predict:** the same steps? How close are the totals? (The tolerances, and why
    those: `SimVsEngine.within` in `src/infer_lab/cluster/engine_check.py`.) The replay runs on a
    line fitted to these very steps, so when the steps are the same the total busy time agrees by construction; the
    per-request times (ITL, first token) test the line only when it explains the steps (R² above
    the floor of {ch15.R2_FLOOR}). What this check really tests is the simulator's scheduler.

    {check_button} {nb.button_time(ch15, "check")}
    """)
    return (check_button,)


@app.function
def simulator_vs_engine(lm, prompts, new_tokens, slots):
    """Our engine serves the prompts (continuous batching, ``slots`` at a time), a line is fitted to
    its step times, and the simulator replays the same requests on that cost; both step logs kept."""
    return compare_with_engine(lm, prompts, new_tokens, max_num_seqs=slots)


@app.cell
def check_run(ch15, check_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(check_button), nb.placeholder(check_button))
    cpu_lm = ch15.check_model(lm)  # the check fits a CPU engine's steps
    slots = ch15.CHECK_SLOTS  # batch slots (fewer than the prompts, so requests wait): change it, then press again
    check = simulator_vs_engine(cpu_lm, ch15.check_prompts(cpu_lm, sizes), sizes.check_new_tokens, slots)
    mo.vstack([mo.md(ch15.check_text(check)), nb.table(ch15.check_table(check))])
    return (check,)


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("15")
    return


if __name__ == "__main__":
    app.run()
