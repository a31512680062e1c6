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

    from infer_lab import nb
    from infer_lab.course import ch01_feel_the_pain as ch01
    return ch01, mo, nb


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

    Each measurement sits behind its own button and is sized for your device (quick on a CPU).
    Timings use warm-up runs, device synchronization, repeats and percentiles; memory is counted
    from the tensors themselves.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch01, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch01.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**, {lm.n_params:,} parameters, {lm.weight_bytes / 1e9:.2f} GB of weights.")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch01, mo, nb):
    memory_button = mo.ui.run_button(label=ch01.PARTS["memory"])
    mo.md(f"""
    ## 1 · Memory grows with tokens and with users

    Weights are a fixed cost. The KV cache grows linearly with every token of every user:
    bytes per token = 2 (K and V) × layers × KV heads × head dim × bytes per element. The dots
    are measured from the cache tensors after a real prefill; the line extends them.

    {memory_button} {nb.button_time(ch01, "memory")}
    """)
    return (memory_button,)


@app.cell
def _(ch01, lm, memory_button, mo, nb, sizes):
    mo.stop(not nb.pressed(memory_button), nb.placeholder(memory_button))
    memory = ch01.measure_memory(lm, sizes)
    mo.vstack([
        ch01.memory_figure(memory, lm.describe()),
        mo.md(ch01.memory_text(memory)),
        nb.table(ch01.memory_table(memory)),
    ])
    return


@app.cell(hide_code=True)
def _(ch01, mo, nb):
    ttft_button = mo.ui.run_button(label=ch01.PARTS["ttft"])
    mo.md(f"""
    ## 2 · Time to first token grows with context

    Prefill processes every prompt token in one forward pass. Its matmuls grow linearly with
    the prompt and attention grows quadratically, so long prompts wait.

    {ttft_button} {nb.button_time(ch01, "ttft")}
    """)
    return (ttft_button,)


@app.cell
def _(ch01, lm, mo, nb, sizes, ttft_button):
    mo.stop(not nb.pressed(ttft_button), nb.placeholder(ttft_button))
    ttft = ch01.measure_ttft(lm, sizes)
    mo.vstack([ch01.ttft_figure(ttft, lm.describe()), mo.md(ch01.ttft_text(ttft)), nb.table(ch01.ttft_table(ttft))])
    return


@app.cell(hide_code=True)
def _(ch01, mo, nb):
    serving_button = mo.ui.run_button(label=ch01.PARTS["serving"])
    mo.md(f"""
    ## 3 · Naive serving is sequential

    The same requests, served one after another (what a plain `model.generate` loop behind an
    API does) and then together in one padded batch. In the chart, grey is time spent waiting in
    line: the last request waits for all the others.

    {serving_button} {nb.button_time(ch01, "serving")}
    """)
    return (serving_button,)


@app.cell
def _(ch01, lm, mo, nb, serving_button, sizes):
    mo.stop(not nb.pressed(serving_button), nb.placeholder(serving_button))
    serving = ch01.measure_serving(lm, sizes)
    mo.vstack([
        ch01.serving_figure(serving, lm.describe()),
        mo.md(ch01.serving_text(serving)),
        nb.table(ch01.serving_table(serving)),
    ])
    return


@app.cell(hide_code=True)
def _(ch01, mo, nb):
    itl_button = mo.ui.run_button(label=ch01.PARTS["itl"])
    mo.md(f"""
    ## 4 · Inter-token latency: every token is a full pass over the weights

    A decode step reads every weight once to produce one token per sequence. Batching shares
    that read across sequences, so total throughput rises while each user's speed drops a
    little. Longer contexts add KV bytes to read at every step.

    {itl_button} {nb.button_time(ch01, "itl")}
    """)
    return (itl_button,)


@app.cell
def _(ch01, itl_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(itl_button), nb.placeholder(itl_button))
    itl = ch01.measure_itl(lm, sizes)
    mo.vstack([ch01.itl_figure(itl, lm.describe()), mo.md(ch01.itl_text(itl)), nb.table(ch01.itl_table(itl))])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The same measurements on a 7B model, saved from a GPU

    When this machine has no GPU, here is what the HF transformers baseline did on one, saved
    with its hardware, versions and date. Chapters 07 onwards fix what it shows.
    """)
    return


@app.cell
def _(ch01, nb):
    nb.saved_view(ch01.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("01")
    return


if __name__ == "__main__":
    app.run()
