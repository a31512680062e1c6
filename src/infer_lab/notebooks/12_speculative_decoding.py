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
    from infer_lab.analysis.roofline import measured_roof
    from infer_lab.analysis.speculation import draft_mechanisms
    from infer_lab.bench.speculative import compare, load_prompts, prompt_ids
    from infer_lab.engine import Engine, EngineConfig, SamplingParams
    from infer_lab.hardware import measure_ceilings


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch12_speculative_decoding as ch12
    from infer_lab.course import nb
    return ch12, mo, nb


@app.cell(hide_code=True)
def _(ch12, mo):
    mo.md(rf"""
    # 12 · Speculative decoding

    A decode step reads every weight to produce **one** token per sequence (chapter 02), and at
    small batch the hardware's arithmetic sits idle (chapter 04). Speculative decoding spends
    that idle arithmetic on guesses:

    1. a cheap **proposer** guesses the next k tokens;
    2. the target runs **one** forward pass over the newest token and the k guesses, which gives
       its own next-token choice at each of the k + 1 positions;
    3. it keeps the longest prefix of guesses it agrees with, then adds its own token.

    One target pass yields between 1 and k + 1 tokens ("9 tokens in 3 target passes"), and under
    greedy decoding, with exact arithmetic, the output is **token-identical** to plain decoding:
    every kept token is the one the target would have chosen anyway. In floating point, verifying
    k + 1 tokens in one pass can add the same products in a different order than decoding one
    token (and kernels may differ), so on a GPU in bf16 a near-tie between two tokens can flip
    ({ch12.LOSSLESS_SOURCE}). Every run below is checked token for token against plain decoding,
    and the text says when one differs.

    The engine's proposers, measured here: **n-gram prompt lookup** (no model: find the last
    few tokens earlier in the prompt or output and propose what followed them) and
    **self-speculation** (the target's own first L layers plus its final norm and LM head).
    EAGLE, Medusa and multi-token prediction (MTP) are sized from configs and their papers'
    figures are cited, clearly marked: nothing is trained here.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch12, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch12.sizes(lm.device, size_picker.value)
    lm.describe()
    return lm, sizes


@app.cell(hide_code=True)
def _(mo):
    alpha_slider = mo.ui.slider(0.05, 0.95, step=0.05, value=0.8, label="acceptance α", show_value=True)
    k_slider = mo.ui.slider(1, 8, step=1, value=4, label="guesses k", show_value=True)
    c_slider = mo.ui.slider(0.0, 0.5, step=0.01, value=0.05, label="draft cost c", show_value=True)
    v_slider = mo.ui.slider(1.0, 3.0, step=0.05, value=1.0, label="verification cost v", show_value=True)
    mo.vstack([
        mo.md(r"""
        ## 0 · The textbook model

        If each guess is kept independently with probability α, a pass yields
        E = 1 + α + α² + … + α^k = (1 − α^(k+1)) / (1 − α) tokens. It costs k draft steps of
        c target steps each, plus the verification pass: 1 target step in the textbook, v steps
        when verifying k + 1 tokens costs more than decoding one (it does on a CPU). Speedup =
        E / (k·c + v). <!-- marimo -->Move the sliders. <!-- /marimo -->The measurements below put real
        numbers on α, c and v.
        """),
        mo.hstack([alpha_slider, k_slider]), mo.hstack([c_slider, v_slider]),
    ])
    return alpha_slider, c_slider, k_slider, v_slider


@app.cell
def _(alpha_slider, c_slider, ch12, k_slider, mo, v_slider):
    mo.vstack([
        ch12.formula_figure(alpha_slider.value, c_slider.value, v_slider.value),
        mo.md(ch12.formula_text(alpha_slider.value, k_slider.value, c_slider.value, v_slider.value)),
    ])
    return


@app.cell(hide_code=True)
def _(ch12, mo, nb, sizes):
    passes_button = mo.ui.run_button(label=ch12.PARTS["passes"])
    passes_guess = mo.ui.number(start=1.0, stop=9.0, step=0.1, value=1.0,
                                label="your guess: tokens per target pass")
    mo.vstack([
        mo.md(f"""
    ## {ch12.SECTIONS['passes']} · One request, counted: target passes saved

    The experiment is the function below, `count_passes`: it decodes one prompt greedily twice
    with the same engine, once plain and once with a proposer guessing k tokens per target pass,
    and keeps the engine's own counters (output tokens, target forward passes, drafts proposed
    and kept). The prompt asks the model to copy two paragraphs, so the n-gram proposer finds
    what comes next earlier in the prompt. Up to {sizes.passes_new_tokens} new tokens.

    **Predict first:** plain decoding takes one target pass per token. With n-gram guesses at
    k = {ch12.PASSES_K} on a copy task, how many tokens does one target pass yield (between 1 and {ch12.PASSES_K + 1})?<!-- marimo --> Enter
    your guess, then press the button.<!-- /marimo -->

    Which guesses are kept is decided by the engine's acceptance rule, its real code
    (`verify_greedy` and `verify_sampling` in `src/infer_lab/engine/acceptance.py`):
    """),
        mo.md(ch12.acceptance_code("greedy")),
        mo.accordion({"The sampling rule, verify_sampling (for temperature > 0)":
                      mo.md(ch12.acceptance_code("sampling"))}),
        mo.md(f"{passes_guess} {passes_button} {nb.button_time(ch12, 'passes')}"),
    ])
    return passes_button, passes_guess


@app.function
def count_passes(lm, prompt, max_new_tokens, proposer, k):
    """One greedy request, plain and with ``proposer`` guessing ``k`` tokens per target pass: the
    engine's own counts for each (RequestOutput: token_ids, target_passes, proposed_tokens,
    accepted_tokens) and its step records (StepRecord: drafts proposed and kept per pass)."""
    runs = {}
    for name, spec in (("plain", None), (proposer, proposer)):
        config = EngineConfig(speculative=spec, num_speculative_tokens=k,
                              max_model_len=len(prompt) + max_new_tokens + 2)
        engine = Engine.from_loaded(lm, config)
        params = SamplingParams(max_tokens=max_new_tokens, stop_token_ids=tuple(lm.eos_token_ids))
        runs[name] = (engine.generate([prompt], params)[0], list(engine.step_log))
    return runs


@app.cell
def one_request(ch12, lm, mo, nb, passes_button, passes_guess, sizes):
    mo.stop(not nb.pressed(passes_button), nb.placeholder(passes_button))
    prompt = prompt_ids(lm, load_prompts("grounded", 1))[0]  # "copy two paragraphs", as token ids
    proposer = ch12.PASSES_PROPOSER  # "ngram", or "self:16": the target's own first 16 layers draft
    k = ch12.PASSES_K  # guesses per target pass (1..8): change it, then press the button again
    runs = count_passes(lm, prompt, sizes.passes_new_tokens, proposer, k)
    passes = ch12.passes_result(runs, proposer, k)
    mo.vstack([ch12.passes_figure(passes, lm.describe()),
               mo.md(ch12.passes_text(passes, guess=passes_guess.value)), nb.table(ch12.passes_table(passes))])
    return (passes,)


@app.cell(hide_code=True)
def _(ch12, mo, nb):
    sweep_button = mo.ui.run_button(label=ch12.PARTS["sweep"])
    mo.md(f"""
    ## {ch12.SECTIONS['sweep']} · Proposers and k: measured next to the prediction

    Each proposer at each k, on input-grounded prompts (copy a text, edit a function, quote a
    sentence) at batch 1, against plain decoding by the same engine on the same prompts. Plain
    decoding runs before and after the speculative runs of every prompt, after a warm-up, so a
    change of machine load hits both. For every k: acceptance, tokens per target pass, target
    passes per output token, the wall-clock speedup, and the prediction from α and from the
    costs c and v measured in this very run.

    **Predict first:** with an α whose E matches the tokens per pass that section {ch12.SECTIONS['passes']} measured, what are the best k and its speedup?<!-- marimo -->
    Set α with the sliders above and read them off.<!-- /marimo --> A CPU verifies k + 1 tokens at a real cost (v > 1), so expect a smaller
    speedup than the textbook's v = 1, and a smaller best k.

    {sweep_button} {nb.button_time(ch12, "sweep")}
    """)
    return (sweep_button,)


@app.function
def proposers_by_k(lm, workload, n_prompts, configs, max_new_tokens, rounds=1):
    """Plain decoding and each (proposer, k) of ``configs`` on the first ``n_prompts`` prompts of
    ``workload``, batch 1, greedy, after a warm-up; plain runs before and after the speculative
    runs of every prompt. Returns the prompts and the engine's counts and times per configuration."""
    chosen = load_prompts(workload, n_prompts)  # data/speculative_prompts.json
    return chosen, compare(lm, prompt_ids(lm, chosen), configs, max_new_tokens, rounds=rounds)


