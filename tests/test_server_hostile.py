"""Hostile clients (issue 22): slow or silent sockets, clients that never read, floods of
requests, huge bodies and prompts, parameters the server does not implement, a shutdown past
its timeout. Each case runs against a live server on 127.0.0.1 with small limits, so it ends
in seconds, and checks that a well-behaved client is served meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time

import httpx
import pytest
from machine_speed import latency_bound, session

from infer_lab.server import ServerThread, build_app

MODEL = "smollm2-135m"
KEY = "sk-hostile"
AUTH = {"Authorization": f"Bearer {KEY}"}
OK = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, MAX_CONNECTIONS = 1.0, 3.0, 64
HEALTH_BOUND_S = 1.0  # as in test_server_reliability.py: a healthy loop answers in ms


def _backend(srv):
    return srv.server.config.app.state.backend


def _metric(srv, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(srv.url + "/metrics", headers=AUTH, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def _wait(predicate, timeout_s: float | None = None, what: str = "condition") -> None:
    """Wait for ``predicate``; ``timeout_s`` defaults to 60 s on the reference machine, scaled to this one."""
    base = 60.0 if timeout_s is None else timeout_s
    start = time.monotonic()
    deadline = start + session().scale(base)
    while not predicate():
        assert time.monotonic() < deadline, session().explain(f"waiting for {what}", time.monotonic() - start, base)
        time.sleep(0.02)


def _wait_idle(srv) -> None:
    _wait(_backend(srv).is_idle, what="an idle engine")


@pytest.fixture(scope="module")
def guarded(embedded):
    app = build_app(
        embedded, "ours", max_model_len=256, api_key=KEY, block_size=16, num_blocks=64,
        max_num_seqs=4, header_timeout_s=HEADER_TIMEOUT_S, body_timeout_s=BODY_TIMEOUT_S,
        max_connections=MAX_CONNECTIONS,
    )
    with ServerThread(app) as srv:
        yield srv


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed the connection (EOF, reset); reads what it sent."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


# ---------------------------------------------------------------------------------------------
# 1. Slowloris, half-open sockets, and a cap on open connections


def test_silent_half_sent_and_trickling_sockets_are_closed_within_the_deadline(guarded):
    host, port = guarded.host, guarded.port
    kinds = ["silent", "half_headers", "trickle", "half_body"]
    socks = []
    for i in range(40):  # under the cap: only the deadlines close them
        s = socket.create_connection((host, port))
        kind = kinds[i % 4]
        if kind == "half_headers":
            s.sendall(b"GET /health HTTP/1.1\r\n")
        elif kind == "trickle":
            s.sendall(b"G")
        elif kind == "half_body":
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n".encode() + b'{"mo'
            )
        socks.append((kind, s, time.perf_counter()))
    before_400 = _metric(guarded, "infer_lab:request_errors_total", status="400")
    closed_after: dict[int, float] = {}
    trickle = b"ET /health HTTP/1.1\r\nHost: slow\r\nX-a: " + b"b" * 200
    deadline = time.monotonic() + HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 3.0
    step = 0
    while len(closed_after) < len(socks) and time.monotonic() < deadline:
        for i, (kind, s, opened) in enumerate(socks):
            if i in closed_after:
                continue
            if kind == "trickle" and step < len(trickle):
                try:  # one byte every 50 ms: each byte would reset a per-read timeout
                    s.sendall(trickle[step : step + 1])
                except OSError:
                    pass
            if _closed_by_server(s):
                closed_after[i] = time.perf_counter() - opened
        step += 1
        time.sleep(0.05)
    for _, s, _ in socks:
        s.close()
    assert len(closed_after) == len(socks), f"{len(socks) - len(closed_after)} sockets still open"
    header_kinds = [t for i, t in closed_after.items() if socks[i][0] != "half_body"]
    body_kinds = [t for i, t in closed_after.items() if socks[i][0] == "half_body"]
    print(
        f"\ndropped after: headers max {max(header_kinds):.2f} s (deadline {HEADER_TIMEOUT_S} s), "
        f"bodies max {max(body_kinds):.2f} s (deadline {BODY_TIMEOUT_S} s after the headers)"
    )
    assert max(header_kinds) < HEADER_TIMEOUT_S + 1.0  # absolute: trickling did not extend it
    assert min(header_kinds) >= HEADER_TIMEOUT_S * 0.9
    assert max(body_kinds) < BODY_TIMEOUT_S + 1.0 + 0.5
    stats = guarded.server.config.app.state.guard_stats
    assert stats.header_timeouts >= 30 and stats.body_timeouts >= 10
    # A body cut by the deadline is the client's failure to send, not a malformed request.
    assert _metric(guarded, "infer_lab:request_errors_total", status="400") == before_400
    assert httpx.get(guarded.url + "/health", timeout=5).status_code == 200


def test_a_healthy_client_is_served_while_hundreds_of_slow_sockets_are_open(guarded):
    host, port = guarded.host, guarded.port
    stats = guarded.server.config.app.state.guard_stats
    socks = []
    t0 = time.perf_counter()
    for i in range(300):  # about 5x the cap; each new one closes the oldest slow one
        s = socket.create_connection((host, port))
        if i % 2:
            s.sendall(b"GET /health HTTP/1.1\r\n")
        socks.append(s)
    opened_s = time.perf_counter() - t0
    try:
        latencies = []
        for _ in range(5):
            t = time.perf_counter()
            assert httpx.get(guarded.url + "/health", timeout=5).status_code == 200
            latencies.append(time.perf_counter() - t)
        done = httpx.post(guarded.url + "/v1/completions", json=OK, headers=AUTH, timeout=60)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 2
        assert stats.open <= MAX_CONNECTIONS  # never more descriptors than the cap
        assert stats.evicted >= 300 - MAX_CONNECTIONS
        print(
            f"\n300 slow sockets opened in {opened_s:.2f} s; /health max "
            f"{max(latencies) * 1e3:.0f} ms; open connections {stats.open} (cap {MAX_CONNECTIONS})"
        )
        assert max(latencies) < latency_bound(HEALTH_BOUND_S), session().explain("/health", max(latencies), HEALTH_BOUND_S)
    finally:
        for s in socks:
            s.close()
    gauge = _metric(guarded, "infer_lab:connections_limit")
    assert gauge == MAX_CONNECTIONS


# ---------------------------------------------------------------------------------------------
# 2. Admission control: a bounded queue, a queue timeout, clients that never read


@pytest.fixture(scope="module")
def small(embedded):
    """Two slots, one queue place, a 3 s queue timeout, a 16-token stream buffer."""
    app = build_app(
        embedded, "ours", max_model_len=1024, api_key=KEY, block_size=16, num_blocks=160,
        max_num_seqs=2, max_queued=1, queue_timeout_s=3.0, stream_buffer_tokens=16,
    )
    with ServerThread(app, shutdown_timeout_s=0.5) as srv:
        yield srv


def _long_stream(srv, i: int, max_tokens: int = 400):
    body = {**OK, "prompt": f"Count {i}:", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    return httpx.stream("POST", srv.url + "/v1/completions", json=body, headers=AUTH, timeout=60)


def test_a_full_queue_and_a_queue_timeout_get_503_with_retry_after(small):
    with _long_stream(small, 1) as a, _long_stream(small, 2) as b:
        # Both run: the two slots are taken. (Keep the iterators: a dropped one closes
        # httpx's connection, and the server cancels a request whose client is gone.)
        lines_a, lines_b = a.iter_lines(), b.iter_lines()
        next(lines_a), next(lines_b)
        queued: dict = {}

        def third():
            queued["resp"] = httpx.post(
                small.url + "/v1/completions", json={**OK, "max_tokens": 4}, headers=AUTH,
                timeout=30,
            )

        t = threading.Thread(target=third)
        t.start()
        _wait(lambda: _backend(small).stats()["waiting"] >= 1, 30, "a queued request")
        full = httpx.post(small.url + "/v1/completions", json=OK, headers=AUTH, timeout=30)
        t.join(30)
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == "queue_full"
    # The queued one got no slot within 3 s: a 503 too, and it left the engine.
    late = queued["resp"]
    assert late.status_code == 503 and late.json()["error"]["code"] == "queue_timeout"
    assert "retry-after" in late.headers
    assert _metric(small, "infer_lab:request_rejected_total", reason="queue_full") >= 1
    assert _metric(small, "infer_lab:request_rejected_total", reason="queue_timeout") >= 1
    assert _metric(small, "infer_lab:num_requests_waiting_limit") == 1
    _wait_idle(small)
    assert _backend(small).engine.kv.pool.all_free()


def _ttft(srv) -> float:
    body = {**OK, "prompt": "The capital of France is", "max_tokens": 1, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, headers=AUTH,
                      timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:") and '"text"' in line:
                return time.perf_counter() - t0
    raise AssertionError("no token came")


def _never_reading_client(srv, i: int) -> socket.socket:
    """A raw streaming request whose client reads nothing (a small receive window, so the
    sockets fill after a few kB instead of a few hundred: the server's own bound is the same)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.connect((srv.host, srv.port))
    # 1000 tokens: far more than the sockets hold, so it stalls long before it could end.
    body = json.dumps({**OK, "prompt": f"Tell story {i}:", "max_tokens": 1000, "stream": True,
                       "ignore_eos": True}).encode()
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )
    return s


