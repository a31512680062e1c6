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

from infer_lab.server import ServerThread, build_app

MODEL = "smollm2-135m"
KEY = "sk-hostile"
AUTH = {"Authorization": f"Bearer {KEY}"}
OK = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, MAX_CONNECTIONS = 1.0, 1.5, 64


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


def _wait(predicate, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
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
        f"bodies max {max(body_kinds):.2f} s (deadline {HEADER_TIMEOUT_S}+{BODY_TIMEOUT_S} s)"
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
        assert max(latencies) < 1.0
    finally:
        for s in socks:
            s.close()
    gauge = _metric(guarded, "infer_lab:connections_limit")
    assert gauge == MAX_CONNECTIONS
