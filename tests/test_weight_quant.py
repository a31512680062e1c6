"""Quantized GEMM weights through PyTorch's fused CPU kernels: the reference's numbers, the engine option.

The readable reference (:class:`~infer_lab.quant.linear.DequantLinear`) and the kernels must
compute the same product from the same codes (up to the kernels' bf16 activations); the engine
on int8/int4 weights must stay close to fp32 (top-1 agreement, perplexity), and refuse what it
cannot do.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infer_lab.engine import Engine, EngineConfig, EngineModel, SamplingParams
from infer_lab.quant import kernels
from infer_lab.quant.formats import (
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8_absmax,
    quantize_q4_1,
)
from infer_lab.quant.linear import DequantLinear

from engine_helpers import assert_pool_clean

pytestmark = pytest.mark.skipif(not kernels.available(), reason="this torch lacks the CPU int8/int4 kernels")


def _close_to_reference(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    # The kernels multiply bf16 activations by bf16 scales: about 2^-8 relative, never more.
    expected = x.bfloat16().float() @ w.T
    assert (got - expected).abs().max() <= 0.01 * expected.abs().max()


@pytest.mark.parametrize("rows", [1, 3])
def test_kernels_compute_the_reference_product_from_the_same_codes(rows):
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(96, 128, generator=g) * 0.02, torch.randn(rows, 128, generator=g)
    q, scale = quantize_int8_absmax(w)
    _close_to_reference(kernels.int8_weight(w).linear(x), x, dequantize_int8(q, scale))
    for stored in (quantize_q4_1(w, 32), quantize_int4(w, 64), quantize_int4(w, 64, symmetric=True)):
        _close_to_reference(kernels.int4_from_stored(stored).linear(x), x, dequantize_int4(stored))
    packed = kernels.int4_weight(w)  # Q4_1 codes in groups of 32
    _close_to_reference(packed.linear(x), x, dequantize_int4(quantize_q4_1(w, 32)))
    assert packed.nbytes < kernels.int8_weight(w).nbytes < w.numel() * 4
    bias = torch.randn(96, generator=g)
    torch.testing.assert_close(packed.linear(x, bias), packed.linear(x) + bias)
    assert packed.linear(x[None]).shape == (1, rows, 96)  # leading dimensions are kept


def test_method_names_and_group_sizes_are_checked():
    assert kernels.parse_method("int8") == ("int8", 0)
    assert kernels.parse_method("int4") == ("int4", 32) and kernels.parse_method("int4-g128") == ("int4", 128)
    for bad in ("int3", "int4-g48", "nf4"):
        with pytest.raises(ValueError, match="int8, int4"):
            kernels.parse_method(bad)
    with pytest.raises(ValueError, match="group size"):
        kernels.int4_from_stored(quantize_q4_1(torch.randn(8, 96), 96))


def test_kernel_linears_swap_the_reference_layers_and_restore_them():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16))
    model[0] = DequantLinear.from_linear(model[0], "int8")
    model[1] = DequantLinear.from_linear(model[1], "nf4", group_size=32)  # no kernel: stays the reference
    x = torch.randn(2, 64, generator=g)
    with torch.inference_mode():
        reference = model(x)
        with kernels.kernel_linears(model) as used:
            fast = model(x)
            assert used == ["aten._weight_int8pack_mm"] and "forward" in vars(model[0])
        assert "forward" not in vars(model[0]) and torch.equal(model(x), reference)
    assert (fast - reference).abs().max() <= 0.02 * reference.abs().max()


def test_engine_on_quantized_weights_stays_close_to_fp32(embedded, prompts):
    from infer_lab.bench.weight_quant import quality

    base = EngineModel.from_hf(embedded.model).plain
    int8 = base.quantized("int8")
    assert base.quantized("int8") is int8 and int8.quant_method == "int8"  # made once
    assert int8.gemm_weight_bytes_stored() < 0.3 * base.gemm_weight_bytes_stored()
    assert int8.embed is base.embed  # only the GEMM weights are quantized
    scores = quality(embedded, ("int8", "int4", "bf16"), eval_tokens=260, window=128)
    assert scores["float32"]["top1_agreement"] == 1.0 and scores["float32"]["perplexity_change"] == 0
    assert scores["int8"]["top1_agreement"] >= 0.9 and abs(scores["int8"]["perplexity_change"]) < 0.03
    assert scores["int4"]["top1_agreement"] >= 0.8 and abs(scores["int4"]["perplexity_change"]) < 0.15
    # bf16 (the engine's dtype option) rounds every weight and activation: close, not equal.
    assert scores["bf16"]["top1_agreement"] >= 0.9 and abs(scores["bf16"]["perplexity_change"]) < 0.03
    bf16 = base.cast(torch.bfloat16)
    assert base.cast(torch.bfloat16) is bf16 and bf16.dtype == torch.bfloat16 and base.cast(torch.float32) is base
    # The engine runs on them end to end; its first token (after the prompt) mostly agrees with fp32.
    params = SamplingParams(max_tokens=2)
    firsts = {}
    for method in (None, "int8", "bf16"):
        config = EngineConfig(max_num_seqs=8, **({"dtype": method} if method == "bf16" else {"weight_quant": method}))
        engine = Engine(base, config)
        firsts[method] = [o.token_ids[0] for o in engine.generate(prompts[:8], params)]
        assert_pool_clean(engine)
        assert engine.model.dtype == (torch.bfloat16 if method == "bf16" else torch.float32)
        if method == "int8":
            assert not engine.gemm_plan.any_prepacked and engine.model.quant_method == "int8"
    for method in ("int8", "bf16"):
        assert sum(a == b for a, b in zip(firsts[None], firsts[method], strict=True)) >= 6


def test_engine_refuses_weight_quant_it_cannot_do(embedded):
    base = EngineModel.from_hf(embedded.model)
    with pytest.raises(ValueError, match="int8, int4"):
        Engine(base, EngineConfig(weight_quant="int5"))
    with pytest.raises(ValueError, match="dtype"):
        Engine(base, EngineConfig(dtype="fp16"))
    with pytest.raises(ValueError, match="prepack_weights"):
        Engine(base, EngineConfig(weight_quant="int8", prepack_weights=True))
    with pytest.raises(ValueError, match="fuse_projections"):
        Engine(base, EngineConfig(weight_quant="int8", fuse_projections=False))
    with pytest.raises(ValueError, match="already quantized"):
        base.plain.quantized("int8").quantized("int4")
    with pytest.raises(ValueError, match="not prepacked"):
        base.plain.quantized("int8").prepacked()
