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
    plan = engine.gemm_plan
    assert plan.source == {None: "measured", True: "forced on", False: "forced off"}[setting]
    assert engine.prepacked_weights is plan.any_prepacked  # auto: wherever it measured faster
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


def test_one_row_is_timed_every_way_next_to_a_plain_read(embedded):
    from infer_lab.bench.gemm import measure_one_row

    timed = measure_one_row(embedded, repeats=1, compiled=False)
    assert set(timed) == {"plain", "prepacked", "read (sum)"}
    weight_bytes = EngineModel.from_hf(embedded.model).gemm_weight_bytes()
    for r in timed.values():
        assert r["ms"] > 0 and r["gb_per_s"] == pytest.approx(weight_bytes / (r["ms"] * 1e-3) / 1e9)


def test_bench_gemm_command_prints_json_and_refuses_bad_batches(capsys, tmp_path):
    import json

    from infer_lab.cli import main

    out = tmp_path / "gemm.json"
    assert main(["bench", "gemm", "--batches", "2", "--rounds", "1", "--json", "--save", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert [r["batch"] for r in printed["rows"]] == [2] and printed["threads"] >= 1
    assert printed["one_row"] is None  # only measured when the batches include one row
    assert printed["command"].startswith("infer-lab bench gemm")
    assert main(["bench", "gemm", "--batches", "0"]) == 2


def test_a_gemm_plan_is_chosen_from_timings():
    from infer_lab.engine.cpu.gemm_choice import GemmPlan, choose

    # Slower prepacked at one row (as on a Sapphire Rapids), faster from 4 rows on.
    plan = choose([1, 4, 16], plain_ms=[10.0, 20.0, 30.0], prepacked_ms=[12.0, 10.0, 15.0])
    assert plan.prepacked == (False, True, True) and plan.any_prepacked
    assert [plan.use_prepacked(n) for n in (1, 2, 3, 4, 15, 16, 5000)] == [False] * 3 + [True] * 4
    assert plan.describe() == "plain from 1 row, prepacked from 4 rows"
    assert plan.as_dict()["buckets"][0] == {"rows": 1, "prepacked": False, "plain_ms": 10.0, "prepacked_ms": 12.0}
    # Within the margin (5%) the plain path wins: no second copy of the weights for nothing.
    assert choose([1], [10.0], [9.6]).prepacked == (False,)
    assert choose([1], [10.0], [9.4]).prepacked == (True,)
    assert choose([1], [10.0], [9.6], margin=0.0).prepacked == (True,)
    assert GemmPlan.always(True).use_prepacked(1) and not GemmPlan.always(False).use_prepacked(999)
    with pytest.raises(ValueError, match="one entry"):
        choose([1, 4], [1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        choose([1], [0.0], [1.0])
    with pytest.raises(ValueError, match="ascending"):
        GemmPlan((4, 1), (True, False))


def test_measured_plan_times_both_paths_on_a_model(model):
    from infer_lab.engine import gemm_choice

    plan = gemm_choice.measure_plan(model.gemm_weights(), model.prepacked().gemm_weights(), rows=(1, 8),
                                    rounds=1)
    assert plan.rows == (1, 8) and plan.source == "measured" and plan.threads == torch.get_num_threads()
    assert all(t > 0 for t in plan.plain_ms + plan.prepacked_ms)
    # a pass over all the weights at small batches (they must stream from memory), fewer above
    weights = model.gemm_weights()
    assert gemm_choice._count_for(1, weights) == len(weights)
    assert 8 <= gemm_choice._count_for(256, weights) < len(weights)


def test_engine_follows_its_plan_per_step_and_stays_token_identical(model, prompts, reference, monkeypatch):
    from infer_lab.engine import gemm_choice
    from infer_lab.engine.cpu.gemm_choice import choose

    # Plain at one row (a lone decode), prepacked from 2 rows: both paths run in one generation.
    fake = choose([1, 2], plain_ms=[1.0, 2.0], prepacked_ms=[2.0, 1.0])
    monkeypatch.setattr(gemm_choice, "plan_for", lambda *a, **k: fake)
    engine = Engine(model, EngineConfig(max_num_seqs=1))
    assert engine.gemm_plan is fake and engine.model.is_prepacked
    used = []
    for m in (engine.model, engine.model.plain):
        monkeypatch.setattr(m, "forward", lambda *a, _m=m, _f=m.forward, **k: used.append(_m) or _f(*a, **k))
    outs = engine.generate(prompts[:3], SamplingParams(max_tokens=NEW_TOKENS))
    assert [o.token_ids for o in outs] == reference[:3]
    assert {m.is_prepacked for m in used} == {True, False}  # prefills packed, lone decodes plain
    assert_pool_clean(engine)
