"""Chapter 13 without a server: loadgen rows become typed results, and the workshop claim is said as measured."""

from __future__ import annotations

from infer_lab.course import ch13_engines as ch13


def _row(variant: str, engine: str, options: dict, tok_s: float, ttft_ms: float, hit: float, blocks: float):
    return {"variant": variant, "engine": engine, "engine_options": options, "point": "concurrency=4",
            "load": 4.0, "concurrency": 4, "completed": 4, "failed": 0, "output_tokens_per_s": tok_s,
            "request_throughput_per_s": tok_s / 4, "tokens_per_s_per_user": 2.0, "ttft_ms_p50": ttft_ms,
            "ttft_ms_p99": 2 * ttft_ms, "itl_ms_p50": 50.0, "tpot_ms_p50": 50.0, "e2e_ms_p50": 500.0,
            "prefix_hit_rate": hit, "kv_blocks_used_max": blocks, "server": {"version": "test 1"}}


def test_variants_become_typed_rows_with_reasons_for_what_they_lack():
    rows = [_row(ch13.HF_VARIANT, "hf", {}, 2.0, 900.0, 0.0, 0.0),
            _row("ours: paged + continuous", "ours", {"kv_mode": "paged"}, 4.0, 800.0, 0.0, 20.0),
            _row("+ prefix cache (radix)", "ours", {"prefix_cache": "radix"}, 6.0, 400.0, 0.5, 18.0)]
    # what the notebook's serve_variants returns: loadgen's results dict per variant
    runs = {r["variant"]: {"pooled": [r], "server": r["server"],
                           "rows": [{"server_metrics": {"prefix_hit_rate": r["prefix_hit_rate"],
                                                        "kv_blocks_used_max": r["kv_blocks_used_max"]}}]}
            for r in rows}
    variants = {r["variant"]: (r["engine"], r["engine_options"]) for r in rows}
    v = ch13.variants_result(runs, variants, 4, ch13.sizes("cpu", "quick"))
    hf, plain, radix = v.runs
    assert hf.prefix_hit_rate is None and hf.kv_blocks_used_max is None  # HF has neither
    assert plain.prefix_hit_rate is None and plain.kv_blocks_used_max == 20.0
    assert radix.prefix_hit_rate == 0.5 and radix.served.ttft_ms_p90 is None  # absent keys stay absent
    table = ch13.variants_table(v).to_string()
    assert "— (no prefix cache)" in table and "— (no paged KV)" in table and "50%" in table
    text = ch13.variants_text(v)
    assert "3.0× the HF baseline" in text and "from 800 ms to 400 ms" in text


def test_the_workshop_ratio_is_said_with_the_load_each_side_had():
    hf, vllm, *_ = ch13.WORKSHOP_RUNS
    assert hf.requests_in_flight != vllm.requests_in_flight  # the defect the text must name
    text = ch13.workshop_text()
    assert f"**{hf.requests_in_flight} request**" in text and f"**{vllm.requests_in_flight}**" in text
    assert f"{vllm.output_tokens_per_s / hf.output_tokens_per_s:.0f}×" in text
    assert "same concurrency" not in text.split("That ratio")[0]


def test_sweep_figures_start_at_zero():
    point = ch13.ServedLoad.from_row({"point": "concurrency=1", "load": 1.0, "concurrency": 1, "completed": 2,
                                      "failed": 0, "output_tokens_per_s": 3.0, "tokens_per_s_per_user": 3.0,
                                      "ttft_ms_p50": 100.0, "tpot_ms_p50": 30.0})
    bigger = ch13.ServedLoad.from_row({"point": "concurrency=4", "load": 4.0, "concurrency": 4, "completed": 2,
                                       "failed": 0, "output_tokens_per_s": 9.0, "tokens_per_s_per_user": 2.0,
                                       "ttft_ms_p50": 200.0, "tpot_ms_p50": 50.0})
    sweep = ch13.SweepResult("+ prefix cache (radix)", ch13.WORKLOAD, "m", "test", 2000.0, [point, bigger])
    figs = ch13.sweep_figures(sweep, "test machine")
    assert set(figs) == {"sweep_latency", "sweep_throughput", "sweep_pareto"}
    assert all(ax.get_ylim()[0] == 0 for fig in figs.values() for ax in fig.axes)
    assert "from 3.0 to 9.0" in ch13.sweep_text(sweep)


def test_the_peak_is_the_servers_high_water_mark_when_the_scrapes_missed_it():
    from infer_lab.bench.served import server_counters

    # A quick run on a fast machine can start and finish between two scrapes: they saw 0 blocks.
    missed = {"rows": [{"server_metrics": {"kv_blocks_used_max": 0.0, "kv_blocks_used_peak": 12.0}}]}
    assert server_counters(missed)["kv_blocks_used_max"] == 12.0
    sampled_only = {"rows": [{"server_metrics": {"kv_blocks_used_max": 5.0}}]}  # vLLM has no such gauge
    assert server_counters(sampled_only)["kv_blocks_used_max"] == 5.0
    assert server_counters({"rows": []})["kv_blocks_used_max"] is None