def test_clients_that_never_read_are_paused_and_a_healthy_ttft_holds(small):
    backend = _backend(small)
    _ttft(small)  # warm-up
    unloaded = [_ttft(small) for _ in range(3)]
    before = _metric(small, "infer_lab:request_success_total", finished_reason="client_too_slow")
    hogs = []
    for i in range(2):  # both slots, one after the other (the queue holds only one)
        hogs.append(_never_reading_client(small, i))
        _wait(lambda n=i + 1: backend.stats()["running"] + backend.stats()["paused"] >= n, 60,
              f"non-reader {i} running")
    try:
        _wait(lambda: backend.stats()["paused"] == 2, 240, "the non-reading streams to be paused")
        # Their sockets are still open, and yet the engine holds nothing for them.
        _wait_idle(small)
        assert backend.engine.kv.pool.all_free()
        loaded = [_ttft(small) for _ in range(3)]
    finally:
        for s in hogs:
            s.close()
    print(f"\nTTFT unloaded {[round(t * 1e3) for t in unloaded]} ms, beside 2 non-reading "
          f"streams {[round(t * 1e3) for t in loaded]} ms")
    assert statistics.median(loaded) <= 2 * statistics.median(unloaded) + 0.05
    # Once their clients leave, the paused requests are cancelled and counted as too slow.
    _wait(
        lambda: _metric(small, "infer_lab:request_success_total",
                        finished_reason="client_too_slow") >= before + 2,
        60, "the closed non-readers to be cancelled",
    )
    _wait(lambda: backend.stats()["paused"] == 0 and not backend.engine.requests, 60,
          "the engine to forget them")


