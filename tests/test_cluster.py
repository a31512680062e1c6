"""The cluster simulator: step costs, conservation, prefill interference, disaggregation,
heterogeneous hardware, the attention/FFN split and the `cluster` command."""

from __future__ import annotations

import json

import pytest

from infer_lab.analysis import roofline
from infer_lab.cli import main
from infer_lab.cluster import attention_ffn, costs, hetero, report, scenarios, sim
from infer_lab.cluster.workloads import TraceRequest, make_trace

LIN = costs.LinearStepCost(0.010, 0.0001, 0.0)  # 10 ms per step + 0.1 ms per token


def one(role: str, cost=LIN, capacity: int = 10_000, **kw) -> sim.InstanceSpec:
    return sim.InstanceSpec(role, cost, 1, capacity, gpu="X", **kw)


# ---------------------------------------------------------------------------------------------
# Step costs


@pytest.mark.parametrize("model", ["llama-3-8b", "deepseek-v3", "qwen2.5-7b"])
@pytest.mark.parametrize("tp", [1, 4])
def test_roofline_step_cost_is_the_roofline(model, tp):
    cost = costs.RooflineStepCost(model, "H100-SXM", tp)
    roof = roofline.gpu_roof("H100-SXM", n_gpus=tp)
    for batch, context in ((1, 100), (32, 4096)):
        want = roofline.predict_decode(model, roof, batch, context).time_s
        assert cost(costs.StepBatch.decode(batch, context)) == pytest.approx(want, rel=1e-9)
    for prompt in (1, 2048):
        want = roofline.predict_prefill(model, roof, 1, prompt).time_s
        assert cost(costs.StepBatch.prefill(prompt)) == pytest.approx(want, rel=1e-9)


def test_a_mixed_step_reads_the_weights_once():
    cost = costs.RooflineStepCost("llama-3-8b", "H100-SXM")
    dec, pre = costs.StepBatch.decode(16, 2048), costs.StepBatch.prefill(256, past=512)
    assert max(cost(dec), cost(pre)) < cost(dec + pre) < cost(dec) + cost(pre)


def test_linear_fit_recovers_the_coefficients_from_step_logs():
    truth = costs.LinearStepCost(0.004, 2e-6, 3e-8)
    samples = [
        {"num_tokens": t, "kv_tokens": k, "duration_s": truth(costs.StepBatch(t, 0, 1, k, 0))}
        for t, k in ((1, 100), (8, 5000), (64, 20000), (512, 1000), (256, 90000))
    ]
    samples.append({"num_tokens": 3, "duration_s": 99.0, "failed": True})  # skipped
    fit = costs.fit_linear_step_cost(samples)
    assert (fit.a_s, fit.b_s_per_token, fit.c_s_per_kv_token) == pytest.approx((0.004, 2e-6, 3e-8))
    assert fit.r2 == pytest.approx(1.0) and fit.samples == 5
    no_kv = costs.fit_linear_step_cost([{"tokens": t, "seconds": 0.01 + 1e-4 * t} for t in (1, 9, 40)])
    assert no_kv.c_s_per_kv_token == 0 and no_kv.b_s_per_token == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="at least"):
        costs.fit_linear_step_cost([{"tokens": 1, "seconds": 0.1}])
    roof_fit = costs.linear_from_roofline(costs.RooflineStepCost("llama-3-8b"), 4096)
    assert roof_fit.r2 > 0.95 and roof_fit.a_s > 0


# ---------------------------------------------------------------------------------------------
# The event loop, by hand


def test_prefill_interference_by_hand():
    # A (100 prompt, 5 out) at t=0; B (200 prompt) arrives during A's first decode step.
    trace = [TraceRequest(0, 0.0, 100, 5), TraceRequest(1, 0.025, 200, 3)]
    res = sim.simulate([one("colocated")], trace)
    a, b = res.requests
    assert a.first_token_s == pytest.approx(0.020)  # 10 ms + 100 x 0.1 ms
    # A's second gap holds B's whole prefill (30 ms) plus the next two-sequence decode step
    assert a.itl_s[:2] == pytest.approx((0.0101, 0.030 + 0.0102))
    assert b.ttft_s == pytest.approx(0.0301 + 0.030 - 0.025)
    chunked = sim.simulate([one("colocated", chunked_prefill=True, max_num_batched_tokens=64)], trace)
    assert max(chunked.requests[0].itl_s) < max(a.itl_s)  # chunks ride along instead


def test_kv_transfer_time_is_bytes_over_the_link():
    trace = [TraceRequest(0, 0.0, 100, 3)]
    res = sim.simulate([one("prefill"), one("decode")], trace, 1000, "infiniband-ndr400")
    (r,) = res.requests
    transfer = 6.6e-6 + 2.7e-6 + 100 * 1000 / 50e9
    assert r.kv_transfer_s == pytest.approx(transfer)
    assert r.itl_s[0] == pytest.approx(transfer + 0.0101)  # KV over the wire, then one decode step
    assert res.kv_bytes_transferred == 100 * 1000


