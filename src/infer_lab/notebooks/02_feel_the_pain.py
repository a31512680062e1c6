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

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")

with app.setup:
    # What the experiments below use. The tour, the tests and the Jupyter edition run these same
    # functions from this file (infer_lab.course.notebook_code): each experiment exists once.
    import time

    from infer_lab.harness import summarize, timed_generate


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch02_feel_the_pain as ch02
    from infer_lab.course import nb
    return ch02, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 02 · Feel the pain

    Serving an LLM hurts in four places. Before any fix, we measure each one on your machine:

    1. **Memory grows with tokens and with users.** Every token of every conversation keeps its
       keys and values (the KV cache) in memory.
    2. **Time to first token grows with context.** The whole prompt must be processed (prefill)
       before the first token comes out.
    3. **Naive serving is sequential.** One request at a time leaves the hardware idle and makes
       everyone wait in line.
    4. **Every token costs a decode step.** Each step re-reads all the weights and the KV cache:
       that step time is the inter-token latency (ITL).

    Each measurement sits behind its own button and is sized for your device (quick on a CPU).
    Timings use warm-up runs, device synchronization, repeats and percentiles; memory is counted
    from the tensors themselves.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch02, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch02.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**, {lm.n_params:,} parameters, {lm.weight_bytes / 1e9:.2f} GB of weights.")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch02, lm, mo, nb, sizes):
    memory_button = mo.ui.run_button(label=ch02.PARTS["memory"])
    mo.md(f"""
    ## 1 · Memory grows with tokens and with users

    Weights are a fixed cost. The KV cache grows linearly with every token of every user:
    bytes per token = 2 (K and V) × layers × KV heads × head dim × bytes per element.

    {ch02.memory_prediction(lm)}

    The experiment, `kv_after_prefill`, runs one real prefill per point and counts the bytes of
    the cache tensors it left behind. {ch02.memory_panels_text(sizes.contexts, sizes.users)}

    {memory_button} {nb.button_time(ch02, "memory")}
    """)
    return (memory_button,)


@app.function
def kv_after_prefill(lm, contexts, users):
    """KV-cache bytes counted from the cache tensors after one real prefill (one token generated):
    each context with 1 user, then each user count at the first context. {(context, users): bytes}"""
    plan = [(c, 1) for c in contexts] + [(contexts[0], u) for u in users]
    return {(c, u): timed_generate(lm, lm.random_ids(u, c), 1, ignore_eos=True).kv_bytes for c, u in plan}


@app.cell
def kv_memory(ch02, lm, memory_button, mo, nb, sizes):
    mo.stop(not nb.pressed(memory_button), nb.placeholder(memory_button))
    users = sizes.users  # users at the first context, (1, 4) on a CPU: try (1, 8), press the button again
    kv = kv_after_prefill(lm, sizes.contexts, users)
    memory = ch02.memory_result(lm, kv)
    mo.vstack([
        ch02.memory_figure(memory, lm.describe()),
        mo.md(ch02.memory_text(memory)),
        nb.table(ch02.memory_table(memory)),
    ])
    return (memory,)


@app.cell(hide_code=True)
def _(ch02, lm, mo, nb, sizes):
    ttft_button = mo.ui.run_button(label=ch02.PARTS["ttft"])
    _a, _b = min(sizes.ttft_lengths), max(sizes.ttft_lengths)
    ttft_guess = mo.ui.number(start=0, stop=10_000, step=0.1, value=0,
                              label=f"your guess (0 = none): TTFT at {_b:,} tokens ÷ TTFT at {_a:,} tokens")
    mo.md(f"""
    ## 2 · Time to first token grows with context

    Prefill processes every prompt token in one forward pass. Its matmuls grow linearly with
    the prompt and attention grows quadratically, so long prompts wait.

    **Guess first**, then read the prediction: {ttft_guess}

    {ch02.ttft_prediction(lm, sizes.ttft_lengths)}

    The experiment, `ttft_by_prompt`, times one prefill per prompt length (a warm-up at that
    shape first, then repeats; the median is what the table shows).

    {ttft_button} {nb.button_time(ch02, "ttft")}
    """)
    return ttft_button, ttft_guess


@app.function
def ttft_by_prompt(lm, prompt_lens, repeats):
    """Time to first token (one prefill, batch 1) per prompt length: a warm-up at that shape, then
    `repeats` timed runs. {prompt_len: summary in seconds (p50, p90, min, max)}"""
    out = {}
    for n in prompt_lens:
        ids = lm.random_ids(1, n)
        timed_generate(lm, ids, 1, ignore_eos=True)  # warm-up at this shape
        out[n] = summarize([timed_generate(lm, ids, 1, ignore_eos=True).ttft_s for _ in range(repeats)])
    return out


@app.cell
def _(ch02, lm, mo, nb, sizes, ttft_button, ttft_guess):
    mo.stop(not nb.pressed(ttft_button), nb.placeholder(ttft_button))
    repeats = sizes.repeats  # timed runs per prompt length, after one warm-up: raise it for a steadier median
    _runs = ttft_by_prompt(lm, sizes.ttft_lengths, repeats)
    ttft = ch02.ttft_points(_runs, repeats)
    mo.vstack([
        ch02.ttft_figure(ttft, lm.describe()),
        mo.md(ch02.ttft_compare_text(lm, ttft, ttft_guess.value) + "\n\n" + ch02.ttft_text(ttft)),
        nb.table(ch02.ttft_table(ttft)),
    ])
    return


