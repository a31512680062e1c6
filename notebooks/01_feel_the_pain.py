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

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo
    import pandas as pd

    from infer_lab import hardware, nb, pain, plots
    from infer_lab.models import load_model
    return hardware, load_model, mo, nb, pain, pd, plots


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 01 · Feel the pain

    Serving an LLM hurts in four places. Before any fix, we measure each one on your machine:

    1. **Memory grows with tokens and with users.** Every token of every conversation keeps its
       keys and values (the KV cache) in memory.
    2. **Time to first token grows with context.** The whole prompt must be processed (prefill)
       before the first token comes out.
    3. **Naive serving is sequential.** One request at a time leaves the hardware idle and makes
       everyone wait in line.
    4. **Every token costs a decode step.** Each step re-reads all the weights and the KV cache:
       that step time is the inter-token latency (ITL).

    All timings use warm-up runs, device synchronization, repeats and percentiles; memory is
    counted from the tensors themselves.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_name, weights = nb.model_choice()
    model_picker = mo.ui.dropdown(options=["smollm2-135m", "mistral-7b", "llama-3-8b", "qwen2.5-7b"],
                                  value=model_name, label="model")
    weights_picker = mo.ui.radio(options=["pretrained", "random"], value=weights, label="weights")
    mo.hstack([model_picker, weights_picker])
    return model_picker, weights_picker


@app.cell(hide_code=True)
def _(load_model, mo, model_picker, nb, pain, weights_picker):
    lm = load_model(model_picker.value, weights=weights_picker.value)
    sizes = pain.PainSizes.for_device(lm.device, nb.quick())
    source = lm.describe()
    _warn = ("\n\n**Random weights:** memory and timing are true, the text is meaningless."
             if lm.is_random else "")
    mo.md(f"Model: **{source}**, {lm.n_params:,} parameters, {lm.weight_bytes:,} bytes of weights "
          f"(loaded in {lm.load_seconds:.1f} s).{_warn}")
    return lm, sizes, source


@app.cell(hide_code=True)
def _(mo):
    run_button = mo.ui.run_button(label="Run the four measurements")
    mo.md(f"""
    The measurements take a minute or two on a laptop CPU. {run_button}
    """)
    return (run_button,)


@app.cell(hide_code=True)
def _(mo, nb, pain, run_button, lm, sizes):
    mo.stop(not nb.should_run(run_button), mo.md("_Press the button to measure._"))
    results = pain.run_all(lm, sizes)
    return (results,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1 · Memory grows with tokens and with users

    Weights are a fixed cost. The KV cache grows linearly with every token of every user:
    bytes per token = 2 (K and V) × layers × KV heads × head dim × bytes per element. The bars
    below are measured from the cache tensors after a real prefill, not estimated.
    """)
    return


@app.cell(hide_code=True)
def _(hardware, lm, mo, pd, plots, results, source):
    _info = hardware.detect(lm.device)
    _label = "GPU memory" if _info.kind == "cuda" else "RAM"
    _rows = results["memory"]
    _per_token = _rows[0]["kv_bytes_per_token"]
    mo.vstack([
        plots.memory_growth(_rows, source, budget_bytes=_info.memory_total_bytes, budget_label=_label,
                            max_context=lm.config.max_position_embeddings),
        mo.md(f"Measured: **{_per_token:,.0f} bytes of KV per token** for this model "
              f"({_per_token / 1024:.1f} KiB). At this rate the {_label.lower()} of this machine "
              f"({_info.memory_total_bytes / 1e9:.1f} GB) holds "
              f"{(_info.memory_total_bytes - lm.weight_bytes) / _per_token:,.0f} tokens of KV in total, "
              "shared by all users, before anything else is counted."),
        mo.ui.table(pd.DataFrame(_rows), selection=None),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2 · Time to first token grows with context

    Prefill processes every prompt token in one forward pass. Its matmuls grow linearly with
    the prompt and attention grows quadratically, so long prompts wait.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb, pd, plots, results, source):
    _saved = [r for r in nb.saved_results("*hf-baseline*.json")]
    _gpu = None if nb.has_gpu() or not _saved else _saved[0]
    mo.vstack([
        plots.ttft_curve(results["ttft"], source,
                         saved=_gpu["data"]["ctx_sweep"] if _gpu else None,
                         saved_label=f"saved: {_gpu['environment']['device_name']}, {_gpu['model']} "
                                     f"({_gpu['weights']} weights), HF eager" if _gpu else ""),
        mo.ui.table(pd.DataFrame(results["ttft"]).round(2), selection=None),
        mo.md(nb.saved_label(_gpu) if _gpu else ""),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3 · Naive serving is sequential

    The same requests, served one after another (what a plain `model.generate` loop behind an
    API does) versus together in one batch. In the sequential chart, grey is time spent waiting
    in line; the last request waits for all the others.
    """)
    return


@app.cell(hide_code=True)
def _(mo, pd, plots, results, source):
    _serving = results["serving"]
    _s = {r["mode"]: r for r in _serving["summary"]}
    mo.vstack([
        plots.serving_gantt(_serving, source),
        mo.md(f"Batched serving gives **{_s['batched']['output_tokens_per_s'] / _s['sequential']['output_tokens_per_s']:.1f}×** "
              f"the throughput here ({_s['sequential']['output_tokens_per_s']:.1f} → "
              f"{_s['batched']['output_tokens_per_s']:.1f} output tokens/s), and the mean request finishes at "
              f"{_s['batched']['mean_finish_s']:.2f} s instead of {_s['sequential']['mean_finish_s']:.2f} s. "
              "One static batch is not the end of the story: module 08 shows continuous batching."),
        mo.ui.table(pd.DataFrame(_serving["summary"]).round(3), selection=None),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4 · Inter-token latency: every token is a full pass over the weights

    A decode step reads every weight once to produce one token per sequence. Batching shares
    that read across sequences, so total throughput rises while each user's speed drops a little.
    Longer contexts add KV bytes to read at every step.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb, pd, plots, results, source):
    _saved = nb.saved_results("*hf-baseline*.json")
    _gpu = None if nb.has_gpu() or not _saved else _saved[0]
    _items = [plots.itl_grid(results["itl"], source), mo.ui.table(pd.DataFrame(results["itl"]).round(2), selection=None)]
    if _gpu:
        _items += [mo.md(f"### {nb.saved_label(_gpu)}\nHF eager decode of a Mistral-7B-shape model, context 512. "
                         "The step time barely moves with batch size: the eager loop is bound by CPU-side "
                         "kernel launches, not by the GPU. Module 07 onwards fixes that."),
                   mo.ui.table(pd.DataFrame(_gpu["data"]["batch_sweep"]).round(2), selection=None)]
    mo.vstack(_items)
    return


if __name__ == "__main__":
    app.run()
