"""Prepacked (oneDNN) weights on a CPU: the same numbers as F.linear, the same tokens as transformers.

The engine prepacks by default on a CPU, so every other engine test runs prepacked too; this
file checks the switch itself: both settings token-identical to transformers greedy, the cache
that packs a model once, the refusals, and the HF contender that borrows the packed GEMMs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infer_lab.bench.baselines import Workload, prepacked_linears, run_contender
from infer_lab.bench.gemm import measure_gemm_backends
from infer_lab.engine import Engine, EngineConfig, EngineModel, SamplingParams, prepack

from engine_helpers import NEW_TOKENS, assert_pool_clean

pytestmark = pytest.mark.skipif(not prepack.available(), reason="this torch has no oneDNN")


@pytest.fixture(scope="module")
def model(embedded) -> EngineModel:
    return EngineModel.from_hf(embedded.model)


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_prepacked_linear_equals_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(96, 40, generator=g), torch.randn(rows, 40, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    packed = prepack.prepack(w)
    assert prepack.is_prepacked(packed) and not prepack.is_prepacked(w)
    torch.testing.assert_close(prepack.linear(x, packed, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert torch.equal(prepack.linear(x, w, b), F.linear(x, w, b))  # plain weights: F.linear itself


def test_prepacking_refuses_what_it_cannot_pack():
    with pytest.raises(ValueError, match="2-D"):
        prepack.prepack(torch.zeros(3))
    with pytest.raises(ValueError, match="float16"):
        prepack.prepack(torch.zeros(4, 4, dtype=torch.float16))
    assert not prepack.supported(torch.device("cpu"), torch.float16)
    assert prepack.supported(torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("setting", [None, True, False], ids=["auto", "on", "off"])
def test_engine_matches_transformers_prepacked_or_not(model, prompts, reference, setting):
    engine = Engine(model, EngineConfig(max_num_seqs=20, prepack_weights=setting))
    assert engine.prepacked_weights is (setting is not False)  # auto: on, on a CPU with room
    assert engine.model.is_prepacked is engine.prepacked_weights
    outs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == reference
    assert_pool_clean(engine)


def test_prepacked_logits_are_transformers_logits(embedded, model, prompts):
    from infer_lab.engine import AttentionMetadata

    ids = torch.tensor(prompts[3])
    with torch.inference_mode():
        expected = embedded.model(ids[None]).logits[0].float()
    meta = AttentionMetadata(query_lens=[len(ids)], context_lens=[len(ids)], sample_indices=list(range(len(ids))))
    got = model.prepacked().forward(ids, torch.arange(len(ids)), meta, None)
    # float rounding only: another blocking of the same sums (logits here reach about 30)
    torch.testing.assert_close(got, expected, rtol=0, atol=3e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_a_model_is_packed_once_and_again_after_its_weights_change(embedded, model):
    assert EngineModel.from_hf(embedded.model) is model  # same weights: the same EngineModel
    packed = model.prepacked()
    assert model.prepacked() is packed and packed.prepacked() is packed and packed.plain is model
    assert all(prepack.is_prepacked(t) for t in packed.gemm_weights())
    assert packed.embed is model.embed  # only the GEMM weights are copied
    cut = packed.first_layers(4)
    assert cut.is_prepacked and cut.plain.layers[0].qkv_proj is model.layers[0].qkv_proj

    head = embedded.model.lm_head.weight
    with torch.no_grad():
        head.mul_(1.0)  # an in-place change: the version counter moves, the values do not
    assert EngineModel.from_hf(embedded.model) is not model
    assert model.prepacked() is not packed


def test_engine_refuses_prepacking_it_cannot_do(model):
    with pytest.raises(ValueError, match="fuse_projections"):
        Engine(model, EngineConfig(prepack_weights=True, fuse_projections=False))
    with pytest.raises(ValueError, match="compile"):
        Engine(model, EngineConfig(prepack_weights=True, compile_layers=True))
    # auto stays off where prepacking does not apply, and the plain weights run
    assert not Engine(model, EngineConfig(fuse_projections=False)).prepacked_weights
    assert not Engine(model.prepacked(), EngineConfig(prepack_weights=False)).model.is_prepacked


def test_hf_with_prepacked_linears_is_token_identical_and_restored(embedded):
    prompts = [embedded.random_ids(1, n, seed=n)[0].tolist() for n in (7, 19, 30)]
    w = Workload("mixed", prompts, [6, 3, 5])
    plain = run_contender("hf-padded", embedded, w, 2)
    packed = run_contender("hf-padded-prepacked", embedded, w, 2)
    assert packed.name == "hf-padded-prepacked" and packed.outputs == plain.outputs
    linear = embedded.model.lm_head
    assert "forward" not in vars(linear)  # nn.Linear.forward again
    with prepacked_linears(embedded.model) as swapped:
        assert swapped == 1 + 7 * embedded.model.config.num_hidden_layers and "forward" in vars(linear)
    assert "forward" not in vars(linear)


def test_gemm_benchmark_times_both_backends_on_the_same_numbers(embedded):
    (point,) = measure_gemm_backends(embedded, batches=(3,), repeats=1)
    assert point.batch == 3 and point.plain_ms > 0 and point.prepacked_ms > 0
    assert point.weight_bytes == EngineModel.from_hf(embedded.model).gemm_weight_bytes()
    assert point.max_abs_diff < 1e-3
    with pytest.raises(ValueError, match="batch sizes"):
        measure_gemm_backends(embedded, batches=(0,))


def test_bench_gemm_command_prints_json_and_refuses_bad_batches(capsys, tmp_path):
    import json

    from infer_lab.cli import main

    out = tmp_path / "gemm.json"
    assert main(["bench", "gemm", "--batches", "2", "--rounds", "1", "--json", "--save", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert [r["batch"] for r in printed["rows"]] == [2] and printed["threads"] >= 1
    assert printed["command"].startswith("infer-lab bench gemm")
    assert main(["bench", "gemm", "--batches", "0"]) == 2
