"""One-token steps compiled on a CPU (engine/cpu/cpu_decode.py): the same tokens as transformers.

The compiled path changes only the order of float sums, so greedy tokens must still equal
transformers' on the embedded model, and every one-token step must really take it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from infer_lab import fast_paths
from infer_lab.engine import Engine, EngineConfig, EngineModel, SamplingParams, cpu_decode

from engine_helpers import NEW_TOKENS, assert_pool_clean

needs_compiler = pytest.mark.skipif(cpu_decode.compiler() is None, reason="no C++ compiler for torch.compile")


@pytest.mark.parametrize("bias", [False, True])
def test_gemv_is_a_matrix_vector_product(bias):
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(96, 40, generator=g), torch.randn(1, 40, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    torch.testing.assert_close(cpu_decode.gemv(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one row; got 2"):
        cpu_decode.gemv(torch.randn(2, 40), w)


def test_it_says_why_it_cannot_run(monkeypatch, embedded):
    assert "CPU path" in cpu_decode.unsupported_reason("meta", torch.float32)
    assert "float16" in cpu_decode.unsupported_reason("cpu", torch.float16)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpu_decode.shutil, "which", lambda name: None)
    monkeypatch.setattr(fast_paths, "_VERDICTS", {})  # probed anew, as in a process on that machine
    assert "C++ compiler" in cpu_decode.unsupported_reason("cpu", torch.float32)
    with pytest.raises(ValueError, match=r"compiled_decode cannot run here: .*torch.compile on a CPU needs a C\+\+"):
        Engine(EngineModel.from_hf(embedded.model), EngineConfig(compiled_decode=True, prepack_weights=False))


@pytest.mark.parametrize(
    "switches, message",
    [
        ({"compile_layers": True}, "no compile_layers"),
        ({"fuse_projections": False}, "needs fuse_projections"),
        ({"weight_quant": "int8", "prepack_weights": False}, "turn off compiled_decode"),
    ],
)
def test_config_refuses_what_it_cannot_combine(switches, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(compiled_decode=True, **switches).validate()


@needs_compiler
def test_one_user_engine_matches_transformers_through_the_compiled_path(embedded, prompts, reference):
    model = EngineModel.from_hf(embedded.model)
    engine = Engine(model, EngineConfig(max_num_seqs=1, compiled_decode=True))
    assert engine.compile_s is not None and engine.compile_s >= 0
    first, second = engine.one_token_fns.custom
    calls = {"steps": 0}

    def counted_first(*args):
        calls["steps"] += 1
        return first(*args)

    engine.one_token_fns = replace(engine.one_token_fns, custom=(counted_first, second))
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == reference
    one_token_steps = sum(len(o.token_ids) - 1 for o in outs)  # every token after a prompt's first
    assert calls["steps"] == one_token_steps * model.shape.layers
    assert_pool_clean(engine)


@needs_compiler
def test_the_bench_also_times_the_same_engine_without_the_compile(embedded):
    from infer_lab.bench.engine import compare_with_hf

    # mixed: no roofline bound to measure (that is timed elsewhere), only the contenders
    result = compare_with_hf(embedded, "mixed", requests=2, max_num_seqs=1, prompt_len=8, output_len=4,
                             rounds=1, contenders=("hf-sequential",), compiled_decode=True)
    assert result.run.decode_path.compiled_decode is True
    assert [c.name for c in result.contenders] == ["hf-sequential", "engine-uncompiled"]
    assert all(c.identical_to_engine for c in result.contenders)
    uncompiled = result.contender("engine-uncompiled")
    assert result.speedup_vs("engine-uncompiled") == pytest.approx(
        result.output_tokens_per_s / uncompiled.tokens_per_s_by_round[0])


def test_transformers_compiled_contender_runs_static_and_leaves_the_model_as_it_was(embedded, monkeypatch):
    """The one-user baseline for compiled decode: HF generate on a static cache through a compiled
    forward. Compiling it takes a minute on 2 cores (the bench does, in its warm-up); here
    torch.compile is the identity, which checks the wiring: the static cache, the same greedy
    tokens as plain generate, the model restored, and the refusal of unequal lengths."""
    from infer_lab.bench import baselines

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    monkeypatch.delitem(embedded.model.__dict__, "_infer_lab_compiled_forward", raising=False)
    wl = baselines.make_workload(embedded, "uniform", 2, 8, 4)
    seen = []
    original = type(embedded.model).forward

    def spy(self, *args, **kwargs):
        seen.append(next((type(v).__name__ for v in kwargs.values() if type(v).__name__.endswith("Cache")), None))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(embedded.model), "forward", spy)
    compiled = baselines.run_contender("hf-compiled", embedded, wl, 1)
    assert calls == [{"dynamic": False}] and set(seen) == {"StaticCache"}
    assert compiled.name == "hf-compiled" and compiled.outputs == baselines.hf_sequential(embedded, wl).outputs
    assert "forward" not in embedded.model.__dict__ and embedded.model.generation_config.cache_implementation is None
    embedded.model.__dict__.pop("_infer_lab_compiled_forward")
    with pytest.raises(ValueError, match="equal-length"):
        baselines.hf_compiled(embedded, baselines.make_workload(embedded, "mixed", 4, 16, 8))
