"""One client never stalls or breaks the others (issue 14), over real HTTP on 127.0.0.1.

Every case runs against a live server on the embedded model, and ends by checking that the
server still serves, that ``/health`` still answers at once, and that every KV block is back
in the pool. Responsiveness is measured as the slowest of several concurrent ``/health``
probes sent while the bad traffic runs: a blocked event loop delays every probe in flight.
A healthy loop answers in milliseconds (about 0.1 s at worst on a 2-core machine with other
work); the bound is 1 s. Where the cause can be checked exactly, it is too: only the
engine's own thread ever calls the engine, so the event loop never waits on its lock.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from machine_speed import latency_bound, session
from prometheus_client.parser import text_string_to_metric_families

from infer_lab.server import ServerThread, build_app
from infer_lab.server.app import ServerConfig, create_app
from infer_lab.server.backends import HFBackend
from infer_lab.server.text import TextStream

MODEL = "smollm2-135m"
KEY = "sk-reliability"
AUTH = {"Authorization": f"Bearer {KEY}"}
# /health must answer while the engine works: the stalls this guards against lasted seconds. A full
# CI run (a second test lane busy on the other core) once measured 1.03 s here, so the bound is 1.5 s.
HEALTH_BOUND_S = 1.5
OK = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def ours(embedded):
    app = build_app(
        embedded,
        "ours",
        max_model_len=256,
        api_key=KEY,
        # Room for the report's 5.3 MB prompt, which takes seconds to tokenize.
        max_body_bytes=6 * 2**20,
        block_size=16,
        num_blocks=128,
        max_num_seqs=16,
    )
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def hf(embedded):
    with ServerThread(build_app(embedded, "hf", max_model_len=256, api_key=KEY)) as srv:
        yield srv


@pytest.fixture(params=["ours", "hf"])
def server(request):
    """Both engines: client mistakes are rejected before either backend sees them."""
    return request.getfixturevalue(request.param)


def _backend(srv):
    return srv.server.config.app.state.backend


def _wait_idle(srv, timeout_s: float | None = None) -> None:
    """Wait until the backend is idle: up to ``timeout_s`` (default 60 s on the reference machine, scaled)."""
    backend = _backend(srv)
    deadline = time.monotonic() + session().scale(60.0 if timeout_s is None else timeout_s)
    if hasattr(backend, "engine"):
        while not backend.is_idle() and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        while backend.stats()["running"] + backend.stats()["waiting"] and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)


def _assert_still_healthy(srv) -> None:
    """After every case: nothing runs, every block is free, /health is quick, a request works."""
    _wait_idle(srv)
    backend = _backend(srv)
    if hasattr(backend, "engine"):
        engine = backend.engine
        assert not engine.has_unfinished() and engine.blocks_in_use_by_requests() == 0
        engine.reset_prefix_cache()
        assert engine.kv.pool.all_free()
    t0 = time.perf_counter()
    assert httpx.get(srv.url + "/health", timeout=10).json() == {"status": "ok"}
    took = time.perf_counter() - t0
    assert took < latency_bound(HEALTH_BOUND_S), session().explain("/health", took, HEALTH_BOUND_S)
    after = httpx.post(srv.url + "/v1/completions", json=OK, headers=AUTH, timeout=120)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 2
    _wait_idle(srv)
    if hasattr(backend, "engine"):
        assert backend.engine.kv.pool.all_free()


async def _slowest_health_during(url: str, load, probers: int = 4) -> tuple[object, float]:
    """Run ``load`` (a coroutine) while ``probers`` clients poll /health; (its result, slowest s)."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def probe(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            resp = await client.get(url + "/health")
            latencies.append(time.perf_counter() - t0)
            assert resp.status_code == 200
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(timeout=60) as client:
        tasks = [asyncio.create_task(probe(client)) for _ in range(probers)]
        await asyncio.sleep(0.1)  # the probes are running before the load starts
        try:
            result = await load
        finally:
            done.set()
            await asyncio.gather(*tasks)
    assert len(latencies) >= probers
    return result, max(latencies)


