"""The engine's API under bad input, memory pressure, cancellation, failures; seeded sampling."""

from __future__ import annotations

import pytest
import torch

from infer_lab.engine import Engine, EngineConfig, EngineModel, RequestRejected, SamplingParams
from infer_lab.engine.sampling import filter_logits


@pytest.fixture(scope="module")
def model(embedded) -> EngineModel:
    return EngineModel.from_hf(embedded.model)


@pytest.fixture(scope="module")
def prompt(embedded) -> list[int]:
    return embedded.chat_ids("Name one colour.")[0].tolist()


def greedy(model, prompt, n=6, **config) -> list[int]:
    return (
        Engine(model, EngineConfig(**config))
        .generate([prompt], SamplingParams(max_tokens=n))[0]
        .token_ids
    )


def test_prompt_over_max_context_is_rejected_and_others_carry_on(model, prompt, embedded):
    engine = Engine(model, EngineConfig(max_model_len=64, block_size=16))
    good = engine.add_request(prompt, SamplingParams(max_tokens=6))
    with pytest.raises(RequestRejected, match="max context is 64"):
        engine.add_request(embedded.random_ids(1, 80)[0].tolist())
    while engine.has_unfinished():
        engine.step()
    assert engine.output(good).token_ids == greedy(model, prompt)
    assert len(engine.requests) == 1


@pytest.mark.parametrize("bad", [0, -3])
def test_max_tokens_must_be_positive(model, prompt, bad):
    engine = Engine(model, EngineConfig())
    with pytest.raises(RequestRejected, match="max_tokens must be a positive integer"):
        engine.add_request(prompt, SamplingParams(max_tokens=bad))
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    "ids,match",
    [([], "empty"), ([1, 10**6], "token ids must be in"), ([[1, 2], [3, 4]], "integer token ids")],
)
def test_malformed_prompts_are_rejected(model, ids, match):
    with pytest.raises(RequestRejected, match=match):
        Engine(model, EngineConfig()).add_request(ids)


def test_a_pool_too_small_for_one_request_is_a_config_error(model):
    with pytest.raises(ValueError, match="cannot hold even one request"):
        Engine(model, EngineConfig(max_model_len=256, block_size=16, num_blocks=4))


def test_out_of_blocks_queues_and_preempts_without_failing(model, embedded):
    prompts = embedded.random_ids(6, 20, seed=3).tolist()
    engine = Engine(
        model, EngineConfig(max_model_len=48, block_size=8, num_blocks=6, max_num_seqs=6)
    )
    outs = engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [12] * 6
    assert all(o.finish_reason == "length" for o in outs)
    assert max(r.kv_blocks_used for r in engine.step_log) <= 6
    assert engine.scheduler.num_preemptions > 0
    assert engine.kv.pool.all_free()


def test_cancel_frees_blocks_at_once_and_notifies(model, embedded):
    events = []
    engine = Engine(model, EngineConfig(max_model_len=128, block_size=4))
    a = engine.add_request(
        embedded.random_ids(1, 30, seed=1)[0].tolist(),
        SamplingParams(max_tokens=20, ignore_eos=True),
        on_token=events.append,
    )
    b = engine.add_request(
        embedded.random_ids(1, 30, seed=2)[0].tolist(),
        SamplingParams(max_tokens=5, ignore_eos=True),
    )
    engine.step()
    engine.step()
    held = len(engine.requests[a].block_table)
    used_before = engine.kv.pool.num_used
    assert held >= 8
    assert engine.cancel(a)
    assert engine.requests[a].block_table == []
    assert engine.kv.pool.num_used == used_before - held
    assert events[-1].finished and events[-1].finish_reason == "cancelled"
    assert not engine.cancel(a)  # already finished
    while engine.has_unfinished():
        engine.step()
    assert len(engine.output(b).token_ids) == 5
    assert len(engine.output(a).token_ids) == 2
    assert engine.kv.pool.all_free()