# ---------------------------------------------------------------------------------------------
# 3. Bounded work before validation: huge bodies, prompts that cannot fit


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``infer-lab serve`` in its own process, as the report measured it: the test's clients
    (megabytes to build and send) then do not compete with the server for one GIL. The key
    comes from the environment, never the command line."""
    import os
    import subprocess
    import sys

    from infer_lab.server import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "INFER_LAB_API_KEY": KEY}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infer_lab", "serve", "--port", str(port),
             "--max-model-len", "256", "--engine-option", "num_blocks=32"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "infer-lab serve did not start"
            time.sleep(0.2)
        assert "--api-key" not in " ".join(proc.args)
        assert httpx.get(url + "/v1/models").status_code == 401  # the key from the environment
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


async def _health_during(url: str, load) -> tuple[object, float]:
    """(``load``'s result, slowest of 4 concurrent /health pollers while it ran, s)."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def probe(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            assert (await client.get(url + "/health")).status_code == 200
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)

    async with httpx.AsyncClient(timeout=60) as client:
        tasks = [asyncio.create_task(probe(client)) for _ in range(4)]
        await asyncio.sleep(0.1)
        try:
            result = await load
        finally:
            done.set()
            await asyncio.gather(*tasks)
    return result, max(latencies)


async def _timed_posts(url: str, route: str, body: bytes, n: int = 8) -> list:
    async def one(client: httpx.AsyncClient):
        t0 = time.perf_counter()
        resp = await client.post(url + route, content=body, headers={
            **AUTH, "Content-Type": "application/json"})
        return resp.status_code, time.perf_counter() - t0, resp.json()

    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(one(client) for _ in range(n)))


