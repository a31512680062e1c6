"""Beyond one GPU, analytically: interconnect catalog, ring all-reduce, TP/PP/DP, the planner's
layouts, the Pareto frontier, engine launch flags for distributed serving."""

from __future__ import annotations

import json
import math

import pytest

from infer_lab import catalog, launchers
from infer_lab.analysis import capacity, parallel, roofline
from infer_lab.cli import main

# ---------------------------------------------------------------------------------------------
# Catalog


def test_every_gpu_names_a_sourced_interconnect():
    for name in catalog.list_gpus():
        link = catalog.get_gpu(name).link()
        assert link.per_direction_gbps == pytest.approx(link.total_bidirectional_gbps / 2)
        assert link.source and link.busbw_source and link.latency_source and link.recorded
        assert 0 < link.ring_busbw_gbps <= link.per_direction_gbps  # a ring cannot beat one direction


def test_h100_sxm_nvlink_is_900_bidirectional_and_the_model_uses_450_per_direction():
    link = catalog.get_gpu("H100-SXM").link()
    assert link.name == "nvlink4-nvswitch" and link.total_bidirectional_gbps == 900
    assert link.bus_bandwidth_Bps(8) == 450e9
    assert catalog.get_gpu("H100-PCIe").link().kind == "pcie"
    assert catalog.get_gpu("L40S").link().kind == "pcie"


def test_mesh_groups_use_only_their_links():
    mesh = catalog.get_interconnect("xgmi-mi300x-mesh")
    assert mesh.bus_bandwidth_Bps(2) == pytest.approx(mesh.bus_bandwidth_Bps(8) / 7)
    assert mesh.bus_bandwidth_Bps(8) == pytest.approx(448e9)


def test_unknown_interconnect_lists_known():
    with pytest.raises(catalog.UnknownNameError, match="nvlink4-nvswitch"):
        catalog.get_interconnect("nvlink9")


def test_wafer_scale_chip_is_cited_not_a_planner_gpu():
    wse = catalog.get_cited_chip("Cerebras-WSE-3")
    assert "Cerebras-WSE-3" not in catalog.list_gpus()
    with pytest.raises(catalog.UnknownNameError):
        catalog.get_gpu("Cerebras-WSE-3")
    ratio = wse.bandwidth_ratio_vs("H100-SXM")
    assert ratio == pytest.approx(21e15 / 3.35e12)
    assert round(ratio, -2) == 6300 and abs(ratio - wse.talk_claims["bandwidth_vs_h100_hbm"]) > 500
    assert wse.claimed_speedup() == pytest.approx(3000 / 600)
    assert wse.source and "cerebras" in wse.source.lower()


# ---------------------------------------------------------------------------------------------
# Ring all-reduce, hand-checked


def test_ring_allreduce_on_nvlink_by_hand():
    # 4 ranks, 16 users x 8192 hidden x 2 B: base 6.6 us + 6 hops x 0.6 us + 6/4 x S / 450 GB/s
    s = 16 * 8192 * 2
    cost = parallel.allreduce_cost(4, s, "nvlink4-nvswitch")
    assert cost.base_s == pytest.approx(6.6e-6)
    assert cost.latency_s == pytest.approx(6 * 0.6e-6)
    assert cost.bandwidth_s == pytest.approx(1.5 * 262_144 / 450e9)
    assert cost.total_s == pytest.approx(6.6e-6 + 3.6e-6 + 0.8738e-6, rel=1e-4)


def test_ring_allreduce_on_pcie_by_hand():
    # 8 ranks, 1 MB: 6.6 us + 14 x 1.0 us + 14/8 x 1e6 / 40 GB/s = 64.35 us
    assert parallel.ring_allreduce_s(8, 1_000_000, "pcie5-x16") == pytest.approx(64.35e-6)


def test_one_rank_costs_nothing_and_groups_cannot_exceed_the_link():
    assert parallel.ring_allreduce_s(1, 10**9, None) == 0.0
    with pytest.raises(ValueError, match="at most 8"):
        parallel.ring_allreduce_s(16, 1000, "nvlink4-nvswitch")


def test_fitted_allreduce_recovers_latency_and_bandwidth():
    hop, busbw, n = 5e-6, 2e9, 2
    samples = [(s, 2 * (n - 1) * hop + 2 * (n - 1) / n * s / busbw) for s in (1e3, 1e5, 1e6, 1e7)]
    link = parallel.fit_allreduce(samples, n)
    assert link.ring_busbw_gbps == pytest.approx(2.0)
    assert parallel.ring_allreduce_s(n, 4e6, link) == pytest.approx(2 * hop + 4e6 / busbw)
    with pytest.raises(ValueError, match="two message sizes"):
        parallel.fit_allreduce([(1e3, 1e-5)], 2)


