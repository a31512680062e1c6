"""Streams whose clients stop reading: they are paused (batch slot and KV blocks freed) within a
bounded number of tokens, a fresh request is served beside any number of them, a slow reader
is paced and never cancelled, and one that reads nothing for the send timeout is closed.

The stalled clients are raw sockets that send a streaming request and never call ``recv``, with
a small receive buffer: the server can only see a non-reader once the client's own kernel buffer
is full, so a small one makes the server's part of the bound what is measured. Times are never
typed here: they are measured in the same test (unloaded first, then alternately beside an idle
twin server, so that other processes slowing the machine slow both sides alike).
"""

from __future__ import annotations

import json
import socket
import statistics
import time

import httpx
import pytest

from infer_lab.server import ServerConfig, ServerThread, build_app
from infer_lab.server.guard import UNSENT_BYTES_LIMIT, WRITE_HIGH_WATER_BYTES

MODEL = "smollm2-135m"
SLOTS = 16
NON_READERS = 20
NON_READER_TOKENS = 300
HEALTHY_TOKENS = 8
STREAM_BUFFER_TOKENS = ServerConfig.stream_buffer_tokens  # the default, for the bound below
CLIENT_RCVBUF_BYTES = 2048  # asked of the kernel, which doubles it (read back with getsockopt)
SLOW_READ_BYTES, SLOW_READ_PERIOD_S = 256, 0.05  # about one SSE chunk every 50 ms
TIMED_RUNS = 5  # medians of 5: on a shared 2-core machine single timings vary 3x
HF_TIMED_RUNS = 3  # the baseline is slower; its bound is the same