def test_eight_bodies_of_50000_messages_are_refused_without_stalling_health(served):
    # The report's case: 1.8 MB, 50,000 messages; validating them all took the loop 0.3 s
    # each. Now the list is refused at its length, before its items are validated.
    message = {"role": "user", "content": "hi there"}
    body = json.dumps({"model": MODEL, "messages": [message] * 50_000}, separators=(",", ":"))
    assert 1.7e6 < len(body) < 1.9e6
    results, slowest = asyncio.run(
        _health_during(served, _timed_posts(served, "/v1/chat/completions", body.encode()))
    )
    print(f"\n/health slowest {slowest * 1e3:.0f} ms beside eight 1.8 MB bodies; refused in "
          f"{sorted(round(s * 1e3) for _, s, _ in results)} ms")
    for status, _, payload in results:
        assert status == 400 and payload["error"]["param"] == "messages"
        assert "at most 2048" in payload["error"]["message"]
    # The target is 0.5 s: measured 0.27-0.42 s at load average 7-11 on 2 cores, 1.05 s
    # at 16. Parsing 1.8 MB of JSON (about 26 ms, quiet) still runs on the loop; validating the
    # 50,000 messages (0.3-0.4 s each, quiet: 2.4 s or more for eight) no longer does.
    assert slowest < latency_bound(2.0), session().explain("the slowest request", slowest, 2.0)