def test_bad_clusters_and_traces_fail_clearly():
    trace = [TraceRequest(0, 0.0, 100, 5)]
    with pytest.raises(ValueError, match="KV tokens"):
        sim.simulate([one("colocated", capacity=50)], trace)
    with pytest.raises(ValueError, match="kv_link"):
        sim.simulate([one("prefill"), one("decode")], trace, 10)
    with pytest.raises(ValueError, match="at least one prefill and one decode"):
        sim.simulate([one("prefill")], trace)
    with pytest.raises(ValueError, match="role"):
        one("both")
    with pytest.raises(ValueError, match="P:D"):
        scenarios.parse_ratio("3-5")


# ---------------------------------------------------------------------------------------------
# Conservation


def _ledger_balances(res: sim.SimResult) -> None:
    for i in res.instances:
        assert i.kv_allocated_tokens == i.kv_freed_tokens and i.kv_in_use_at_end == 0
        assert i.kv_peak_tokens <= i.kv_capacity_tokens


@pytest.mark.parametrize("chunked", [False, True])
def test_colocated_conserves_requests_tokens_and_kv(chunked):
    trace = scenarios.trace_for("llama-3-8b", "chat", "H100-SXM", 2, requests=60, load=0.9)
    res = scenarios.run_colocated("llama-3-8b", trace, "H100-SXM", 2, chunked_prefill=chunked)
    assert len(res.requests) == len(trace) == res.n_arrived
    assert sorted(r.rid for r in res.requests) == sorted(t.rid for t in trace)
    by_id = {t.rid: t for t in trace}
    for r in res.requests:
        assert len(r.itl_s) + 1 == by_id[r.rid].output_tokens and r.first_token_s >= r.arrival_s
    _ledger_balances(res)
    assert res.kv_bytes_transferred == 0


def test_disaggregated_conserves_requests_and_kv_bytes():
    trace = scenarios.trace_for("llama-3-8b", "summarize", "H100-SXM", 4, requests=40, load=0.8)
    res = scenarios.run_disaggregated("llama-3-8b", trace, 2, 2, "H100-SXM")
    assert len(res.requests) == len(trace)
    per_token = scenarios.kv_bytes_per_token("llama-3-8b")
    assert res.kv_bytes_transferred == per_token * sum(t.prompt_tokens for t in trace)
    assert sum(r.kv_bytes_transferred for r in res.requests) == res.kv_bytes_transferred
    assert {res.instances[r.prefill_instance].role for r in res.requests} == {"prefill"}
    assert {res.instances[r.decode_instance].role for r in res.requests} == {"decode"}
    _ledger_balances(res)
    assert res.kv_link == "nvlink4-nvswitch"  # 4 GPUs of one type: one server


# ---------------------------------------------------------------------------------------------
# What vLLM's docs say disaggregation does, and does not


@pytest.fixture(scope="module")
def summarize_modes():
    trace = scenarios.trace_for("llama-3-8b", "summarize", "H100-SXM", 4, requests=80, load=0.6)
    return scenarios.compare_modes(
        "llama-3-8b", trace, "H100-SXM", 4, slo=report.SLO(3000, 50), ratios=[(2, 2)]
    )


def test_disaggregation_removes_the_tail_itl_of_prefill_interference(summarize_modes):
    m = summarize_modes
    disagg = m.best_disaggregated
    assert m.colocated.itl_ms.p99 > 5 * disagg.itl_ms.p99
    assert disagg.itl_ms.p99 < m.colocated_chunked.itl_ms.p99 < m.colocated.itl_ms.p99
    assert disagg.itl_ms.p99 < 2 * disagg.itl_ms.p50  # no spikes left
    assert m.as_dict()["best_pd_ratio"] == disagg.layout


def test_disaggregation_does_not_raise_throughput():
    sat = scenarios.saturation("llama-3-8b", "chat", "H100-SXM", 4, requests=120, ratios=[(1, 3), (2, 2)])
    assert sat["colocated_over_best_disaggregated"] >= 1.0
    for r in [sat["colocated"], sat["colocated_chunked"], *sat["disaggregated"]]:
        assert r.completed == 120


def test_prefill_heavy_work_wants_more_prefill_instances_than_decode_heavy():
    slo = report.SLO(2000, 50)
    best = {}
    for wl in ("summarize", "story"):
        trace = scenarios.trace_for("llama-3-8b", wl, "H100-SXM", 4, requests=40, load=0.8)
        b, _ = scenarios.best_pd_ratio("llama-3-8b", trace, "H100-SXM", 4, slo=slo)
        best[wl] = int(b.layout.split("P")[0])
    assert best["summarize"] > best["story"]


def test_report_percentiles_and_goodput():
    res = sim.simulate([one("colocated")], [TraceRequest(i, i * 0.5, 50, 4) for i in range(4)])
    r = report.summarize(res, report.SLO(ttft_ms=15.1, tpot_ms=20))
    assert r.completed == 4 and r.slo_attainment == 1.0  # each alone: 15 ms TTFT, 10.1 ms steps
    assert r.itl_ms.p50 == pytest.approx(10.1) and r.ttft_ms.p99 == pytest.approx(15.0)
    strict = report.summarize(res, report.SLO(ttft_ms=14.0, tpot_ms=None))
    assert strict.goodput_rps == 0 and strict.slo_attainment == 0