def test_a_failing_step_fails_only_its_requests(model, prompt, embedded):
    engine = Engine(model, EngineConfig(max_num_seqs=2))
    real_forward = model.forward
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated device fault")
        return real_forward(*args, **kwargs)

    engine.model = _Proxy(model, flaky)
    others = embedded.random_ids(2, 12, seed=9).tolist()
    outs = engine.generate([prompt, prompt] + others, SamplingParams(max_tokens=4, ignore_eos=True))
    assert [o.finish_reason for o in outs] == ["error", "error", "length", "length"]
    assert "simulated device fault" in outs[0].error and outs[0].error.startswith(
        "engine step failed"
    )
    solo = Engine(model, EngineConfig()).generate(
        [others[0]], SamplingParams(max_tokens=4, ignore_eos=True)
    )
    assert outs[2].token_ids == solo[0].token_ids
    assert engine.kv.pool.all_free()
    assert engine.step_log[0].failed and not engine.step_log[-1].failed


def test_nan_logits_fail_only_that_request(model, prompt, embedded):
    engine = Engine(model, EngineConfig(max_num_seqs=2))
    real_forward = model.forward
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        logits = real_forward(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 2:  # the first decode step: the first request's row turns to NaN
            logits = logits.clone()
            logits[0] = float("nan")
        return logits

    engine.model = _Proxy(model, poisoned)
    other = embedded.random_ids(1, 12, seed=9)[0].tolist()
    outs = engine.generate([prompt, other], SamplingParams(max_tokens=4, ignore_eos=True))
    assert outs[0].finish_reason == "error" and "NaN/Inf logits" in outs[0].error
    assert len(outs[0].token_ids) == 1  # the token before the fault is kept
    solo = Engine(model, EngineConfig()).generate(
        [other], SamplingParams(max_tokens=4, ignore_eos=True)
    )
    assert outs[1].token_ids == solo[0].token_ids and outs[1].finish_reason == "length"
    assert engine.kv.pool.all_free()


class _Proxy:
    """The model with a replaced ``forward`` (EngineModel itself stays untouched for other tests)."""

    def __init__(self, model, forward):
        self._model, self.forward = model, forward
        # the engine runs ``model.plain`` at batch sizes where its measured GEMM plan prefers plain
        # weights (a choice that depends on the machine and its load): that must be poisoned too
        self.plain = self

    def __getattr__(self, name):
        return getattr(self._model, name)


def test_streaming_callback_sees_every_token_then_the_end(model, prompt):
    events = []
    engine = Engine(model, EngineConfig())
    out = engine.generate(
        [prompt], SamplingParams(max_tokens=5, ignore_eos=True), on_token=events.append
    )[0]
    assert [e.token_id for e in events] == out.token_ids
    assert [e.index for e in events] == list(range(5))
    assert events[-1].finished and events[-1].finish_reason == "length"
    assert not any(e.finished for e in events[:-1])


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(model, prompt, embedded):
    params = SamplingParams(
        max_tokens=8, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True
    )
    alone = Engine(model, EngineConfig()).generate([prompt], params)[0].token_ids
    other = embedded.random_ids(1, 10)[0].tolist()
    batched = Engine(model, EngineConfig()).generate([other, prompt, prompt], params)
    assert batched[1].token_ids == alone and batched[2].token_ids == alone
    seeds = {
        tuple(
            Engine(model, EngineConfig())
            .generate(
                [prompt], SamplingParams(max_tokens=8, temperature=1.5, seed=s, ignore_eos=True)
            )[0]
            .token_ids
        )
        for s in range(4)
    }
    assert len(seeds) > 1  # different seeds do sample differently


def test_top_k_one_is_greedy(model, prompt):
    params = SamplingParams(max_tokens=6, temperature=0.7, top_k=1, seed=0)
    assert Engine(model, EngineConfig()).generate([prompt], params)[0].token_ids == greedy(
        model, prompt
    )


def test_filter_logits_keeps_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(filter_logits(logits, top_k=0, top_p=0.8))
    assert kept.tolist() == [True, True, False, False]
    kept = torch.isfinite(filter_logits(logits, top_k=3, top_p=1.0))
    assert kept.tolist() == [True, True, True, False]


def test_paged_blocks_waste_far_less_than_max_length_reservation():
    from infer_lab.analysis.kv_waste import mixed_lengths
    from infer_lab.analysis.memory import kv_bytes_per_token
    from infer_lab.bench.kv_allocators import kv_memory_waste
    from infer_lab.catalog import load_model_config
    from infer_lab.models import hf_config
    from infer_lab.shape import ModelShape

    assert load_model_config("mistral-7b")
    shape = ModelShape.from_hf_config(hf_config("mistral-7b"))
    prompts, outputs = mixed_lengths(32, seed=1)
    rows = {r.layout: r for r in kv_memory_waste(shape, prompts, outputs, max_model_len=2048)}
    assert rows["paged"].used_bytes == rows["contiguous"].used_bytes
    per_token = kv_bytes_per_token(shape, "bf16")
    assert per_token == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads, head_dim 128, bf16
    assert (
        rows["paged"].used_bytes
        == sum(p + o for p, o in zip(prompts, outputs, strict=True)) * per_token
    )
    assert rows["paged"].wasted_bytes < 32 * 16 * per_token  # under one block per request
    assert rows["contiguous"].wasted_fraction > 0.5 > 0.05 > rows["paged"].wasted_fraction


def test_bench_engine_cli_json_has_the_documented_fields(capsys):
    import json

    from infer_lab.cli import main

    code = main(
        [
            "bench",
            "engine",
            "--requests",
            "3",
            "--max-num-seqs",
            "2",
            "--prompt-len",
            "8",
            "--output-len",
            "3",
            "--prefix-cache",
            "hash",
            "--shared-prefix",
            "8",
            "--block-size",
            "4",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    run = result["run"]
    assert result["output_tokens_per_s"] == pytest.approx(run["output_tokens"] / run["elapsed_s"])
    assert run["requests_per_s"] == pytest.approx(3 / run["elapsed_s"])
    for key in ("ttft_ms", "itl_ms"):  # timing.Stats, in ms
        assert run[key]["p50"] <= run[key]["p90"] <= run[key]["p99"] <= run[key]["max"]
    assert run["ttft_ms"]["n"] == 3 and run["itl_ms"]["n"] == 3 * 2  # one gap per token after the first
    assert run["output_tokens"] == 9
    assert run["prefix_hit_rate"] > 0  # the third request reuses the shared prompt
    assert 0 < run["kv"]["blocks_peak_used"] <= run["kv"]["blocks_total"] and run["kv"]["block_size"] == 4
    # The configuration is the engine's own, by its own field names.
    assert result["config"]["max_num_seqs"] == 2 and result["config"]["prefix_cache"] == "hash"


def test_bench_engine_rejects_bad_sizes():
    from infer_lab.cli import main

    assert main(["bench", "engine", "--requests", "0", "--json"]) == 2


def test_a_sampling_fault_fails_only_its_own_request(embedded, monkeypatch):
    engine = Engine.from_loaded(embedded, EngineConfig(max_num_seqs=4))
    original = engine.sampler.sample
    bad = SamplingParams(max_tokens=4, ignore_eos=True, seed=13)  # told apart by its settings

    def faulty(logits, params, generators):
        if any(p is bad for p in params):
            raise RuntimeError("probability tensor contains inf")
        return original(logits, params, generators)

    monkeypatch.setattr(engine.sampler, "sample", faulty)
    ids = embedded.random_ids(1, 8)[0].tolist()
    for rid in ("good-1", "bad", "good-2"):
        engine.add_request(ids, bad if rid == "bad" else SamplingParams(max_tokens=4, ignore_eos=True),
                           request_id=rid)
    while engine.has_unfinished():
        engine.step()
    outs = {rid: engine.output(rid) for rid in ("good-1", "bad", "good-2")}
    assert outs["bad"].finish_reason == "error" and "sampling failed" in outs["bad"].error
    assert [len(outs[r].token_ids) for r in ("good-1", "good-2")] == [4, 4]
    assert engine.kv.pool.all_free()


def test_vanishing_temperatures_sample_the_argmax():
    assert SamplingParams(temperature=1e-300).greedy and not SamplingParams(temperature=0.5).greedy


def test_decode_threads_runs_decode_steps_on_fewer_threads_and_keeps_the_tokens():
    """A decode-only step runs on ``decode_threads`` threads, a prompt step on all of them; the
    greedy tokens do not change (the same kernels, split differently)."""
    import torch

    from infer_lab.engine import Engine, EngineConfig, SamplingParams
    from infer_lab.models import load_model

    lm = load_model("smollm2-135m")
    prompt = lm.tokenizer("The capital of France is")["input_ids"]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    before = torch.get_num_threads()
    from infer_lab.parallel.reference import hf_greedy_tokens

    plain = hf_greedy_tokens(lm, [prompt], 6)[0]  # transformers' own greedy tokens
    engine = Engine.from_loaded(lm, EngineConfig(max_num_seqs=2, decode_threads=1))
    seen = []
    original = engine.executor.execute
    engine.executor.execute = lambda batch: (seen.append((batch.num_tokens, torch.get_num_threads())),
                                             original(batch))[1]
    try:
        assert engine.generate([prompt], params)[0].token_ids == plain
    finally:
        torch.set_num_threads(before)
    assert seen[0] == (len(prompt), before)  # the prompt step: every thread
    assert all(threads == 1 for n, threads in seen[1:]) and len(seen) > 1
    import pytest

    with pytest.raises(ValueError, match="decode_threads"):
        EngineConfig(decode_threads=0).validate()


def test_the_bench_speaks_the_engines_field_names_and_returns_one_typed_result(embedded):
    """One name per knob: the benchmark takes EngineConfig's own fields and refuses any other name
    (``concurrency`` was the bench's old word for ``max_num_seqs``) with the list of real ones."""
    from infer_lab.bench.engine import engine_config, run_engine_benchmark
    from infer_lab.timing import Stats

    with pytest.raises(ValueError, match="not an EngineConfig field: concurrency.*max_num_seqs"):
        engine_config(64, concurrency=2)
    config = engine_config(64, "per-sequence", max_num_seqs=2, chunked_prefill=True, max_num_batched_tokens=8)
    assert (config.max_num_seqs, config.chunked_prefill, config.max_num_batched_tokens) == (2, True, 8)
    assert config.batched_decode is False and config.max_model_len == 64
    result = run_engine_benchmark(embedded, requests=3, prompt_len=12, output_len=3, warmup=False,
                                  max_num_seqs=2, chunked_prefill=True, max_num_batched_tokens=8)
    assert result.config.max_num_seqs == 2 and result.config.max_num_batched_tokens == 8
    run = result.run
    assert isinstance(run.ttft_ms, Stats) and isinstance(run.itl_ms, Stats) and run.itl_ms.n == 3 * 2
    assert max(run.step_samples.prefill_tokens) <= 8  # the budget reached the scheduler
    assert run.output_tokens == 9 and result.output_tokens_per_s == run.output_tokens_per_s
    assert run.kv is not None and run.kv.blocks_peak_used <= run.kv.blocks_total


def test_the_step_budget_without_chunked_prefill_is_refused_not_ignored(capsys):
    """Without --chunked-prefill the engine puts whole prompts in a step, so a budget alone would do nothing."""
    from infer_lab.cli import main

    assert main(["bench", "engine", "--requests", "2", "--max-num-batched-tokens", "64", "--json"]) == 2
    assert "add --chunked-prefill" in capsys.readouterr().err