@app.cell
def _(ch12, lm, mo, nb, sizes, sweep_button):
    mo.stop(not nb.pressed(sweep_button), nb.placeholder(sweep_button))
    configs = sizes.sweep_configs()  # (proposer, k) pairs: e.g. [("ngram", 2), ("self:16", 4)]
    _chosen, _comparison = proposers_by_k(lm, "grounded", sizes.sweep_prompts, configs,
                                          sizes.max_new_tokens, sizes.rounds)
    sweep = ch12.sweep_result(_chosen, _comparison, lm, sizes)
    mo.vstack([ch12.sweep_figure(sweep, lm.describe(), rows="speed"), mo.md(ch12.sweep_text(sweep)),
               nb.table(ch12.lesson_columns(ch12.sweep_table(sweep), ch12.SWEEP_LESSON)),
               nb.details(ch12.sweep_details(sweep, lm.describe(), size_mechanisms(sizes.variant_models)))])
    return


@app.cell(hide_code=True)
def _(ch12, mo, nb):
    workloads_button = mo.ui.run_button(label=ch12.PARTS["workloads"])
    mo.md(f"""
    ## {ch12.SECTIONS['workloads']} · Where it pays, and where it costs

    A claim talks on inference often make: speculation works best on low-entropy, input-grounded text. Here is the
    same proposer on grounded prompts and on open-ended chat (a story, advice, a why question),
    prompt by prompt, through the same experiment function as section {ch12.SECTIONS['sweep']}. A wrong guess is not
    free: its verification still runs.

    **Predict first:** n-gram lookup proposes only what already appeared in the prompt or the
    output. How many tokens per pass do you expect on a story with no text to copy?

    {workloads_button} {nb.button_time(ch12, "workloads")}
    """)
    return (workloads_button,)