def test_prompts_that_cannot_fit_are_refused_from_their_length_before_tokenizing(
    guarded, served, monkeypatch
):
    import infer_lab.server.app as app_module

    text = "word " * 380_000  # 1.9 MB, 380,001 tokens as the report's
    results = []
    for route, body in (
        ("/v1/completions", {**OK, "prompt": text}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": text}]}),
    ):
        results += asyncio.run(_timed_posts(served, route, json.dumps(body).encode(), n=4))
    print(f"\nrefused in {sorted(round(s * 1e3) for _, s, _ in results)} ms")
    for status, seconds, payload in results:
        assert status == 400
        error = payload["error"]
        assert error["code"] == "context_length_exceeded" and "bytes" in error["message"]
        assert seconds < latency_bound(HEALTH_BOUND_S), session().explain("/health", seconds, HEALTH_BOUND_S)  # target 0.5 s; tokenizing them took 9.5-14 s
    # In this process: not one reached the tokenizer, and a prompt that may fit still does.
    tokenized = []
    real = app_module._encode
    monkeypatch.setattr(
        app_module, "_encode", lambda tok, text: tokenized.append(len(text)) or real(tok, text)
    )
    resp = httpx.post(guarded.url + "/v1/completions", json={**OK, "prompt": text},
                      headers=AUTH, timeout=60)
    assert resp.status_code == 400 and tokenized == []
    resp = httpx.post(guarded.url + "/v1/completions", json={**OK, "prompt": "word " * 300},
                      headers=AUTH, timeout=60)
    assert resp.status_code == 400 and "301 tokens" in resp.json()["error"]["message"]
    assert tokenized == [1500]


def test_the_tokenizer_queue_is_capped(embedded):
    app = build_app(embedded, "hf", max_model_len=64, tokenizer_queue=1)
    slow = threading.Event()
    import infer_lab.server.app as app_module

    real = app_module._encode

    def blocking_encode(tok, text):
        slow.wait(10)
        return real(tok, text)

    with ServerThread(app) as srv:
        app_module._encode, saved = blocking_encode, app_module._encode
        try:
            async def two():
                async with httpx.AsyncClient(timeout=30) as client:
                    first = asyncio.create_task(client.post(srv.url + "/v1/completions", json=OK))
                    await asyncio.sleep(0.3)  # the first one holds the only tokenizer place
                    second = await client.post(srv.url + "/v1/completions", json=OK)
                    slow.set()
                    return await first, second

            first, second = asyncio.run(two())
        finally:
            app_module._encode = saved
            slow.set()
    assert first.status_code == 200
    assert second.status_code == 503 and second.json()["error"]["code"] == "tokenizer_busy"
    assert second.headers["retry-after"] == "1"


# ---------------------------------------------------------------------------------------------
# 4. What the server does not implement is refused by name, never a 200 that ignores it


@pytest.mark.parametrize(
    "route, change, param",
    [
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}],
                                  "tool_choice": "required"}, "tools"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/completions", {"echo": True}, "echo"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/completions", {"logprobs": 2, "stream": True}, "logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/completions", {"presence_penalty": 0.5}, "presence_penalty"),
        ("/v1/completions", {"max_token": 5}, "max_token"),  # misspelled
        ("/v1/completions", {"n": 17}, "n"),
        ("/v1/completions", {"temperature": float("nan")}, "temperature"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
         "messages.0.content"),
    ],
    ids=["tools", "response_format", "echo", "best_of", "suffix", "logprobs_stream", "top_logprobs_alone",
         "penalty", "misspelled", "n_17", "nan_temperature", "image_part"],
)
def test_unimplemented_and_unknown_parameters_are_a_clear_400(guarded, route, change, param):
    body = {"model": MODEL, "max_tokens": 2}
    body.update({"prompt": "Hi"} if route == "/v1/completions"
                else {"messages": [{"role": "user", "content": "Hi"}]})
    body.update(change)
    resp = httpx.post(guarded.url + route, content=json.dumps(body),
                      headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"].startswith(param) and isinstance(error["code"], str)
    if param == "temperature":
        assert "NaN" in error["message"] and "2" not in error["message"]
    elif param == "max_token":
        assert "unknown parameter" in error["message"]
    elif param not in ("n", "messages.0.content", "logprobs", "top_logprobs"):
        assert "not supported" in error["message"] and param in error["message"]


def test_the_openai_client_still_works_with_its_own_fields(guarded):
    import openai

    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        temperature=0, user="someone", stream=True, stream_options={"include_usage": True},
    )
    chunks = list(chat)
    assert chunks[-1].usage.completion_tokens == 2


# ---------------------------------------------------------------------------------------------
# 5. A shutdown past its timeout ends every request with an error the client can read


def test_shutdown_past_its_timeout_ends_streams_with_an_error_event_and_others_with_503(embedded):
    app = build_app(embedded, "ours", max_model_len=512, block_size=16, num_blocks=64)
    srv = ServerThread(app, shutdown_timeout_s=0.5).start()
    long = {**OK, "prompt": "Count:", "max_tokens": 500, "ignore_eos": True}
    got: dict = {}

    def stream():
        with httpx.stream("POST", srv.url + "/v1/completions", json={**long, "stream": True},
                          timeout=60) as resp:
            got["stream"] = [ln for ln in resp.iter_lines() if ln.startswith("data:")]

    def plain():
        got["plain"] = httpx.post(srv.url + "/v1/completions", json=long, timeout=60)

    threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    _wait(lambda: app.state.backend.stats()["running"] == 2, 60, "both requests running")
    srv.stop(timeout_s=30)
    for t in threads:
        t.join(30)
    lines = got["stream"]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][5:])["error"]
    assert error["code"] == "server_shutting_down" and error["type"] == "server_error"
    plain = got["plain"]
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "server_shutting_down"
    assert app.state.backend.engine.kv.pool.all_free()