# ---------------------------------------------------------------------------------------------
# Tensor parallelism in the roofline


def test_tp_step_is_compute_over_ranks_plus_two_allreduces_per_layer():
    one = roofline.predict_decode("llama-3-70b", roofline.gpu_roof("H100-SXM"), 16, 8192)
    four = roofline.predict_decode("llama-3-70b", roofline.gpu_roof("H100-SXM", n_gpus=4), 16, 8192)
    assert four.compute_s == pytest.approx(one.time_s / 4)  # 8 KV heads split over 4 ranks
    assert four.allreduce_count == 2 * 80 and four.allreduce_bytes == 16 * 8192 * 2
    each = parallel.ring_allreduce_s(4, 16 * 8192 * 2, "nvlink4-nvswitch")
    assert four.allreduce_s == pytest.approx(160 * each)
    assert four.time_s == pytest.approx(four.compute_s + four.allreduce_s)


@pytest.mark.parametrize("model", ["llama-3-8b", "llama-3-70b"])
@pytest.mark.parametrize("gpu", ["H100-SXM", "H100-PCIe"])
def test_tp_scaling_is_strictly_sublinear(model, gpu):
    itl = {
        n: roofline.predict_decode(model, roofline.gpu_roof(gpu, n_gpus=n), 16, 8192).time_s
        for n in (1, 2, 4, 8)
    }
    for n in (2, 4, 8):
        assert itl[n] < itl[n // 2]  # more GPUs still help
        assert itl[n] * n > itl[1]  # but never n times
    assert itl[1] / itl[4] < 3.6  # 4x the GPUs: clearly less than 4x the speed


def test_kv_heads_replicate_when_ranks_outnumber_them():
    assert parallel.kv_replication("llama-3-70b", 8) == 1
    assert parallel.kv_replication("qwen2.5-7b", 8) == 2  # 4 KV heads on 8 ranks
    assert parallel.kv_replication("deepseek-v3", 4) == 4  # an MLA latent is not split
    shape = parallel.replica_fit("qwen2.5-7b", "H100-SXM", parallel.Layout(tp=8), 4096)
    plain = parallel.replica_fit("qwen2.5-7b", "H100-SXM", parallel.Layout(tp=4), 4096)
    assert shape.kv_bytes_per_user == 2 * plain.kv_bytes_per_user


def test_roofline_cli_json_has_the_allreduce_and_parallelism(capsys):
    argv = ["roofline", "--model", "llama-3-70b", "--gpu", "H100-SXM", "--gpus", "4", "--batch", "16"]
    assert main([*argv, "--context", "8192", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["parallelism"] == "TP4" and d["interconnect"] == "nvlink4-nvswitch"
    assert d["allreduce_ms_per_step"] > 0 and d["decode"]["allreduce_count"] == 160
    assert d["itl_ms"] == pytest.approx(d["decode"]["time_s"] * 1e3)


# ---------------------------------------------------------------------------------------------
# Pipeline and data parallelism


def test_layouts_parse_and_enumerate():
    assert parallel.Layout.parse("tp2xdp2") == parallel.Layout(tp=2, dp=2)
    assert parallel.Layout.parse("TP4 x PP2").label == "TP4 x PP2"
    assert [lay.label for lay in parallel.layouts_for(4)] == ["TP4", "TP2 x DP2", "DP4"]
    with pytest.raises(ValueError, match="tp4"):
        parallel.Layout.parse("four gpus")


def test_pipeline_adds_memory_not_speed():
    tp2 = parallel.predict_layout_decode("llama-3-8b", "H100-SXM", parallel.Layout(tp=2), 32, 4096)
    pp2 = parallel.predict_layout_decode("llama-3-8b", "H100-SXM", parallel.Layout(pp=2), 32, 4096)
    one = parallel.predict_layout_decode("llama-3-8b", "H100-SXM", parallel.Layout(), 32, 4096)
    assert tp2.time_s < pp2.time_s < one.time_s  # PP splits only the KV reads; weights are re-read
    lonely = parallel.predict_layout_decode("llama-3-8b", "H100-SXM", parallel.Layout(pp=4), 1, 4096)
    assert lonely.micro_batches == 1 and lonely.bubble_fraction > 0.7  # 1 micro-batch, 4 stages


def test_pipeline_prefill_bubble_is_gpipes():
    step = parallel.predict_layout_prefill(
        "llama-3-8b", "H100-SXM", parallel.Layout(pp=4), 4096, chunks=4
    )
    assert step.bubble_fraction == pytest.approx(3 / 7)


# ---------------------------------------------------------------------------------------------
# The capacity planner's answer changes


def test_planner_itl_one_to_four_gpus_improves_clearly_less_than_4x():
    kw = dict(context=8192, users=16)
    one = capacity.plan("llama-3-8b", "H100-SXM", 1, **kw)
    four = capacity.plan("llama-3-8b", "H100-SXM", 4, **kw)
    assert four.parallelism == "TP4" and four.allreduce_ms_per_step > 0
    assert one.itl_ms / four.itl_ms < 3.6
    big = {n: capacity.plan("llama-3-70b", "H100-SXM", n, **kw) for n in (2, 4, 8)}
    reference = roofline.predict_decode("llama-3-70b", roofline.gpu_roof("H100-SXM"), 16, 8192)
    for n, p in big.items():  # the old model said reference / n (27.2, 13.6, 6.8 ms)
        assert p.itl_ms > reference.time_s * 1e3 / n


def test_on_pcie_replicas_beat_tensor_parallel_but_not_on_nvlink():
    kw = dict(context=4096, itl_slo_ms=50)
    pcie = {p.parallelism: p for p in capacity.plan_layouts("llama-3-8b", "H100-PCIe", 4, **kw)}
    nvl = {p.parallelism: p for p in capacity.plan_layouts("llama-3-8b", "H100-SXM", 4, **kw)}
    assert pcie["DP4"].tokens_per_s > pcie["TP4"].tokens_per_s
    assert pcie["DP4"].input_tokens_per_s > 3 * pcie["TP4"].input_tokens_per_s  # prefill: big messages
    assert nvl["TP4"].tokens_per_s > nvl["DP4"].tokens_per_s
    assert pcie["TP4"].allreduce_ms_per_step > 3 * nvl["TP4"].allreduce_ms_per_step


def test_recommend_says_how_many_gpus_and_which_parallelism():
    rec = capacity.recommend("llama-3-70b", "H100-SXM", context=8192, itl_slo_ms=30, min_users=16)
    assert rec.plan is not None and rec.plan.meets_slo and rec.n_gpus == rec.plan.n_gpus
    assert rec.parallelism == rec.plan.parallelism
    smaller = [p for p in rec.considered if p.n_gpus < rec.n_gpus]
    assert smaller and not any(p.meets_slo for p in smaller)
    none = capacity.recommend("llama-3-70b", "T4", counts=(1, 2), context=8192)
    assert none.n_gpus is None and "no layout" in none.reason


def test_capacity_cli_json_has_allreduce_parallelism_and_recommendation(capsys):
    argv = ["capacity", "--model", "llama-3-8b", "--gpu", "H100-PCIe", "--gpus", "4"]
    assert main([*argv, "--itl-slo-ms", "50", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    layouts = {p["parallelism"] for p in d["plans"]}
    assert layouts == {"TP4", "TP2 x DP2", "DP4"}
    assert all("allreduce_ms_per_step" in p for p in d["plans"])
    assert d["recommended"]["n_gpus"] >= 1 and d["recommended"]["parallelism"]
    assert main([*argv, "--parallelism", "tp2xdp2", "--json"]) == 0
    (only,) = json.loads(capsys.readouterr().out)["plans"]
    assert only["tp"] == 2 and only["dp"] == 2
    assert main([*argv, "--parallelism", "tp8"]) == 2
    assert "uses 8 GPUs" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The Pareto frontier


def test_frontier_points_are_undominated_and_energy_comes_from_tdp():
    points = parallel.parallelism_frontier("llama-3-70b", "H100-SXM", 8192)
    front = [p for p in points if p.on_frontier]
    tps = {p.tp for p in points}
    assert front and 1 not in tps and 8 in tps  # 141 GB of weights do not fit one 80 GB GPU
    for p in front:
        assert not any(
            q.tokens_per_s_per_user > p.tokens_per_s_per_user
            and q.tokens_per_s_per_gpu > p.tokens_per_s_per_gpu
            for q in points
        )
    p = points[0]
    assert p.joules_per_token == pytest.approx(700 * p.tp * p.itl_ms / 1e3 / p.batch)
    assert p.usd_per_m_tokens == pytest.approx(2.99 * p.tp / (p.batch / (p.itl_ms / 1e3)) / 3600 * 1e6)


def test_fast_mode_costs_more_compute_per_token_than_it_gains_in_speed_at_the_fast_end():
    points = parallel.parallelism_frontier("llama-3-70b", "H100-SXM", 8192)
    fm = parallel.fast_mode(points, speedup=2.0)
    assert fm.speedup >= 2.0 and fm.compute_ratio > 1.5
    faster = parallel.fast_mode(points, speedup=3.0)
    assert faster.compute_ratio / faster.speedup > fm.compute_ratio / fm.speedup  # convex frontier
    assert parallel.fast_mode(points, speedup=100.0) is None


def test_scaling_table_marks_what_does_not_fit():
    rows = parallel.scaling_table("llama-3-70b", ("H100-SXM",))
    assert [r["fits"] for r in rows] == [False, False, True, True]
    assert all(r["speedup_vs_tp1"] < r["ideal_speedup"] for r in rows[1:])


# ---------------------------------------------------------------------------------------------
# Distributed engine launch flags


def test_vllm_parallel_and_disaggregation_flags():
    opts = launchers.EngineOptions(
        "m", tensor_parallel=2, pipeline_parallel=2, data_parallel=4, disaggregation="prefill"
    )
    cmd = launchers.build_command("vllm", opts, python="python")
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--pipeline-parallel-size") + 1] == "2"
    assert cmd[cmd.index("--data-parallel-size") + 1] == "4"
    config = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    opts.disaggregation = "decode"
    cmd = launchers.build_command("vllm", opts)
    assert json.loads(cmd[cmd.index("--kv-transfer-config") + 1])["kv_role"] == "kv_consumer"
    assert opts.n_gpus == 16
    plain = launchers.build_command("vllm", launchers.EngineOptions("m"))
    assert "--pipeline-parallel-size" not in plain and "--kv-transfer-config" not in plain


def test_sglang_parallel_and_pd_flags_and_router():
    opts = launchers.EngineOptions(
        "m", tensor_parallel=4, pipeline_parallel=2, data_parallel=2, disaggregation="decode",
        transfer_backend="nixl", bootstrap_port=8998, ib_device="mlx5_0",
    )
    cmd = launchers.build_command("sglang", opts)
    for flag, value in (
        ("--tp-size", "4"), ("--pp-size", "2"), ("--dp-size", "2"),
        ("--disaggregation-mode", "decode"), ("--disaggregation-transfer-backend", "nixl"),
        ("--disaggregation-bootstrap-port", "8998"), ("--disaggregation-ib-device", "mlx5_0"),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    router = launchers.pd_router_command("sglang", ["http://p:30000"], ["http://d1:30001", "http://d2:30001"])
    assert router[:4] == ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    assert router.count("--decode") == 2 and router[router.index("--prefill") + 1] == "http://p:30000"
    with pytest.raises(ValueError, match="Dynamo"):
        launchers.pd_router_command("vllm", ["http://p"], ["http://d"])
    with pytest.raises(ValueError, match="disaggregation"):
        launchers.build_command("vllm", launchers.EngineOptions("m", disaggregation="both"))


def test_engines_cli_dry_run_with_parallel_flags(capsys):
    argv = ["engines", "launch", "vllm", "--model", "m", "--tp", "2", "--dp", "2"]
    assert main([*argv, "--disaggregation", "prefill", "--dry-run", "--json"]) == 0
    cmd = json.loads(capsys.readouterr().out)["command"]
    assert "--data-parallel-size" in cmd and "--kv-transfer-config" in cmd


def test_scale_out_uses_the_recommendation():
    out = launchers.scale_out("llama-3-70b", "H100-SXM", context=8192, itl_slo_ms=30, min_users=16)
    assert out["chosen"] and out["parallelism"]
    tp = int(out["vllm"][out["vllm"].index("--tensor-parallel-size") + 1])
    assert tp * (2 if "DP2" in out["parallelism"] else 1) <= out["chosen"]
    assert not math.isnan(float(tp))


def test_figures_draw_from_computed_rows():
    import matplotlib

    matplotlib.use("Agg")
    from infer_lab.cluster import scenarios
    from infer_lab.course import parallel_figures

    rows = parallel.scaling_table("llama-3-8b", ("H100-SXM", "H100-PCIe"))
    assert parallel_figures.plot_tp_scaling(rows).axes
    points = parallel.parallelism_frontier("llama-3-8b", "H100-SXM", 4096, batches=(1, 8, 64))
    assert parallel_figures.plot_frontier(points, parallel.fast_mode(points)).axes
    trace = scenarios.trace_for("llama-3-8b", "chat", "H100-SXM", 2, requests=10)
    res = {"colocated": scenarios.run_colocated("llama-3-8b", trace, "H100-SXM", 2)}
    assert parallel_figures.plot_itl_cdf(res).axes


def test_speculative_flags_for_both_engines():
    ngram = launchers.EngineOptions("m", speculative="ngram", num_speculative_tokens=3)
    cmd = launchers.build_command("vllm", ngram, python="python")
    config = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert config["method"] == "ngram" and config["num_speculative_tokens"] == 3
    eagle = launchers.EngineOptions("m", speculative="eagle", speculative_model="d", num_speculative_tokens=3)
    sglang = launchers.build_command("sglang", eagle, python="python")
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "EAGLE"
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == "d"
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == "4"
    with pytest.raises(ValueError, match="speculative_model"):
        launchers.build_command("vllm", launchers.EngineOptions("m", speculative="eagle"))