@app.cell(hide_code=True)
def _(mo):
    # Section 3's result, kept for section 4's chat case (None until its button is pressed): a state,
    # so that pressing section 3 after section 4 updates section 4's words without rerunning it.
    get_chat_workloads, set_chat_workloads = mo.state(None)
    # Section 4's result, for its details below (None until its button is pressed).
    get_batch, set_batch = mo.state(None)
    return get_batch, get_chat_workloads, set_batch, set_chat_workloads


@app.cell
def _(ch12, lm, mo, nb, set_chat_workloads, sizes, workloads_button):
    mo.stop(not nb.pressed(workloads_button), nb.placeholder(workloads_button))
    _configs = list(sizes.workload_configs)  # (proposer, k) pairs: change them
    _runs = {w: proposers_by_k(lm, w, sizes.workload_prompts, _configs, sizes.max_new_tokens, sizes.rounds)
             for w in ("grounded", "chat")}
    workloads = ch12.workloads_result(_runs, lm, sizes)
    set_chat_workloads(workloads)  # section 4 projects its chat case from these
    mo.vstack([
        ch12.workloads_figure(workloads, lm.describe()),
        mo.md(ch12.workloads_text(workloads)),
        nb.table(ch12.lesson_columns(ch12.workloads_table(workloads), ch12.WORKLOAD_LESSON)),
        nb.details(ch12.workloads_details(workloads)),
    ])
    return


@app.cell(hide_code=True)
def _(ch12, mo, nb):
    batch_button = mo.ui.run_button(label=ch12.PARTS["batch"])
    mo.md(f"""
    ## {ch12.SECTIONS['batch']} · Batch size: where the gain vanishes

    Speculation fills the arithmetic a memory-bound decode step leaves idle. Batching fills it
    too. With b requests and k guesses each, a verification step carries b × (k + 1) tokens;
    once that pushes the step past the ridge point of chapter 04's roofline, the guesses cost
    real compute. Measured on this machine (continuous batching), next to the roofline on this
    machine's measured ceilings and, analytically, a 7B model on an H200.

    **Predict first:** the roofline below the measurement says at which batch the gain falls
    under {ch12.VANISHED}×. A CPU's ridge point is low, so the roofline has the gain shrink at
    small batches here and last to far larger batches on an H200. Does this run follow the
    roofline's trend? The text under the measurement compares the two directions.

    {batch_button} {nb.button_time(ch12, "batch")}
    """)
    return (batch_button,)