# ---------------------------------------------------------------------------------------------
# 6. Smaller defects


def test_the_api_key_comes_from_a_file_or_the_environment(tmp_path):
    import argparse

    from infer_lab.commands.serve import resolve_api_key

    def args(**kw):
        return argparse.Namespace(**{"api_key": None, "api_key_file": None, **kw})

    keyfile = tmp_path / "key"
    keyfile.write_text("sk-from-file\n")
    assert resolve_api_key(args(api_key_file=str(keyfile)), {}) == "sk-from-file"
    assert resolve_api_key(args(), {"INFER_LAB_API_KEY": "sk-env"}) == "sk-env"
    assert resolve_api_key(args(api_key="sk-cli"), {}) == "sk-cli"
    assert resolve_api_key(args(), {}) is None
    with pytest.raises(ValueError, match="one way only"):
        resolve_api_key(args(api_key="a"), {"INFER_LAB_API_KEY": "b"})
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValueError, match="empty"):
        resolve_api_key(args(api_key_file=str(tmp_path / "empty")), {})


def test_a_cancelled_request_is_counted_once_and_a_hang_up_mid_body_is_no_400(guarded):
    backend = _backend(guarded)
    name = "infer_lab:request_success_total"
    before = _metric(guarded, name, finished_reason="cancelled")
    before_400 = _metric(guarded, "infer_lab:request_errors_total", status="400")
    body = {**OK, "prompt": "Tell me a story.", "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(guarded.url + "/v1/completions", json=body, headers=AUTH, timeout=1.0)
    _wait(lambda: _metric(guarded, name, finished_reason="cancelled") >= before + 1, 60,
          "the cancellation")
    _wait_idle(guarded)
    time.sleep(0.3)  # a second count, if any, would have landed by now
    assert _metric(guarded, name, finished_reason="cancelled") == before + 1
    # Half a body, then the client hangs up: nothing was malformed, so no 400 is counted.
    s = socket.create_connection((guarded.host, guarded.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: 500\r\n\r\n".encode() + b'{"mo')
    time.sleep(0.3)
    s.close()
    gone = "infer_lab:client_disconnects_total"
    _wait(lambda: _metric(guarded, gone, stage="body") >= 1, 10, "the hang-up to be seen")
    assert _metric(guarded, "infer_lab:request_errors_total", status="400") == before_400
    assert backend.engine.kv.pool.all_free()


# ---------------------------------------------------------------------------------------------
# n > 1: several answers to one prompt, sharing its KV blocks through the prefix cache


def test_n_answers_match_single_requests_and_share_the_prompt_blocks(embedded):
    app = build_app(embedded, "ours", max_model_len=256, block_size=16, num_blocks=64,
                    max_num_seqs=4, prefix_cache="radix")
    prompt = "The history of the city of Paris began " * 4  # several full 16-token blocks
    with ServerThread(app) as srv:
        url = srv.url + "/v1/completions"
        greedy = httpx.post(url, json={**OK, "prompt": prompt, "max_tokens": 6, "n": 3},
                            timeout=120).json()
        ids = embedded.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
        ref = embedded.model.generate(ids["input_ids"], max_new_tokens=6, do_sample=False)
        expected = embedded.tokenizer.decode(ref[0, ids["input_ids"].shape[1]:])
        assert [c["index"] for c in greedy["choices"]] == [0, 1, 2]
        assert [c["text"] for c in greedy["choices"]] == [expected] * 3  # transformers' greedy
        n_prompt = ids["input_ids"].shape[1]
        assert greedy["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 18,
                                   "total_tokens": n_prompt + 18}
        # The two later answers found the first one's prompt blocks in the cache.
        hits = app.state.backend.stats()["prefix_cache_hits"]
        assert hits >= 2 * (n_prompt // 16) * 16
        # Sampled: answer i is the single request with seed + i, so each is reproducible.
        body = {**OK, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0,
                "seed": 11}
        together = httpx.post(url, json={**body, "n": 2}, timeout=120).json()["choices"]
        alone = [httpx.post(url, json={**body, "seed": 11 + i}, timeout=120).json()["choices"][0]
                 ["text"] for i in range(2)]
        assert [c["text"] for c in together] == alone
        # Streamed: every chunk names its answer, and the answers are the same.
        with httpx.stream("POST", url, json={**body, "n": 2, "stream": True},
                          timeout=120) as resp:
            lines = [json.loads(ln[5:]) for ln in resp.iter_lines()
                     if ln.startswith("data:") and ln != "data: [DONE]"]
        streamed = ["", ""]
        for chunk in lines:
            streamed[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
        assert streamed == alone
        _wait(app.state.backend.is_idle, 60, "idle")
        assert app.state.backend.engine.blocks_in_use_by_requests() == 0


# ---------------------------------------------------------------------------------------------
# logprobs / top_logprobs, against transformers' own generate()


def test_logprobs_match_transformers_generate(guarded, embedded):
    import math

    import torch

    prompt = "The capital of France is"
    ids = embedded.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = embedded.model.generate(
        ids, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    ref_ids = out.sequences[0, ids.shape[1]:].tolist()
    ref = [torch.log_softmax(step[0].float(), -1) for step in out.logits]
    body = {**OK, "prompt": prompt, "max_tokens": 5, "logprobs": 3, "ignore_eos": True}
    got = httpx.post(guarded.url + "/v1/completions", json=body, headers=AUTH, timeout=60).json()
    lp = got["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == 5 == len(lp["tokens"]) == len(lp["top_logprobs"])
    for i, token in enumerate(ref_ids):
        assert math.isclose(lp["token_logprobs"][i], float(ref[i][token]), abs_tol=2e-4)
        top_values, top_ids = ref[i].topk(3)
        expected = {embedded.tokenizer.decode([t]): v for t, v in
                    zip(top_ids.tolist(), top_values.tolist(), strict=True)}
        assert lp["top_logprobs"][i].keys() == expected.keys()
        for key, value in expected.items():
            assert math.isclose(lp["top_logprobs"][i][key], value, abs_tol=2e-4)
    assert "".join(lp["tokens"]) == got["choices"][0]["text"]
    assert lp["text_offset"][0] == 0
    # The chat shape, through the official client.
    import openai

    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        # Greedy: the chosen token is the most likely one.
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.logprob - 1e-6
        assert entry.logprob <= 0 and bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_under_ulimit_64_sixty_half_open_sockets_do_not_lock_clients_out(tmp_path):
    """The report's case: ``ulimit -n 64`` and 60 sockets that sent only a request line made
    every client fail with EMFILE. Now the cap (half the descriptors left) and the accept
    burst (the other half) keep descriptors free, and the oldest slow socket makes room."""
    import resource
    import subprocess
    import sys

    from infer_lab.server import free_port

    port = free_port()

    def limit_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infer_lab", "serve", "--port", str(port),
             "--max-model-len", "128", "--engine-option", "num_blocks=16"],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit_fds,
        )
    url = f"http://127.0.0.1:{port}"
    socks = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "infer-lab serve did not start"
            time.sleep(0.2)
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\n")
            socks.append(s)
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        chat = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert chat.status_code == 200
        assert "Too many open files" not in log.read_text()
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(30)
