"""The load generator: metric definitions, workloads, arrivals, and runs against live HTTP servers."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse

from infer_lab.loadgen import (
    SLO,
    ClientConfig,
    LoadPoint,
    RequestRecord,
    RunConfig,
    arrival_gaps,
    build_workload,
    parse_metrics,
    run_benchmark_sync,
    save_plots,
    summarize_records,
)
from infer_lab.server import ServerThread, build_app

# ---------------------------------------------------------------------------------------------
# A scripted OpenAI-style server: fixed tokens and gaps, vLLM metric names, so timings are known.


def fake_server(tokens: int = 4, gap_s: float = 0.01, words_per_token: int = 1) -> FastAPI:
    app = FastAPI()
    state = {"active": 0, "peak": 0, "calls": 0}
    app.state.counts = state

    @app.get("/version")
    async def version():
        return {"version": "9.9.9-fake"}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {state["active"]}\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
            "# TYPE vllm:prefix_cache_queries counter\n"
            f'vllm:prefix_cache_queries_total{{model_name="m"}} {100.0 * state["calls"]}\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{model_name="m"}} {50.0 * state["calls"]}\n'
        )

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        n = min(tokens, body.get("max_tokens", tokens))

        async def events():
            state["active"] += 1
            state["calls"] += 1
            state["peak"] = max(state["peak"], state["active"])
            try:
                for i in range(n):
                    await asyncio.sleep(gap_s)
                    chunk = {
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"content": " w" * words_per_token},
                                "finish_reason": "length" if i == n - 1 else None,
                            }
                        ]
                    }
                    yield f"data: {json.dumps(chunk)}\n\n"
                usage = {
                    "prompt_tokens": 10,
                    "completion_tokens": n * words_per_token,
                    "total_tokens": 10 + n,
                }
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                state["active"] -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _cfg(
    url: str, points, requests: int = 8, timeout_s: float = 10.0, workload: str = "random", **kw
) -> RunConfig:
    return RunConfig(
        ClientConfig(url, "m", timeout_s=timeout_s),
        workload,
        points,
        requests=requests,
        warmup=1,
        workload_options=dict(input_words=8, output_tokens=4, prefix_words=16, turns=2, branches=2),
        scrape_interval_s=0.05,
        **kw,
    )


# ---------------------------------------------------------------------------------------------
# Metric definitions on hand-made records


def _record(start, ttft, gaps, tokens, ok=True):
    chunk_times = [start + ttft]
    for g in gaps:
        chunk_times.append(chunk_times[-1] + g)
    return RequestRecord(
        "s",
        0,
        start,
        ok=ok,
        ttft_s=ttft if ok else None,
        e2e_s=(chunk_times[-1] - start) if ok else None,
        chunk_times_s=chunk_times if ok else [],
        completion_tokens=tokens if ok else None,
        prompt_tokens=5,
        usage_source="usage" if ok else "none",
        error=None if ok else "boom",
    )


def test_itl_is_token_weighted_and_tpot_request_weighted():
    # One long answer with 10 ms gaps (100 gaps), one short answer with a 1000 ms gap.
    long = _record(0.0, 0.1, [0.01] * 100, 101)
    short = _record(0.0, 0.1, [1.0], 2)
    failed = _record(0.0, 0.1, [], 0, ok=False)
    row = summarize_records([long, short, failed], SLO(tpot_ms=100), duration_s=2.0)
    assert row["itl_ms_p50"] == pytest.approx(10.0)  # pooled gaps: the long answer dominates
    assert row["tpot_ms_p50"] == pytest.approx((10.0 + 1000.0) / 2)  # one sample per request
    assert row["ttft_ms_p50"] == pytest.approx(100.0)
    assert row["completed"] == 2 and row["failed"] == 1 and row["errors"] == {"boom": 1}
    assert row["output_tokens_per_s"] == pytest.approx(103 / 2.0)
    assert row["request_throughput_per_s"] == pytest.approx(1.0)
    assert row["slo_met"] == 1 and row["goodput_per_s"] == pytest.approx(
        0.5
    )  # the short one misses TPOT


def test_arrival_gaps_have_the_requested_rate_and_burstiness():
    poisson = arrival_gaps(4000, rate_per_s=5.0, seed=1)
    bursty = arrival_gaps(4000, rate_per_s=5.0, burstiness=4.0, seed=1)
    for gaps in (poisson, bursty):
        assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.1)
    cv = [statistics.stdev(g) / statistics.mean(g) for g in (poisson, bursty)]
    assert cv[0] == pytest.approx(1.0, rel=0.1) and cv[1] == pytest.approx(
        2.0, rel=0.15
    )  # sqrt(burstiness)
    with pytest.raises(ValueError):
        LoadPoint(concurrency=2, rate_per_s=1.0)


def test_workloads_share_prefixes_and_carry_history(tmp_path):
    shared = build_workload("shared-prefix", 3, prefix_words=20)
    assert len({s.system for s in shared}) == 1 and len({s.turns[0].user for s in shared}) == 3
    chat = build_workload("multiturn", 4, turns=2)[0]
    msgs = chat.messages_for(1, ["first answer"])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"] and msgs[2][
        "content"
    ] == "first answer"
    agent = build_workload("agentic", 8, branches=2, prefix_words=20)
    assert (
        len(agent) == 4 and len({s.system for s in agent}) == 2
    )  # 2 tasks x 2 branches, shared context per task
    assert all(len(s.turns) == 2 and "Review" in s.turns[1].user for s in agent)
    path = tmp_path / "sg.json"
    path.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": "hello there"},
                        {"from": "gpt", "value": "one two three four"},
                    ]
                },
                {"conversations": [{"from": "gpt", "value": "skipped"}]},
            ]
        )
    )
    sg = build_workload(f"sharegpt:{path}", 1)
    assert sg[0].turns[0].user == "hello there" and sg[0].turns[0].max_tokens == 5
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("nope", 1)
    with pytest.raises(FileNotFoundError):
        build_workload(f"sharegpt:{tmp_path / 'missing.json'}", 1)


def test_parse_metrics_understands_vllm_and_our_names():
    vllm = (
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="a"} 3\n'
        '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="a"} 0.5\n'
    )
    assert parse_metrics(vllm) == {"running": 3.0, "kv_usage": 0.5}
    ours = ("# TYPE infer_lab:kv_blocks_used gauge\ninfer_lab:kv_blocks_used 7\n"
            "# TYPE infer_lab:kv_blocks_used_peak gauge\ninfer_lab:kv_blocks_used_peak 9\n")
    assert parse_metrics(ours) == {"kv_blocks_used": 7.0, "kv_blocks_peak": 9.0}


# ---------------------------------------------------------------------------------------------
# Runs over real HTTP


def test_closed_loop_sweep_against_a_scripted_server(tmp_path):
    with ServerThread(fake_server(tokens=4, gap_s=0.02)) as srv:
        res = run_benchmark_sync(
            _cfg(
                srv.url,
                [LoadPoint(concurrency=1), LoadPoint(concurrency=4)],
                requests=8,
                slo=SLO(ttft_ms=1000),
                workload="multiturn",
            ),
            quiet=True,
        )
        peak = srv.server.config.app.state.counts["peak"]
    rows = {r["concurrency"]: r for r in res["pooled"]}
    assert rows[1]["completed"] == 8 and rows[4]["completed"] == 8
    assert rows[4]["output_tokens"] == 8 * 4 and rows[4]["usage_from_server"]
    assert rows[1]["itl_ms_p50"] == pytest.approx(20, abs=15)
    # Four users overlap, so throughput rises with concurrency (multiturn: 4 sessions of 2 calls).
    assert peak == 4 and rows[4]["output_tokens_per_s"] > 1.5 * rows[1]["output_tokens_per_s"]
    scraped = res["rows"][1]["server_metrics"]
    assert (
        scraped["available"]
        and scraped["kv_usage_max"] == 0.25
        and scraped["prefix_hit_rate"] == 0.5
    )
    assert res["server"]["version"] == "9.9.9-fake" and res["config"]["client"]["model"] == "m"
    assert all(p.stat().st_size > 0 for p in save_plots(res, tmp_path))


def test_open_loop_against_a_scripted_server():
    with ServerThread(fake_server(tokens=2, gap_s=0.005)) as srv:
        res = run_benchmark_sync(
            _cfg(srv.url, [LoadPoint(rate_per_s=50.0, burstiness=2.0)], requests=10, repeats=2),
            quiet=True,
        )
    assert [r["repeat"] for r in res["rows"]] == [0, 1]
    assert res["pooled"][0]["completed"] == 20 and res["pooled"][0]["failed"] == 0


def test_server_that_dies_mid_run_gives_failures_not_a_hang():
    srv = ServerThread(fake_server(tokens=40, gap_s=0.05), shutdown_timeout_s=0.1).start()
    killer = threading.Timer(0.8, srv.kill)
    killer.start()
    t0 = time.monotonic()
    cfg = _cfg(srv.url, [LoadPoint(concurrency=2)], requests=6, timeout_s=5.0)
    cfg.workload_options["output_tokens"] = (
        40  # each answer takes about 2 s: the kill lands mid-stream
    )
    res = run_benchmark_sync(cfg, quiet=True)
    killer.join()
    row = res["pooled"][0]
    assert time.monotonic() - t0 < 30
    assert row["requests"] == 6 and row["failed"] >= 2 and row["completed"] + row["failed"] == 6


def test_a_server_that_never_answers_times_out():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # accepts connections, never replies
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        res = run_benchmark_sync(
            _cfg(url, [LoadPoint(concurrency=2)], requests=2, timeout_s=0.5), quiet=True
        )
    finally:
        listener.close()
    assert time.monotonic() - t0 < 10
    assert res["pooled"][0]["failed"] == 2 and any(
        "timeout" in e for e in res["pooled"][0]["errors"]
    )


def test_loadgen_against_our_engine_counts_tokens_from_usage(embedded):
    app = build_app(
        embedded, "ours", max_model_len=256, num_blocks=64, max_num_seqs=4, prefix_cache="radix"
    )
    with ServerThread(app) as srv:
        cfg = _cfg(
            srv.url, [LoadPoint(concurrency=2)], requests=4, timeout_s=120, workload="shared-prefix"
        )
        cfg.client.model = "smollm2-135m"
        res = run_benchmark_sync(cfg, quiet=True)
    row, req = res["pooled"][0], res["requests"]
    assert row["completed"] == 4 and row["usage_from_server"]
    assert row["output_tokens"] == sum(
        r["completion_tokens"] for r in req if r["point"] == row["point"]
    )
    scraped = res["rows"][0]["server_metrics"]
    assert (
        scraped["kv_blocks_total"] == 64 and scraped["prefix_hit_rate"] > 0
    )  # the shared system prompt was reused


def test_cli_json_is_valid_and_bad_input_is_a_clear_error(capsys):
    from infer_lab.cli import main

    with ServerThread(fake_server(tokens=2, gap_s=0.001)) as srv:
        rc = main(
            [
                "loadgen",
                "--url",
                srv.url,
                "--model",
                "m",
                "--requests",
                "3",
                "--concurrency",
                "1",
                "--warmup",
                "0",
                "--output-tokens",
                "2",
                "--json",
            ]
        )
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(out)["pooled"][0]["completed"] == 3
    assert main(["loadgen", "--model", "m", "--concurrency", "1.5"]) == 2
    # vLLM is not installed here: a clear error, exit code 2.
    assert main(["engines", "launch", "vllm", "--model", "x"]) == 2
    assert "not installed" in capsys.readouterr().err


def test_random_workload_lengths_can_be_fixed_and_counted_in_tokens():
    from infer_lab.loadgen.workloads import TOKEN_ID_RANGE

    fixed = build_workload("random", 20, input_words=10, output_tokens=5, range_ratio=0)
    assert {len(s.turns[0].user.split()) for s in fixed} == {10}
    assert {s.turns[0].max_tokens for s in fixed} == {5}
    spread = build_workload("random", 50, input_words=10, output_tokens=8)  # default: ±50 %
    assert len({s.turns[0].max_tokens for s in spread}) > 1
    assert all(4 <= s.turns[0].max_tokens <= 12 for s in spread)
    ids = build_workload("random", 5, input_words=12, range_ratio=0, token_prompts=True)
    for s in ids:
        assert len(s.turns[0].prompt_ids) == 12
        assert all(TOKEN_ID_RANGE[0] <= t < TOKEN_ID_RANGE[1] for t in s.turns[0].prompt_ids)
    with pytest.raises(ValueError, match="range ratio"):
        build_workload("random", 2, range_ratio=1.0)
    with pytest.raises(ValueError, match="random workload only"):
        build_workload("multiturn", 2, token_prompts=True)


def test_fixed_token_workload_and_both_ttft_clocks_against_our_engine(embedded):
    app = build_app(embedded, "ours", max_model_len=128, num_blocks=32, max_num_seqs=4)
    with ServerThread(app) as srv:
        cfg = _cfg(srv.url, [LoadPoint(concurrency=2)], requests=4, timeout_s=120)
        cfg.client.model, cfg.client.endpoint, cfg.client.ignore_eos = (
            "smollm2-135m",
            "completions",
            True,
        )
        cfg.workload_options.update(
            input_words=12, output_tokens=3, range_ratio=0.0, token_prompts=True
        )
        res = run_benchmark_sync(cfg, quiet=True)
    measured = [r for r in res["requests"] if r["point"] == "concurrency=2"]
    assert len(measured) == 4 and all(r["ok"] for r in measured)
    # Identical, exact lengths: what other tools' fixed random datasets send.
    assert {(r["prompt_tokens"], r["completion_tokens"]) for r in measured} == {(12, 3)}
    # Our clock starts at send, the server's at its engine: both are kept, and ours is later.
    assert all(r["server_ttft_s"] is not None and r["ttft_gap_s"] > 0 for r in measured)
    row = res["pooled"][0]
    assert row["ttft_ms_p50"] > row["server_ttft_ms_p50"] > 0 and row["ttft_gap_ms_p50"] > 0
    scraped = res["rows"][0]["server_metrics"]
    assert scraped["server_ttft_ms_mean"] > 0  # from the server's histogram, as for vLLM


def test_cli_rejects_token_prompts_on_chat_and_a_bad_range_ratio():
    from infer_lab.cli import main

    base = ["loadgen", "--model", "m", "--concurrency", "1"]
    assert main([*base, "--token-prompts"]) == 2  # chat takes text only
    assert main([*base, "--range-ratio", "1.5"]) == 2
    assert main([*base, "--workload", "multiturn", "--input-len", "8"]) == 2