@app.function
def speedup_by_batch(lm, n_prompts, proposer, k, batches, max_new_tokens, rounds=1):
    """Plain vs speculative decoding of ``batch`` concurrent grounded requests (continuous
    batching) at each batch size, and this machine's measured roof (copy bandwidth, matmul
    FLOP/s) for the roofline's prediction."""
    ids = prompt_ids(lm, load_prompts("grounded", n_prompts))
    runs = {b: compare(lm, ids, [(proposer, k)], max_new_tokens, batch=b, rounds=rounds) for b in batches}
    return ids, runs, measured_roof(measure_ceilings(lm.device, quick=True))


@app.cell
def _(batch_button, ch12, lm, mo, nb, set_batch, sizes):
    mo.stop(not nb.pressed(batch_button), nb.placeholder(batch_button))
    _proposer, _k = sizes.batch_config  # ("ngram", 4): change the proposer or k
    _batches = sizes.batches  # concurrent requests, e.g. (1, 2, 4)
    _ids, _runs, _roof = speedup_by_batch(lm, sizes.batch_prompts, _proposer, _k, _batches,
                                          sizes.max_new_tokens, sizes.rounds)
    batch = ch12.batch_result(_ids, _runs, _roof, lm, _proposer, _k, sizes)
    set_batch(batch)  # the details below read it, with section 3's chat case when that has run
    mo.vstack([
        ch12.batch_figure(batch, lm.describe()),
        mo.md(ch12.batch_lead(batch)),
        nb.table(ch12.lesson_columns(ch12.batch_table(batch), ch12.BATCH_LESSON)),
    ])
    return


@app.cell
def _(ch12, get_batch, get_chat_workloads, mo, nb):
    # the roofline's reasoning, with section 3's measured chat case once its button has been pressed
    mo.stop(get_batch() is None)  # nothing to explain until section 4's button has run
    nb.details(ch12.batch_details(get_batch(), ch12.chat_tokens_per_pass(get_chat_workloads(), get_batch())))
    return


@app.cell(hide_code=True)
def _(ch12, mo):
    mo.md(rf"""
    ## {ch12.SECTIONS['variants']} · EAGLE, Medusa and multi-token prediction

    Three ways to get better guesses than n-gram lookup, all trained (so not run here):

    - **Medusa** adds k extra heads on the target's last hidden state; head i guesses the token
      i + 1 positions ahead, all at once, and a tree of candidates is verified in one pass.
    - **EAGLE** drafts autoregressively at the *feature* level: a small network (one decoder
      layer and a projection) extrapolates the target's last hidden state, the features just
      under its LM head (the EAGLE paper calls them "second-to-top-layer" features: the LM head
      is the top layer), fed the next token's embedding, and reuses the target's LM head.
      EAGLE-3 instead fuses features from low, middle and high layers.
    - **MTP** (DeepSeek-V3) trains extra transformer modules with the model to predict the
      token after next; at inference the module drafts and the model verifies.

    Their extra parameters, KV bytes and draft cost are computed below from the catalog
    configs by `size_mechanisms`; their speedups and acceptance are **cited** from the papers
    (paper, year and section in the table). The n-gram and self-speculative numbers in sections
    {ch12.SECTIONS['passes']}–{ch12.SECTIONS['batch']} are the only ones **measured** here.
    """)
    return


@app.function
def size_mechanisms(models):
    """Every draft mechanism (n-gram, self-speculation, Medusa, EAGLE, MTP) sized from each catalog
    config: extra parameters, extra KV bytes per token, draft cost c (analytic, nothing runs)."""
    return [m for model in models for m in draft_mechanisms(model)]


@app.cell
def _(ch12, mo, nb, sizes):
    variants = ch12.variants_result(size_mechanisms(sizes.variant_models))  # e.g. ("llama-3-70b",)
    mo.vstack([
        ch12.variants_figure(variants),
        mo.md(ch12.variants_text(variants)),
        nb.details(ch12.variants_details(variants)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## Saved from a GPU

    When this machine has no GPU, speculative decoding measured on one (saved with its hardware,
    versions, date and command) appears here, if such a run was saved.
    """)
    return


@app.cell
def _(ch12, nb):
    nb.saved_view(ch12.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("12")
    return


if __name__ == "__main__":
    app.run()
