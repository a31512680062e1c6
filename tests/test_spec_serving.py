"""Speculative decoding behind the HTTP server: the same text, fewer passes, counted in /metrics,
and several tokens per SSE chunk (why chunk-gap ITL and TPOT diverge under speculation)."""

from __future__ import annotations

import asyncio

import httpx

from infer_lab.loadgen import ClientConfig, LoadPoint, Session, Turn, run_sessions
from infer_lab.loadgen.metrics import summarize_records
from infer_lab.server import ServerThread, build_app

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
PROMPT = f"{CODE}\nWrite the same two functions again."


def _serve_and_stream(embedded, **options):
    app = build_app(embedded, "ours", max_model_len=256, max_num_seqs=4, **options)
    with ServerThread(app) as srv:
        cfg = ClientConfig(srv.url, "smollm2-135m", timeout_s=120, temperature=0.0)

        async def go():
            async with httpx.AsyncClient(timeout=120) as client:
                return await run_sessions(client, cfg, [Session("s", [Turn(PROMPT, 40)])], LoadPoint(concurrency=1))

        records = asyncio.run(go())
        metrics = httpx.get(f"{srv.url}/metrics").text
    return records, metrics, app.state.backend.engine


def test_speculative_serving_same_text_more_tokens_per_chunk_and_counters(embedded):
    plain, _, _ = _serve_and_stream(embedded)
    spec, metrics, engine = _serve_and_stream(embedded, speculative="ngram", num_speculative_tokens=4)
    assert spec[0].ok and spec[0].text == plain[0].text
    row_plain, row_spec = summarize_records(plain), summarize_records(spec)
    assert row_plain["tokens_per_chunk"] <= 1.1  # one token per chunk without speculation
    assert row_spec["tokens_per_chunk"] > 1.5  # a chunk carries every token a pass accepted
    accepted = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("infer_lab:spec_decode_num_accepted_tokens"))
    assert accepted > 0 and engine.kv.pool.all_free()
