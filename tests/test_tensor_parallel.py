"""Tensor parallelism from scratch: the split rule, shards that add up, token identity at world
size 2 (two gloo processes, started once for this module), the all-reduce count, the command."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from infer_lab.analysis.memory import as_shape
from infer_lab.cli import main
from infer_lab.engine.layers import attention_inputs, rms_norm, rope_cos_sin
from infer_lab.parallel import shard
from infer_lab.parallel.bench import default_sizes
from infer_lab.parallel.comm import Communicator
from infer_lab.parallel.runtime import TPGroup, run_local, tp_engine_model

from engine_helpers import NEW_TOKENS

SMOL = as_shape("smollm2-135m")  # 30 layers, 9 query heads, 3 KV heads, hidden 576, MLP 1536
PER_STEP = 2 * SMOL.layers


@pytest.fixture(scope="module")
def engine_model(embedded):
    return tp_engine_model(embedded)


@pytest.fixture(scope="module")
def tp2(engine_model, prompts):
    """World size 2 on the 20 prompts x 10 tokens, and a short all-reduce sweep, on one group."""
    with TPGroup(engine_model, world_size=2, backend="gloo", threads_per_rank=1) as group:
        run = group.generate(prompts, NEW_TOKENS)
        sweep = group.allreduce_sweep(default_sizes(quick=True), repeats=5, warmup=1)
    return run, sweep


# ---------------------------------------------------------------------------------------------
# The split rule


def test_split_evenly_gives_the_extra_to_the_first_parts():
    assert shard.split_evenly(9, 2) == [(0, 5), (5, 9)]
    assert shard.split_evenly(1536, 2) == [(0, 768), (768, 1536)]
    assert shard.split_evenly(3, 3) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError):
        shard.split_evenly(3, 0)


def test_the_rule_splits_whole_kv_groups_2_plus_1():
    plan = shard.plan_shards(SMOL, 2)
    r0, r1 = plan.shares
    assert (r0.kv_heads, r0.q_heads, r0.mlp) == ((0, 2), (0, 6), (0, 768))
    assert (r1.kv_heads, r1.q_heads, r1.mlp) == ((2, 3), (6, 9), (768, 1536))
    assert plan.largest_share == pytest.approx((6 * 2 + 2 * 2) / (9 * 2 + 3 * 2) * 0.25 + 0.5 * 0.75)
    assert 0.5 < plan.largest_share < plan.busiest_work_share < 1  # uneven split, replicated LM head
    assert [s.n_heads for s in shard.plan_shards(SMOL, 3).shares] == [3, 3, 3]
    assert shard.plan_shards(SMOL, 1).busiest_work_share == 1


def test_more_ranks_than_kv_heads_or_ungrouped_heads_are_refused():
    with pytest.raises(ValueError, match="at most 3 ranks"):
        shard.plan_shards(SMOL, 4)
    with pytest.raises(ValueError, match="do not form groups"):
        shard.plan_shards(dataclasses.replace(SMOL, heads=10), 2)
    with pytest.raises(ValueError, match=">= 1"):
        shard.plan_shards(SMOL, 0)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_weights_add_up_to_the_full_parameter_count(embedded, engine_model, world_size):
    shards = shard.shard_model(engine_model, world_size)
    counts = [s.param_counts() for s in shards]
    replicated = {r for _, r in counts}
    assert len(replicated) == 1  # every rank holds the same replicated tensors
    assert sum(split for split, _ in counts) + replicated.pop() == embedded.n_params


def test_column_slices_and_row_partial_sums_rebuild_the_full_layer(engine_model):
    """The layer's math, one rank at a time in this process: column-parallel outputs are slices
    of the full outputs, row-parallel partial sums add up to the full outputs."""
    full, shards = engine_model.layers[0], shard.shard_model(engine_model, 2)
    eps, d = SMOL.rms_norm_eps, SMOL.head_dim
    h = torch.randn(5, SMOL.hidden, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(torch.arange(5), engine_model.inv_freq, h.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]
    q, k, v = attention_inputs(h, full.input_norm, full.qkv_proj, None, cos, sin, eps, 9, 3, d)
    attn = torch.randn(5, 9 * d, generator=torch.Generator().manual_seed(1))
    x = rms_norm(h, full.post_attention_norm, eps)
    gate, up = F.linear(x, full.gate_up_proj).chunk(2, dim=-1)
    act = F.silu(gate) * up
    o_sum, down_sum = 0, 0
    for s in shards:
        w, sh = s.layers[0], s.share
        qs, ks, vs = attention_inputs(h, w.input_norm, w.qkv_proj, None, cos, sin, eps, sh.n_heads, sh.n_kv_heads, d)
        torch.testing.assert_close(qs, q[:, sh.q_heads[0] : sh.q_heads[1]])
        torch.testing.assert_close(ks, k[:, sh.kv_heads[0] : sh.kv_heads[1]])
        torch.testing.assert_close(vs, v[:, sh.kv_heads[0] : sh.kv_heads[1]])
        o_sum = o_sum + F.linear(attn[:, sh.q_heads[0] * d : sh.q_heads[1] * d], w.o_proj)
        g, u = F.linear(x, w.gate_up_proj).chunk(2, dim=-1)
        torch.testing.assert_close(g, gate[:, sh.mlp[0] : sh.mlp[1]])
        down_sum = down_sum + F.linear(F.silu(g) * u, w.down_proj)
    torch.testing.assert_close(o_sum, F.linear(attn, full.o_proj), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(down_sum, F.linear(act, full.down_proj), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Runs: world size 1 here, world size 2 in two processes


def test_world_size_1_matches_transformers_with_no_all_reduce(engine_model, prompts, reference):
    run = run_local(engine_model, prompts, NEW_TOKENS)
    assert run.token_ids == reference
    assert run.allreduce_count == 0 and all(s.comm_s == 0 for s in run.steps)


def test_world_size_2_is_token_identical_to_world_size_1_and_transformers(tp2, reference):
    run, _ = tp2
    assert run.world_size == 2 and [r.rank for r in run.ranks] == [0, 1]
    assert run.token_ids == reference  # all 20 prompts, 10 tokens, EOS kept
    assert run.ranks[1].token_ids == run.ranks[0].token_ids


def test_two_all_reduces_per_layer_every_step(tp2):
    run, _ = tp2
    assert run.steps[0].phase == "prefill" and len(run.steps) == NEW_TOKENS
    for rank in run.ranks:
        for s in rank.steps:
            assert s.allreduce_calls == PER_STEP
            assert s.allreduce_bytes == PER_STEP * s.tokens * SMOL.hidden * 4  # fp32 activations
            assert 0 < s.comm_s < s.wall_s
    assert run.allreduce_count == PER_STEP * len(run.steps)
    assert run.decode_split().allreduce_calls == PER_STEP


def test_each_rank_caches_only_its_kv_heads(tp2):
    run, _ = tp2
    rank0, rank1 = (r.kv_cache_bytes for r in run.ranks)
    assert rank0 == 2 * rank1  # KV heads 0-1 on rank 0, KV head 2 on rank 1


def test_allreduce_sweep_fits_a_latency_and_a_bandwidth(tp2):
    _, sweep = tp2
    assert [p.message_bytes for p in sweep.points] == list(default_sizes(quick=True))
    assert all(p.repeats == 5 and 0 < p.min_s <= p.p50_s <= p.p90_s for p in sweep.points)
    assert sweep.bus_bandwidth_Bps > 0 and sweep.latency_s >= 0 and sweep.fitted_on in ("p50", "min")
    sizes = [p.message_bytes for p in sweep.points]
    predicted = [sweep.predicted_s(b) for b in sizes]
    assert predicted == sorted(predicted) and predicted[-1] > predicted[0]


def test_bad_groups_fail_before_any_process_starts(engine_model):
    with pytest.raises(ValueError, match="run_local"):
        TPGroup(engine_model, world_size=1)
    with pytest.raises(ValueError, match="at most 3 ranks"):
        TPGroup(engine_model, world_size=4)
    with pytest.raises(ValueError, match="gloo"):
        TPGroup(engine_model, world_size=2, backend="mpi")
    if torch.cuda.device_count() < 2:
        with pytest.raises(ValueError, match="one GPU per rank"):
            TPGroup(engine_model, world_size=2, backend="nccl")
    with pytest.raises(RuntimeError, match="not started"):
        TPGroup(engine_model, world_size=2).generate([[1, 2]], 2)


def test_a_lone_communicator_reduces_nothing():
    comm = Communicator(0, 1)
    t = torch.ones(3)
    assert comm.all_reduce(t) is t and comm.stats().calls == 0
    with pytest.raises(ValueError, match="outside"):
        Communicator(2, 2)


# ---------------------------------------------------------------------------------------------
# The command, and the scaling model


def test_tp_command_json_and_its_errors(capsys):
    assert main(["tp", "--world-size", "2", "--max-new-tokens", "3", "--ignore-eos", "--json", "Hello"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"text", "token_ids", "allreduce_count", "allreduce_bytes", "ranks", "plan"} <= set(d)
    assert len(d["token_ids"]) == 3 and isinstance(d["text"], str) and d["text"]
    assert d["allreduce_count"] == 3 * PER_STEP and d["allreduces_per_step_expected"] == PER_STEP
    hidden_bytes = SMOL.hidden * 4
    assert d["allreduce_bytes"] == PER_STEP * hidden_bytes * (d["prompt_tokens"] + 2)
    for r in d["ranks"]:
        assert r["decode"]["allreduces_per_step"] == PER_STEP
        assert r["decode"]["wall_ms_p50"] >= r["decode"]["comm_ms_p50"] > 0
    assert main(["tp", "--world-size", "4", "hi"]) == 2
    assert "at most 3 ranks" in capsys.readouterr().err
    assert main(["tp", "--world-size", "1", "--max-new-tokens", "2", "--json", "hi"]) == 0
    assert json.loads(capsys.readouterr().out)["allreduce_count"] == 0


def test_tp_scaling_is_strictly_sublinear_in_the_chapter_model():
    from infer_lab.course import ch14_tensor_parallel as ch14

    s = ch14.scaling_result("llama-3-70b", 16, 8192)
    for r in s.rows:
        if r.tp > 1:
            assert r.speedup_vs_tp1 < r.tp and r.allreduce_ms > 0
    for gpu in ("H100-SXM", "H100-PCIe"):
        itl = [s.row(gpu, n).itl_ms for n in (1, 2, 4, 8)]
        assert itl == sorted(itl, reverse=True)  # more GPUs still help this model
    small_tp1, small_tp2 = s.small_model_rows
    assert small_tp2.itl_ms > small_tp1.itl_ms  # the embedded model: all-reduces cost more than they save