def _error_count(srv, status: int) -> float:
    text = httpx.get(srv.url + "/metrics", headers=AUTH, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "infer_lab:request_errors_total" and sample.labels == {
                "status": str(status)
            }:
                return sample.value
    return 0.0


def _post_raw(srv, body: bytes, path: str = "/v1/completions", **headers) -> httpx.Response:
    headers = {**AUTH, "Content-Type": "application/json", **headers}
    return httpx.post(srv.url + path, content=body, headers=headers, timeout=120)


# ---------------------------------------------------------------------------------------------
# Must fix 1: cancelling never blocks the event loop


def _record_engine_callers(engine, monkeypatch) -> set[str]:
    """Names of the threads that call the engine, through its public methods, from now on."""
    callers: set[str] = set()
    for name in ("add_request", "cancel", "step", "has_unfinished", "release", "output"):
        method = getattr(engine, name)

        def spy(*args, _method=method, **kwargs):
            callers.add(threading.current_thread().name)
            return _method(*args, **kwargs)

        monkeypatch.setattr(engine, name, spy)
    return callers


def test_health_answers_while_20_clients_disconnect_mid_stream(ours, monkeypatch):
    backend = _backend(ours)
    cancelled_before = backend.finished_counts.get("cancelled", 0)
    url = ours.url
    callers = _record_engine_callers(backend.engine, monkeypatch)

    async def leave_after(client: httpx.AsyncClient, i: int) -> None:
        body = {**OK, "prompt": f"Count to a thousand, {i}:", "max_tokens": 200, "stream": True}
        async with client.stream(
            "POST", url + "/v1/completions", json={**body, "ignore_eos": True}, headers=AUTH
        ) as resp:
            seen = 0
            async for line in resp.aiter_lines():
                seen += line.startswith("data:")
                if seen >= 2 + i % 3:
                    return  # leaving the block hangs up mid-stream

    async def stream_to_the_end(client: httpx.AsyncClient, i: int) -> str:
        body = {**OK, "prompt": f"Story {i}:", "max_tokens": 40, "stream": True}
        async with client.stream(
            "POST", url + "/v1/completions", json={**body, "ignore_eos": True}, headers=AUTH
        ) as resp:
            lines = [ln async for ln in resp.aiter_lines() if ln.startswith("data:")]
        return lines[-1]

    async def load():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            streams = [asyncio.create_task(stream_to_the_end(client, i)) for i in range(4)]
            await asyncio.gather(*(leave_after(client, i) for i in range(20)))
            return await asyncio.gather(*streams)

    last_lines, slowest = asyncio.run(_slowest_health_during(url, load()))
    # The cause, checked exactly: only the step thread calls the engine (and so takes its
    # lock); the event loop only queues commands. Then the effect, measured.
    assert callers == {"engine-step"}
    assert slowest < latency_bound(HEALTH_BOUND_S), session().explain("/health while clients left", slowest, HEALTH_BOUND_S)
    assert last_lines == ["data: [DONE]"] * 4  # the others streamed to the end
    deadline = time.monotonic() + 60
    while backend.finished_counts.get("cancelled", 0) < cancelled_before + 20:
        assert time.monotonic() < deadline, "not every abandoned stream was cancelled"
        time.sleep(0.05)
    assert backend.finished_counts["cancelled"] == cancelled_before + 20
    monkeypatch.undo()
    _assert_still_healthy(ours)


# ---------------------------------------------------------------------------------------------
# Must fix 2: tokenizing off the loop, a body-size cap, bounded stop strings


def test_huge_prompts_are_tokenized_off_the_event_loop(ours):
    # 5.3 MB as in the report, under the cap: seconds of tokenizing, then a 400 (too long).
    # On the event loop each one would stall every client for that long.
    text = "word " * 1_060_000
    url = ours.url

    async def load():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as client:
            return await asyncio.gather(
                client.post(url + "/v1/completions", json={**OK, "prompt": text}),
                client.post(
                    url + "/v1/chat/completions",
                    json={"model": MODEL, "messages": [{"role": "user", "content": text}]},
                ),
            )

    responses, slowest = asyncio.run(_slowest_health_during(url, load()))
    assert slowest < latency_bound(HEALTH_BOUND_S), session().explain("/health while prompts tokenized", slowest, HEALTH_BOUND_S)
    for resp in responses:
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "context_length_exceeded"
    _assert_still_healthy(ours)


def test_bodies_over_the_cap_get_an_openai_413(ours):
    limit = ours.server.config.app.state.config.max_body_bytes
    big = json.dumps({**OK, "prompt": "x" * (limit + 1)}).encode()
    resp = _post_raw(ours, big)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    assert str(limit) in resp.json()["error"]["message"]

    def chunks():  # no Content-Length: the server counts what arrives
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    resp = httpx.post(
        ours.url + "/v1/completions",
        content=chunks(),
        headers={**AUTH, "Content-Type": "application/json"},
        timeout=60,
    )
    assert resp.status_code == 413 and resp.json()["error"]["type"] == "invalid_request_error"
    # The case of the report, 300,000 stop strings in 4.5 MB, gets a 400 (at most 4), and
    # twice as many strings a 413 (over the cap).
    many_stops = json.dumps({**OK, "stop": ["abcdefghijk"] * 300_000}).encode()
    assert len(many_stops) < limit and _post_raw(ours, many_stops).status_code == 400
    many_stops = json.dumps({**OK, "stop": ["abcdefghijk"] * 600_000}).encode()
    assert len(many_stops) > limit and _post_raw(ours, many_stops).status_code == 413
    _assert_still_healthy(ours)


@pytest.mark.parametrize(
    "stop",
    [["a", "b", "c", "d", "e"], "x" * 257, [""], ["ok", 7]],
    ids=["five", "too_long", "empty", "not_a_string"],
)
def test_stop_strings_are_capped_like_openai(server, stop):
    resp = httpx.post(
        server.url + "/v1/completions", json={**OK, "stop": stop}, headers=AUTH, timeout=60
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"].startswith("stop") and "at most 4 strings" in error["message"]
    _assert_still_healthy(server)


def test_four_stop_strings_still_work(ours):
    body = {**OK, "prompt": "1, 2, 3, 4,", "max_tokens": 12, "stop": [" 9", " 8", " 7", "zz"]}
    resp = httpx.post(ours.url + "/v1/completions", json=body, headers=AUTH, timeout=120)
    assert resp.status_code == 200
    text = resp.json()["choices"][0]["text"]
    assert resp.json()["choices"][0]["finish_reason"] == "stop" and " 7" not in text
    _assert_still_healthy(ours)


class _CharTokenizer:
    """One token per character; ids are code points."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def _reference_stream(text: str, stops: list[str]) -> str:
    """What a client must get: the text up to the first stop string to complete."""
    for end in range(1, len(text) + 1):
        hits = [i for i in (text[:end].find(s) for s in stops if s) if i != -1]
        if hits:
            return text[: min(hits)]
    return text


def test_stop_matching_holds_at_most_the_longest_stop_minus_one_character():
    """Each token searches only the new text plus a tail shorter than the longest stop string."""
    import random

    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("abcab ") for _ in range(rng.randrange(1, 60)))
        stops = ["".join(rng.choice("abc ") for _ in range(rng.randrange(1, 6))) for _ in range(3)]
        ts = TextStream(_CharTokenizer(), stops)
        out = []
        for ch in text:
            out.append(ts.add(ord(ch)))
            assert len(ts._unsent) <= max(map(len, stops)) - 1
            if ts.stopped:
                break
        out.append(ts.flush())
        assert "".join(out) == _reference_stream(text, stops)


def test_incremental_decoding_matches_a_full_decode_with_a_short_window(embedded):
    tok = embedded.tokenizer
    text = "Les élèves écrivent 日本語 😀👍🏽 and plain words. " * 40
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ts = TextStream(tok, stop=["never there"])
    widest, pieces = 0, []
    for token in ids:
        pieces.append(ts.add(token))
        widest = max(widest, len(ts.token_ids) - ts._window_start)
    pieces.append(ts.flush())
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
    assert widest <= 6  # tokens decoded per step: a few, not the whole answer (len(ids) > 1000)


# ---------------------------------------------------------------------------------------------
# Must fix 3: a lone surrogate is a clean 400, counted, on both engines


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_lone_surrogate_is_a_clear_400_and_counted(server, route):
    before = _error_count(server, 400)
    if route == "/v1/completions":
        body = b'{"model": "smollm2-135m", "prompt": "lone \\ud800 x", "max_tokens": 2}'
    else:
        body = (
            b'{"model": "smollm2-135m", "max_tokens": 2, '
            b'"messages": [{"role": "user", "content": "lone \\ud800 x"}]}'
        )
    resp = _post_raw(server, body, route)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert "lone surrogate" in error["message"] and "U+D800" in error["message"]
    assert error["type"] == "invalid_request_error"
    assert _error_count(server, 400) == before + 1
    _assert_still_healthy(server)


def test_an_unexpected_failure_is_an_openai_500_in_the_metrics(embedded):
    class BrokenTokenizer:
        def __call__(self, *args, **kwargs):
            raise RuntimeError("tokenizer exploded")

        def __len__(self):
            return 49152

    cfg = ServerConfig(model_name=MODEL, max_model_len=64)
    with ServerThread(create_app(HFBackend(embedded), BrokenTokenizer(), cfg)) as srv:
        resp = httpx.post(srv.url + "/v1/completions", json=OK, timeout=30)
        assert resp.status_code == 500
        assert resp.json()["error"]["type"] == "server_error"
        assert "tokenizer exploded" in resp.json()["error"]["message"]
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'infer_lab:request_errors_total{status="500"} 1.0' in metrics
        assert httpx.get(srv.url + "/health").status_code == 200


# ---------------------------------------------------------------------------------------------
# Must fix 4 and should fix 5: validated once, before either backend, with strict types


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    "change, param",
    [
        ({"prompt": [99999999]}, "prompt.0"),
        ({"prompt": [-1, 5]}, "prompt.0"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"prompt": [True, False]}, "prompt.0"),
        ({"max_tokens": True}, "max_tokens"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ],
    ids=[
        "id_too_big",
        "id_negative",
        "seed_2_64",
        "seed_below",
        "bools",
        "max_tokens_bool",
        "str_bool",
    ],
)
def test_client_mistakes_are_400_on_both_engines(server, change, param, stream):
    body = {**OK, **change, "stream": stream}
    resp = httpx.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 400  # never a 200 followed by an error event, never a 500
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    _assert_still_healthy(server)


def test_token_ids_and_seeds_inside_the_range_are_accepted(server):
    body = {**OK, "prompt": [0, 49151, 5], "seed": 2**63 - 1, "temperature": 1.0}
    resp = httpx.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=120)
    assert resp.status_code == 200 and resp.json()["usage"]["prompt_tokens"] == 3
    _assert_still_healthy(server)


# ---------------------------------------------------------------------------------------------
# Should fix 6-9: Allow on 405, the OpenAPI document, the API key, Content-Type


def test_405_says_which_methods_are_allowed(ours):
    resp = httpx.get(ours.url + "/v1/completions", headers=AUTH)
    assert resp.status_code == 405 and resp.headers["allow"] == "POST"
    assert resp.json()["error"]["message"]
    resp = httpx.delete(ours.url + "/health")
    assert resp.status_code == 405 and set(resp.headers["allow"].split(", ")) == {"GET", "HEAD"}
    assert resp.json()["error"]["code"] == "method_not_allowed"  # codes are strings
    head = httpx.head(ours.url + "/health")  # what load balancers probe with
    assert head.status_code == 200 and head.content == b""
    _assert_still_healthy(ours)


def test_openapi_documents_the_bodies_the_limits_and_plain_text_metrics(ours):
    # Under --api-key the document needs the key: it names the model (maybe a local path).
    assert httpx.get(ours.url + "/openapi.json").status_code == 401
    spec = httpx.get(ours.url + "/openapi.json", headers=AUTH).json()
    schemas = spec["components"]["schemas"]
    for path, name in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
    ):
        post = spec["paths"][path]["post"]
        body = post["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
        assert "422" not in post["responses"]  # we answer 400, as OpenAI
        assert {"400", "401", "404", "413", "415"} <= set(post["responses"])
        assert "text/event-stream" in post["responses"]["200"]["content"]
        assert post["security"] == [{"bearer": []}]
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]["oneOf"]
    ids = next(option for option in prompt if option.get("items", {}).get("type") == "integer")
    assert ids["items"]["exclusiveMaximum"] == 49152 and ids["items"]["minimum"] == 0
    seed = schemas["CompletionRequest"]["properties"]["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["maximum"]) == (-(2**63), 2**63 - 1)
    stop = schemas["CompletionRequest"]["properties"]["stop"]["anyOf"][0]["oneOf"]
    assert any(option.get("maxItems") == 4 for option in stop)
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    assert "security" not in spec["paths"]["/health"]["get"]
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_api_key_scheme_is_case_insensitive_and_compared_in_constant_time(ours, monkeypatch):
    import infer_lab.server.app as app_module

    compared = []
    real = app_module.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(app_module.hmac, "compare_digest", spy)
    for scheme in ("Bearer", "bearer", "BEARER"):
        resp = httpx.get(ours.url + "/v1/models", headers={"Authorization": f"{scheme} {KEY}"})
        assert resp.status_code == 200
    assert compared == [(KEY.encode(), KEY.encode())] * 3
    wrong = httpx.get(ours.url + "/v1/models", headers={"Authorization": "Bearer sk-nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert httpx.get(ours.url + "/v1/models", headers={"Authorization": KEY}).status_code == 401
    _assert_still_healthy(ours)


def test_version_needs_the_key_health_and_metrics_stay_open(ours):
    assert httpx.get(ours.url + "/version").status_code == 401
    assert httpx.get(ours.url + "/version", headers=AUTH).json()["engine"] == "ours"
    assert httpx.get(ours.url + "/health").status_code == 200
    assert httpx.get(ours.url + "/metrics").status_code == 200  # open, as in vLLM


def test_protect_metrics_puts_metrics_behind_the_key(embedded):
    app = build_app(embedded, "hf", max_model_len=64, api_key=KEY, protect_metrics=True)
    with ServerThread(app) as srv:
        assert httpx.get(srv.url + "/metrics").status_code == 401
        assert httpx.get(srv.url + "/metrics", headers=AUTH).status_code == 200
        assert httpx.get(srv.url + "/health").status_code == 200


@pytest.mark.parametrize(
    "content_type, status",
    [
        (None, 415),
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),  # what curl -d sends without -H
        ("application/json; charset=utf-8", 200),
        ("application/merge-patch+json", 200),
    ],
)
def test_only_json_bodies_are_read(ours, content_type, status):
    headers = dict(AUTH)
    if content_type:
        headers["Content-Type"] = content_type
    body = json.dumps(OK).encode()
    resp = httpx.post(ours.url + "/v1/completions", content=body, headers=headers, timeout=120)
    assert resp.status_code == status
    if status == 415:
        assert resp.json()["error"]["code"] == "unsupported_media_type"
        assert "application/json" in resp.json()["error"]["message"]
    _assert_still_healthy(ours)


def test_server_timing_reports_the_servers_own_clock(ours):
    body = {**OK, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream(
        "POST", ours.url + "/v1/completions", json=body, headers=AUTH, timeout=120
    ) as resp:
        lines = [ln[5:] for ln in resp.iter_lines() if ln.startswith("data:")]
    last = json.loads(lines[-2])
    timing = last["server_timing"]
    assert last["usage"]["completion_tokens"] == 2
    assert 0 <= timing["preprocess_s"] and 0 < timing["ttft_s"] <= timing["e2e_s"]
    text = httpx.get(ours.url + "/metrics").text
    assert "infer_lab:request_preprocess_seconds_count" in text
    _assert_still_healthy(ours)


def test_near_zero_temperature_or_top_p_is_greedy_and_fails_nobody(ours):
    """1e-300 overflows logits / T and 1e-323 is 0 in float32: the sampler would get NaN and
    fail every request of the batch. Both mean "the most likely token", so both are greedy."""
    bodies = [
        {**OK, "max_tokens": 8, "temperature": 1e-300},
        {**OK, "max_tokens": 8, "temperature": 1.5, "top_p": 1e-323},
        {**OK, "max_tokens": 8, "temperature": 0},
    ]

    async def together():
        async with httpx.AsyncClient(timeout=120, headers=AUTH) as client:
            return await asyncio.gather(
                *(client.post(ours.url + "/v1/completions", json=body) for body in bodies)
            )

    responses = asyncio.run(together())
    assert [r.status_code for r in responses] == [200, 200, 200]
    texts = {r.json()["choices"][0]["text"] for r in responses}
    assert len(texts) == 1  # all three are the greedy answer
    _assert_still_healthy(ours)