def _chat(content: str, max_tokens: int, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


@pytest.fixture(scope="module")
def server(embedded):
    """16 slots, no prefix cache (so a drained pool is exactly 'all blocks free'), and a send
    timeout far past the test, so the non-readers stay open while the healthy client is timed."""
    app = build_app(
        embedded, "ours", max_model_len=512, block_size=16, max_num_seqs=SLOTS,
        stream_buffer_tokens=STREAM_BUFFER_TOKENS, send_timeout_s=600.0,
    )
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def twin(embedded):
    """The same server with nothing else on it (a pool for the timed requests only)."""
    app = build_app(embedded, "ours", max_model_len=512, block_size=16, max_num_seqs=SLOTS,
                    num_blocks=64)
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def hf_server(embedded):
    """The one-request-at-a-time baseline: a non-reader would hold its only slot."""
    with ServerThread(build_app(embedded, "hf", max_model_len=512)) as srv:
        yield srv


@pytest.fixture(scope="module")
def hf_twin(embedded):
    """The same baseline with nothing else on it."""
    with ServerThread(build_app(embedded, "hf", max_model_len=512)) as srv:
        yield srv


def _backend(srv):
    return srv.server.config.app.state.backend


def _metric(srv, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(srv.url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def _wait(predicate, timeout_s: float, what) -> None:
    """Poll ``predicate``; on timeout fail with ``what()`` (a description of the state seen)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting: {what()}"
        time.sleep(0.05)


def _open_stream(srv, body: dict, rcvbuf: int = CLIENT_RCVBUF_BYTES) -> socket.socket:
    """Send a streaming chat request on a raw socket and return it unread. The receive buffer is
    set before connecting, so the TCP window is small from the first byte."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((srv.host, srv.port))
    payload = json.dumps({**body, "stream": True}).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
    )
    return sock


def _sse_events(raw: bytes) -> list[dict | str]:
    """The SSE data of a raw HTTP/1.1 response with a chunked body: JSON objects, and "[DONE]"."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    data, rest = b"", body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        data, rest = data + rest[:size], rest[size + 2:]
    events: list[dict | str] = []
    for block in data.decode().split("\n\n"):
        if block.startswith("data: "):
            text = block[len("data: "):]
            events.append(text if text == "[DONE]" else json.loads(text))
    return events


def _read_until_done(sock: socket.socket, bytes_per_read: int, period_s: float,
                     timeout_s: float) -> bytes:
    """Read the whole response, ``bytes_per_read`` bytes every ``period_s`` seconds."""
    raw = b""
    deadline = time.monotonic() + timeout_s
    sock.settimeout(timeout_s)
    while not raw.endswith(b"\r\n0\r\n\r\n"):
        assert time.monotonic() < deadline, f"the stream did not end in {timeout_s:g} s: {raw[-300:]!r}"
        part = sock.recv(bytes_per_read)
        assert part, f"the server closed the stream before its end: {raw[-300:]!r}"
        raw += part
        time.sleep(period_s)
    return raw


def _answer(events: list[dict | str]) -> tuple[str, str | None]:
    """(text, finish reason) of a streamed chat answer; fails on an error event."""
    text, finish = "", None
    for event in events:
        if isinstance(event, dict):
            assert "error" not in event, event
            for choice in event["choices"]:
                text += choice["delta"].get("content") or ""
                finish = choice["finish_reason"] or finish
    return text, finish


def _timed_chat(srv, content: str) -> tuple[float, str]:
    """(wall seconds, text) of an 8-token chat request."""
    wall, _, text = _timed_chat_cpu(srv, content)
    return wall, text


def _timed_chat_cpu(srv, content: str) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of this whole process, text) of an 8-token chat request.
    The CPU time counts the server's threads too, so work done for anyone else shows in it,
    and other processes on the machine do not."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    resp = httpx.post(srv.url + "/v1/chat/completions", json=_chat(content, HEALTHY_TOKENS),
                      timeout=600)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["usage"]["completion_tokens"] == HEALTHY_TOKENS
    return elapsed, cpu, body["choices"][0]["message"]["content"]


def _smallest_chunk_bytes(srv, body: dict) -> int:
    """Bytes on the wire of the smallest SSE chunk that carries text in this request's stream
    (read at once): the unit the server's buffers are counted in, per token."""
    sock = _open_stream(srv, body, rcvbuf=1 << 20)
    try:
        raw = _read_until_done(sock, 1 << 16, 0.0, 300)
    finally:
        sock.close()
    _, _, body_bytes = raw.partition(b"\r\n\r\n")
    sizes, rest = [], body_bytes
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        event = rest[:size].decode()
        if '"content": "' in event and '"content": ""' not in event:
            sizes.append(size + len(size_line) + 4)  # the chunk, its size line and two CRLFs
        rest = rest[size + 2:]
    return min(sizes)


def test_a_fresh_request_is_served_beside_20_streams_that_never_read(server, twin):
    """Unloaded first, on the same server; then, with the 20 non-readers paused, each timed
    request alternates with one to an identical idle server, so that other processes slowing
    the machine (single timings here vary 3x) slow both sides of the comparison alike."""
    backend, engine = _backend(server), _backend(server).engine
    prompt = "What is the capital of France?"
    _timed_chat(server, prompt), _timed_chat(twin, prompt)  # warm-up
    unloaded = [_timed_chat_cpu(server, prompt) for _ in range(TIMED_RUNS)]
    too_slow_before = _metric(server, "infer_lab:request_success_total",
                              finished_reason="client_too_slow")
    chunk_bytes = _smallest_chunk_bytes(server, _chat("Tell story 0", 24))

    t_start = time.perf_counter()
    hogs = [_open_stream(server, _chat(f"Tell story {i}", NON_READER_TOKENS))
            for i in range(NON_READERS)]
    try:
        def state() -> str:
            lengths = sorted(len(s.output_ids) for s in list(engine.requests.values()))
            return f"engine {backend.stats()}, tokens per request {lengths}"

        _wait(lambda: backend.stats()["paused"] == NON_READERS, 600,
              lambda: f"all {NON_READERS} non-readers paused; {state()}")
        detected_s = time.perf_counter() - t_start
        tokens = sorted(len(seq.output_ids) for seq in list(engine.paused.values()))
        # What a non-reader can cost: its own receive buffer, our unsent bytes, asyncio's buffer
        # and the chunk being written, in chunks, then the stream buffer, then one more step
        # (the pause is applied between two steps).
        client_rcvbuf = hogs[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        held = client_rcvbuf + UNSENT_BYTES_LIMIT + WRITE_HIGH_WATER_BYTES + chunk_bytes
        bound = held // chunk_bytes + STREAM_BUFFER_TOKENS + 2
        assert tokens[-1] <= bound < NON_READER_TOKENS, (
            f"tokens generated per non-reader before it was paused: {tokens}; bound {bound} "
            f"({held} bytes of buffers / {chunk_bytes} bytes per chunk + {STREAM_BUFFER_TOKENS})"
        )
        # Dealt with: no slot, no KV block held for any of them.
        assert backend.stats()["running"] == 0, state()
        assert engine.kv.pool.all_free(), (
            f"{engine.kv.num_used_blocks()} of {engine.kv.num_blocks} KV blocks still in use "
            f"with every non-reader paused; {state()}")
        loaded, idle_twin = [], []
        for _ in range(TIMED_RUNS):
            loaded.append(_timed_chat_cpu(server, prompt))
            idle_twin.append(_timed_chat_cpu(twin, prompt))
        assert backend.stats()["paused"] == NON_READERS  # still there, still not reading
    finally:
        for sock in hogs:
            sock.close()

    def median(runs: list, field: int) -> float:
        return statistics.median(run[field] for run in runs)

    def seconds(runs: list, field: int) -> list[float]:
        return [round(run[field], 3) for run in runs]

    report = (
        f"8-token chat, wall s: unloaded first {seconds(unloaded, 0)}; beside {NON_READERS} "
        f"paused non-readers {seconds(loaded, 0)}, the idle twin meanwhile "
        f"{seconds(idle_twin, 0)}. CPU s: unloaded {seconds(unloaded, 1)}, loaded "
        f"{seconds(loaded, 1)}. Non-readers paused after {tokens[0]}..{tokens[-1]} tokens "
        f"(median {statistics.median(tokens)}, bound {bound}), all within {detected_s:.1f} s; "
        f"smallest chunk {chunk_bytes} B, client receive buffer {client_rcvbuf} B"
    )
    print("\n" + report)
    assert median(loaded, 0) <= 2 * median(idle_twin, 0), report
    assert median(loaded, 1) <= 2 * median(unloaded, 1), report  # no work for the non-readers
    assert {run[2] for run in loaded} == {run[2] for run in unloaded}, report

    # Their clients leave: every request is cancelled, counted, and nothing is left behind.
    _wait(lambda: not engine.requests and backend.is_idle(), 120,
          lambda: f"the engine to forget the closed non-readers; {state()}")
    assert engine.kv.pool.all_free() and backend.stats()["paused"] == 0
    assert _metric(server, "infer_lab:request_success_total",
                   finished_reason="client_too_slow") == too_slow_before + NON_READERS


@pytest.mark.parametrize("engine", ["ours", "hf"])
def test_a_slow_reader_is_paused_then_paced_and_gets_the_whole_answer(engine, request):
    """Reads nothing until paused, then one chunk every 50 ms: its answer is complete and the
    same as a fast reader's (sampled with a seed: the pause keeps the sampler's state)."""
    server = request.getfixturevalue("server" if engine == "ours" else "hf_server")
    backend = _backend(server)
    # Enough tokens to fill the buffers and the stream buffer (about 45), and a few more.
    body = _chat("Write a poem about the sea.", 64, temperature=0.8, seed=7)
    fast = _open_stream(server, body, rcvbuf=1 << 20)
    try:
        reference = _answer(_sse_events(_read_until_done(fast, 1 << 16, 0.0, 300)))
    finally:
        fast.close()
    pauses_before = _metric(server, "infer_lab:stream_pauses_total")
    too_slow_before = _metric(server, "infer_lab:request_success_total",
                              finished_reason="client_too_slow")

    slow = _open_stream(server, body)
    try:
        _wait(lambda: backend.stats()["paused"] == 1, 300,
              lambda: f"the stream to be paused; {backend.stats()}")
        if engine == "ours":
            assert backend.engine.kv.pool.all_free()
        events = _sse_events(_read_until_done(slow, SLOW_READ_BYTES, SLOW_READ_PERIOD_S, 600))
    finally:
        slow.close()
    assert events[-1] == "[DONE]"
    assert _answer(events) == reference
    assert reference[1] == "length"
    assert _metric(server, "infer_lab:stream_pauses_total") >= pauses_before + 1
    assert _metric(server, "infer_lab:request_success_total",
                   finished_reason="client_too_slow") == too_slow_before
    assert backend.stats()["paused"] == 0
    if engine == "ours":
        assert backend.engine.kv.pool.all_free()


def test_a_client_that_reads_nothing_for_the_send_timeout_is_closed(embedded):
    """Its connection is cut (it may or may not have been paused first: that depends on how
    fast the tokens come), its request ends, and nothing is left behind."""
    send_timeout_s = 1.0
    app = build_app(embedded, "ours", max_model_len=512, block_size=16, max_num_seqs=4,
                    send_timeout_s=send_timeout_s)
    with ServerThread(app) as srv:
        backend = _backend(srv)
        hog = _open_stream(srv, _chat("Tell a story", NON_READER_TOKENS))
        try:
            _wait(lambda: _metric(srv, "infer_lab:connections_closed_total",
                                  reason="send_timeout") == 1,
                  300, lambda: f"a send timeout; {backend.stats()}")
            # The client finds the end of the stream (or a reset) once it reads what its
            # kernel holds: cut, not finished.
            hog.settimeout(30)
            received = b""
            try:
                while part := hog.recv(1 << 16):
                    received += part
            except ConnectionResetError:
                pass
        finally:
            hog.close()
        assert received.startswith(b"HTTP/1.1 200") and b"[DONE]" not in received
        _wait(lambda: not backend.engine.requests and backend.is_idle(), 60,
              lambda: f"the request to be cancelled; {backend.stats()}")
        ended = sum(_metric(srv, "infer_lab:request_success_total", finished_reason=reason)
                    for reason in ("client_too_slow", "cancelled"))
        assert ended == 1
        assert backend.stats()["paused"] == 0 and backend.engine.kv.pool.all_free()


def test_the_hf_backend_pauses_a_non_reader_and_serves_the_next_request(hf_server, hf_twin):
    """One request at a time: without the pause, the next client would wait for all 300 tokens.
    Timed as the test above: unloaded first, then alternating with an idle twin."""
    backend = _backend(hf_server)
    prompt = "What is the capital of France?"
    _timed_chat(hf_server, prompt), _timed_chat(hf_twin, prompt)  # warm-up
    unloaded = [_timed_chat_cpu(hf_server, prompt) for _ in range(HF_TIMED_RUNS)]
    cancelled_before = backend.finished_counts.get("cancelled", 0)
    hog = _open_stream(hf_server, _chat("Tell a story", NON_READER_TOKENS))
    try:
        _wait(lambda: backend.stats()["paused"] == 1, 300,
              lambda: f"the stream to be paused; {backend.stats()}")
        loaded, idle_twin = [], []
        for _ in range(HF_TIMED_RUNS):
            loaded.append(_timed_chat_cpu(hf_server, prompt))
            idle_twin.append(_timed_chat_cpu(hf_twin, prompt))
    finally:
        hog.close()
    report = (f"8-token chat on hf, wall s: unloaded first {[round(r[0], 3) for r in unloaded]}, "
              f"beside a paused non-reader {[round(r[0], 3) for r in loaded]}, the idle twin "
              f"meanwhile {[round(r[0], 3) for r in idle_twin]}; CPU s: unloaded "
              f"{[round(r[1], 3) for r in unloaded]}, loaded {[round(r[1], 3) for r in loaded]}")
    print("\n" + report)
    assert {r[2] for r in loaded} == {r[2] for r in unloaded}, report
    assert statistics.median(r[0] for r in loaded) <= 2 * statistics.median(
        r[0] for r in idle_twin), report
    assert statistics.median(r[1] for r in loaded) <= 2 * statistics.median(
        r[1] for r in unloaded), report
    _wait(lambda: backend.stats()["paused"] == 0
          and backend.finished_counts.get("cancelled", 0) == cancelled_before + 1,
          60, lambda: f"the closed stream to be cancelled; {backend.stats()}")


@pytest.fixture(scope="module")
def two_slot_engine(embedded):
    from infer_lab.engine import Engine, EngineConfig

    return Engine.from_loaded(embedded, EngineConfig(max_num_seqs=2, max_model_len=128,
                                                     block_size=16))


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.8, "seed": 7}])
def test_a_paused_request_frees_its_blocks_and_resumes_to_the_same_answer(
    two_slot_engine, embedded, sampling
):
    """The engine's pause, as the server uses it: slot and blocks back at once, and after the
    resume the same tokens an uninterrupted run gives (greedy, and seeded sampling)."""
    from infer_lab.engine import SamplingParams

    engine, n_tokens = two_slot_engine, 24
    prompts = [embedded.tokenizer.encode(p) for p in ("Once upon a time", "The sea is")]
    params = SamplingParams(max_tokens=n_tokens, ignore_eos=True, **sampling)
    expected = [out.token_ids for out in engine.generate(prompts, params)]
    for rid in list(engine.requests):
        engine.release(rid)

    kept, paused = (engine.add_request(ids, params) for ids in prompts)
    for _ in range(6):
        engine.step()
    assert engine.pause(paused) and not engine.pause(paused)  # once
    held_by_kept = len(engine.requests[kept].block_table)
    assert engine.kv.num_used_blocks() == held_by_kept  # the paused one holds none
    assert engine.scheduler.running == [engine.requests[kept]]
    while engine.has_unfinished():  # the other one finishes alone: the paused one waits
        engine.step()
    assert len(engine.output(paused).token_ids) < n_tokens and engine.kv.pool.all_free()
    assert engine.resume(paused) and not engine.resume(paused)
    while engine.has_unfinished():
        engine.step()
    assert [engine.output(rid).token_ids for rid in (kept, paused)] == expected

    # Cancelling a paused request ends it (once) and frees everything.
    again = engine.add_request(prompts[0], params)
    engine.step()
    assert engine.pause(again) and engine.cancel(again) and not engine.cancel(again)
    assert not engine.resume(again) and engine.output(again).finish_reason == "cancelled"
    assert engine.paused == {} and engine.kv.pool.all_free()
    assert not engine.pause("no-such-request") and not engine.pause(kept)  # unknown, finished
    for rid in list(engine.requests):
        engine.release(rid)