@app.cell(hide_code=True)
def _(ch02, lm, mo, nb, sizes):
    serving_button = mo.ui.run_button(label=ch02.PARTS["serving"])
    serving_guess = mo.ui.number(start=0, stop=1_000, step=0.1, value=0,
                                 label="your guess (0 = none): tokens/s batched ÷ tokens/s one at a time")
    mo.md(f"""
    ## 3 · Naive serving is sequential

    The same requests, served one after another (what a plain `model.generate` loop behind an
    API does) and then together in one padded batch. In the chart, grey is time spent waiting in
    line: the last request waits for all the others.

    **Guess first:** {serving_guess}

    {ch02.serving_prediction(lm, sizes.n_requests, sizes.prompt_len)}

    {serving_button} {nb.button_time(ch02, "serving")}
    """)
    return serving_button, serving_guess


@app.function
def serve_one_by_one_then_batched(lm, n_requests, prompt_len, new_tokens):
    """n requests arriving together at t = 0, served one after another, then as one padded batch.
    {mode: [(start, first token, finish) per request, seconds since t = 0]}"""
    ids = lm.random_ids(n_requests, prompt_len)
    timed_generate(lm, ids[:1], 2, ignore_eos=True)  # warm-up
    sequential, t0 = [], time.perf_counter()
    for i in range(n_requests):  # request i starts when request i - 1 has finished
        start = time.perf_counter() - t0
        rec = timed_generate(lm, ids[i : i + 1], new_tokens, ignore_eos=True)
        sequential.append((start, start + rec.ttft_s, time.perf_counter() - t0))
    rec = timed_generate(lm, ids, new_tokens, ignore_eos=True)  # all of them in one batch
    return {"sequential": sequential, "batched": [(0.0, rec.ttft_s, rec.e2e_s)] * n_requests}


@app.cell
def _(ch02, lm, mo, nb, serving_button, serving_guess, sizes):
    mo.stop(not nb.pressed(serving_button), nb.placeholder(serving_button))
    n_requests = sizes.n_requests  # requests arriving together: change it, then press the button again
    _times = serve_one_by_one_then_batched(lm, n_requests, sizes.prompt_len, sizes.new_tokens)
    serving = ch02.serving_result(_times, sizes.prompt_len, sizes.new_tokens)
    mo.vstack([
        ch02.serving_figure(serving, lm.describe()),
        mo.md(ch02.serving_compare_text(lm, serving, serving_guess.value) + "\n\n" + ch02.serving_text(serving)),
        nb.table(ch02.serving_table(serving)),
    ])
    return


@app.cell(hide_code=True)
def _(ch02, lm, mo, nb, sizes):
    itl_button = mo.ui.run_button(label=ch02.PARTS["itl"])
    mo.md(f"""
    ## 4 · Inter-token latency: every token is a full pass over the weights

    A decode step reads every weight once to produce one token per sequence. Batching shares
    that read across sequences, so total throughput rises while each user's speed drops a
    little. Longer contexts add KV bytes to read at every step.

    {ch02.itl_prediction(lm, ch02.itl_plan(lm, sizes.itl_contexts, sizes.itl_batches, sizes.itl_steps))}

    The experiment, `decode_step_times`, generates at each (context, batch) that fits in memory
    and keeps the time of every decode step after the first token: one step per token, each one
    an ITL sample. The verdict compares batches at the same context, one context at a time.

    {itl_button} {nb.button_time(ch02, "itl")}
    """)
    return (itl_button,)


@app.function
def decode_step_times(lm, points, steps):
    """Decode step time (ITL) per (context, batch) in `points`: a warm-up at that shape, then `steps`
    cached steps of one generation. {(context, batch): (summary of the steps in seconds, KV bytes at the end)}"""
    out = {}
    for context, batch in points:
        ids = lm.random_ids(batch, context)
        timed_generate(lm, ids, 2, ignore_eos=True)  # warm-up at this shape
        rec = timed_generate(lm, ids, steps + 1, ignore_eos=True)  # the first token is the prefill's
        out[context, batch] = (summarize(rec.itl_s), rec.kv_bytes)
    return out


@app.cell
def _(ch02, itl_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(itl_button), nb.placeholder(itl_button))
    batches = sizes.itl_batches  # sequences decoded together, e.g. (1, 2, 4): change them, press again
    _plan = ch02.itl_plan(lm, sizes.itl_contexts, batches, sizes.itl_steps)  # the points that fit in memory
    _runs = decode_step_times(lm, _plan.measured, sizes.itl_steps)
    itl = ch02.itl_points(_runs)
    mo.vstack([ch02.itl_figure(itl, lm.describe()), mo.md(ch02.itl_text(itl) + ch02.left_out_text(_plan)),
               nb.table(ch02.itl_table(itl))])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## The same measurements on a 7B model, saved from a GPU

    When this machine has no GPU, here is what the HF transformers baseline did on one, saved
    with its hardware, versions and date. Chapters 08 onwards fix what it shows.
    """)
    return


@app.cell
def _(ch02, nb):
    nb.saved_view(ch02.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("02")
    return


if __name__ == "__main__":
    app.run()
