"""Every CPU fast path is probed, and without it the engine still serves, or refuses clearly.

An AVX2-only laptop refuses oneDNN's bf16 GEMM; another PyTorch build may lack the int8 or int4
kernel; a machine without a C++ compiler cannot compile the one-token step. Each test here makes
one path report "unsupported" (:func:`infer_lab.fast_paths.refused`, as such a machine would) and
asks: does the engine give transformers' greedy tokens in fp32 on the plain path, and does the
option that needs the path fail with a message naming it and the setting to change?
"""

from __future__ import annotations

import pytest
import torch

from infer_lab import fast_paths
from infer_lab.bench.weight_quant import refused_methods
from infer_lab.engine import Engine, EngineConfig, SamplingParams
from infer_lab.engine.cpu import cpu_decode, prepack
from infer_lab.quant import kernels

from engine_helpers import NEW_TOKENS, assert_pool_clean


def _greedy(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))
    assert_pool_clean(engine)
    return [o.token_ids for o in outs]


def test_each_probe_gives_a_verdict_and_a_refusal_by_choice_wins(monkeypatch):
    for v in (prepack.verdict(torch.float32), prepack.verdict(torch.bfloat16), kernels.verdict("int8"),
              kernels.verdict("int4-g64")):
        assert v.path in fast_paths.PATHS and v.supported == (v.reason is None) and not v.forced
    with fast_paths.refused("int4-kernel"):
        v = kernels.verdict("int4")
        assert not v.supported and v.forced and "refused by choice" in v.reason
        assert "int4-kernel" in fast_paths.asked() and not fast_paths.asked()["int4-kernel"]["supported"]
    assert kernels.verdict("int4").forced is False  # the machine's own verdict is back
    monkeypatch.setenv(fast_paths.ENV_REFUSE, "prepack-bf16")
    assert not prepack.supported("cpu", torch.bfloat16)
    monkeypatch.setenv(fast_paths.ENV_REFUSE, "all")
    assert not any(fast_paths.ask(p, lambda: None).supported for p in fast_paths.PATHS)
    monkeypatch.setenv(fast_paths.ENV_REFUSE, "prepack-bf17")
    with pytest.raises(ValueError, match="unknown fast paths.*prepack-bf17"):
        prepack.verdict(torch.float32)


def test_a_probe_turns_a_refusal_or_a_wrong_answer_into_a_reason(monkeypatch):
    monkeypatch.setattr(fast_paths, "_VERDICTS", {})

    def refuses():
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert\nmore")

    v = fast_paths.ask("prepack-bf16", refuses)
    assert not v.supported and v.reason == ("RuntimeError: mkldnn_reorder_linear_weight: bf16 path needs "
                                            "the cpu support avx_ne_convert")
    assert fast_paths.ask("prepack-bf16", lambda: None) is v  # asked once per process
    assert not fast_paths.ask("int8-kernel", lambda: "the int8 kernel gave other numbers").supported
    assert fast_paths.ask("int4-kernel", lambda: None).supported
    # the comparison a probe makes: shape, finiteness and closeness all count
    a = torch.ones(2, 3)
    assert fast_paths.close(a, a, 0) and not fast_paths.close(a[:1], a, 1)
    assert not fast_paths.close(a * float("nan"), a, 1) and not fast_paths.close(a * 1.1, a, 0.05)


def test_without_prepacked_fp32_the_engine_serves_on_plain_f_linear(embedded, prompts, reference):
    with fast_paths.refused("prepack-fp32"):
        engine = Engine.from_loaded(embedded, EngineConfig())
        assert engine.gemm_plan.source == "refused here" and not engine.gemm_plan.any_prepacked
        assert "does not run here" in engine.gemm_plan.describe()
        assert _greedy(engine, prompts[:6]) == reference[:6]
        with pytest.raises(ValueError, match=r"prepack_weights=True cannot run here.*prepacked oneDNN GEMM on "
                                             r"fp32.*set it to False"):
            Engine.from_loaded(embedded, EngineConfig(prepack_weights=True))


def test_without_the_bf16_kernel_a_bf16_engine_multiplies_bf16_weights_with_f_linear(embedded, prompts):
    """The fallback the issue asks for: plain F.linear on bf16 weights, and the plan says why."""
    with fast_paths.refused("prepack-bf16"):
        engine = Engine.from_loaded(embedded, EngineConfig(max_num_seqs=4, dtype="bf16"))
        assert engine.model.dtype == torch.bfloat16 and not engine.model.is_prepacked
        assert engine.gemm_plan.refused and "bf16" in engine.gemm_plan.refused
        outs = _greedy(engine, prompts[:4])
        assert all(len(o) >= 1 for o in outs)
        assert refused_methods(("bf16",)) == {}  # bf16 is never skipped: it runs on F.linear
    # fp32 is untouched by the bf16 refusal
    assert prepack.supported("cpu", torch.float32) == prepack.verdict(torch.float32).supported


@pytest.mark.parametrize("path, method", [("int8-kernel", "int8"), ("int4-kernel", "int4"),
                                          ("int8-kernel", "int4-g64")])
def test_without_a_quantized_kernel_the_option_is_refused_by_name_and_fp32_still_serves(
    embedded, prompts, reference, path, method
):
    with fast_paths.refused(path):
        with pytest.raises(ValueError, match=rf"weight_quant='{method}' cannot run here: .*{path.split('-')[0]}.*"
                                             r"Leave weight_quant at None"):
            Engine.from_loaded(embedded, EngineConfig(weight_quant=method))
        assert set(refused_methods((method, "bf16"))) == {method}
        assert _greedy(Engine.from_loaded(embedded, EngineConfig()), prompts[:3]) == reference[:3]


def test_without_a_quantized_kernel_the_reference_layers_run(embedded):
    """Chapter 06's comparison swaps a quantized layer to its kernel only where the kernel runs."""
    from infer_lab.quant.linear import DequantLinear

    layer = torch.nn.Linear(64, 16, bias=False)
    model = torch.nn.Sequential(DequantLinear.from_linear(layer, "int8"))
    x = torch.randn(2, 64)
    with kernels.kernel_linears(model) as used:
        assert used == (["aten._weight_int8pack_mm"] if kernels.verdict("int8").supported else [])
    with fast_paths.refused("int8-kernel"), kernels.kernel_linears(model) as used:
        assert used == []
        torch.testing.assert_close(model(x), model[0].__class__.forward(model[0], x))


def test_without_a_compiler_compiled_decode_and_compiled_layers_are_refused_by_name(embedded, monkeypatch):
    with fast_paths.refused("torch-compile"):
        with pytest.raises(ValueError, match=r"compiled_decode cannot run here: .*torch.compile.*"
                                             r"Set compiled_decode=False"):
            Engine.from_loaded(embedded, EngineConfig(max_num_seqs=1, compiled_decode=True))
        with pytest.raises(ValueError, match=r"compile_layers cannot run here: .*torch.compile.*"
                                             r"Set compile_layers=False"):
            Engine.from_loaded(embedded, EngineConfig(prepack_weights=False, compile_layers=True))
    # a machine with no C++ compiler at all: the probe itself says so, without compiling anything
    monkeypatch.setattr(fast_paths, "_VERDICTS", {})
    monkeypatch.setattr(cpu_decode, "compiler", lambda: None)
    assert "needs a C++ compiler" in cpu_decode.unsupported_reason("cpu", torch.float32)