def test_the_report_holds_each_latency_as_stats_and_writes_them_flat():
    res = sim.simulate([one("colocated")], [TraceRequest(i, i * 0.5, 50, 4) for i in range(4)])
    r = report.summarize(res)
    gaps = [g * 1e3 for q in res.requests for g in q.itl_s]
    assert r.itl_ms.n == len(gaps) and r.itl_ms.max == pytest.approx(max(gaps)) and r.ttft_ms.n == 4
    assert r.kv_transfer_ms is None  # colocated: nothing moves between instances
    flat = r.as_dict()
    assert flat["itl_ms_p50"] == r.itl_ms.p50 and flat["itl_ms_max"] == r.itl_ms.max
    assert flat["kv_transfer_ms_p50"] is None and "itl_ms" not in flat
    trace = scenarios.trace_for("llama-3-8b", "summarize", "H100-SXM", 4, requests=20, load=0.5)
    split = report.summarize(scenarios.run_disaggregated("llama-3-8b", trace, 2, 2, "H100-SXM"))
    assert split.kv_transfer_ms is not None and split.kv_transfer_ms.n == split.completed
    assert split.kv_transfer_ms.min > 0


def test_traces_are_seeded_and_shaped():
    a = make_trace("summarize", 50, 2.0, seed=3)
    assert a == make_trace("summarize", 50, 2.0, seed=3) != make_trace("summarize", 50, 2.0, seed=4)
    story = make_trace("story", 50, 2.0)
    assert sum(t.prompt_tokens for t in a) > 10 * sum(t.prompt_tokens for t in story)
    assert sum(t.output_tokens for t in story) > 3 * sum(t.output_tokens for t in a)
    with pytest.raises(ValueError, match="summarize"):
        make_trace("poetry", 5, 1.0)


# ---------------------------------------------------------------------------------------------
# Heterogeneous hardware, the wafer-scale data point, attention/FFN split


def test_heterogeneous_pick_prefills_on_compute_and_decodes_on_bandwidth():
    pick = hetero.heterogeneous_pick("llama-3-8b", gpus=["H100-SXM", "H200"], by="usd")
    assert (pick.prefill_gpu, pick.decode_gpu) == ("H100-SXM", "H200") and pick.heterogeneous
    by_name = {f.gpu: f for f in pick.fitness}
    assert by_name["H200"].decode_batch > by_name["H100-SXM"].decode_batch  # more memory for KV
    trace = scenarios.trace_for("llama-3-8b", "chat", "H100-SXM", 4, requests=40, load=0.6)
    reports = hetero.compare_heterogeneous("llama-3-8b", trace, "H100-SXM", "H200", 1, 3)
    assert reports[0].layout.startswith("1P H100-SXM : 3D H200")
    assert reports[0].itl_ms.p50 < reports[1].itl_ms.p50  # H200 decodes faster than H100


def test_wafer_scale_point_is_labelled_and_computed():
    d = hetero.wafer_scale_data_point("llama-3-70b")
    assert "cited" in d["label"] and d["claimed_speedup"] == pytest.approx(5.0)
    assert d["bandwidth_ratio"] == pytest.approx(21e15 / 3.35e12) and d["bandwidth_ratio_claimed"] == 7000
    assert d["chips_to_hold_weights"] > 1  # 141 GB of weights, 44 GB of SRAM per wafer


def test_attention_ffn_split_pays_when_experts_crowd_out_kv():
    out = attention_ffn.compare_attention_ffn("deepseek-v3", "H100-SXM", 16, context=8192)
    col, best = out["colocated"], out["best_split"]
    assert best.batch_per_attention_gpu > 2 * col.batch_per_attention_gpu  # no experts next to KV
    assert best.ffn_intensity > col.ffn_intensity
    assert out["gain"] > 1.0
    assert best.step_ms == pytest.approx(max(best.attention_ms, best.ffn_ms, best.transfer_ms))
    with pytest.raises(ValueError, match="mixture of experts"):
        attention_ffn.colocated_moe("llama-3-8b", "H100-SXM", 2)


# ---------------------------------------------------------------------------------------------
# The command


def test_cluster_cli_json(capsys):
    argv = ["cluster", "--workload", "summarize", "--gpus", "4", "--requests", "40", "--disaggregated", "2:2"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"inputs", "trace", "slo", "reports", "best_pd_ratio", "tail_itl"} <= set(d)
    assert [r["mode"] for r in d["reports"]] == ["colocated", "colocated", "disaggregated"]
    assert d["best_pd_ratio"].startswith("2P:2D")
    assert d["tail_itl"]["disaggregated_itl_ms_p99"] < d["tail_itl"]["colocated_itl_ms_p99"]
    assert main(["cluster", "--gpus", "4", "--requests", "20", "--disaggregated", "1:2"]) == 2
    assert "add up to 4" in capsys.readouterr().err
    assert main(["cluster", "--gpus", "3", "--tp", "2"]) == 2
