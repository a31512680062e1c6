"""Schema-driven fuzzing of the live server: schemathesis reads /openapi.json and sends what
it allows (and what it forbids) to every route, POST bodies included since they are declared.

Every response is checked: no 5xx, status codes, content types, headers and bodies as the
document says, schema-valid requests accepted and invalid ones rejected. Bounded and
derandomized, so it is the same short run every time (under a minute on 2 cores).
"""

from __future__ import annotations

import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402  (after the importorskip)
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402

from infer_lab.server import ServerThread, build_app  # noqa: E402

MODEL = "smollm2-135m"
KEY = "sk-fuzz"
MAX_MODEL_LEN = 16  # short answers keep every generated request cheap

CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            # A schema-valid prompt can still be too long for the context once tokenized,
            # or prompt + max_tokens can exceed it: a 400 (context_length_exceeded) is right.
            "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401", "404"]},
        },
    }
)


@pytest.fixture(scope="module")
def fuzzed_server(embedded):
    app = build_app(
        embedded,
        "ours",
        max_model_len=MAX_MODEL_LEN,
        api_key=KEY,
        block_size=16,
        num_blocks=16,
        max_num_seqs=4,
    )
    with ServerThread(app) as srv:
        yield srv
        engine = app.state.backend.engine
        deadline = time.monotonic() + 60
        while not app.state.backend.is_idle() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.kv.pool.all_free()  # nothing the fuzzer sent leaked a block


def _documented_combination(body, error: dict) -> bool:
    """logprobs with stream=true ("not with stream=true"), or top_logprobs without logprobs
    ("with logprobs: ..."): refused with a 400 that names the field."""
    if not isinstance(body, dict):
        return False
    wants_logprobs = body.get("logprobs") is not None and body.get("logprobs") is not False  # 0 asks too
    if error["param"] == "logprobs" and error["code"] == "unsupported_parameter":
        return wants_logprobs and body.get("stream") is True
    if error["param"] == "top_logprobs":
        return bool(body.get("top_logprobs")) and body.get("logprobs") is not True
    return False


def _fuzz(schema, mode, examples: int) -> list[int]:
    statuses: list[int] = []

    @given(case=schema.as_strategy(mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        body = case.body
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            # Most bodies name the served model, so they reach tokenizing and generation
            # instead of stopping at the 404 for an unknown model.
            body["model"] = MODEL
        response = case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        statuses.append(response.status_code)
        if mode == GenerationMode.POSITIVE and response.status_code == 400:
            # Schema-valid requests we may refuse: too long or empty once tokenized (a text of
            # control characters can map to no token), or one of the two combinations of fields
            # that the schema's descriptions rule out (a schema cannot).
            error = response.json()["error"]
            tokenized = error["code"] == "context_length_exceeded" or (
                error["param"] == "prompt" and error["message"].startswith("the prompt is empty once tokenized"))
            assert tokenized or _documented_combination(body, error), response.text

    check()
    return statuses


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_the_server_keeps_its_documented_contract(fuzzed_server, mode):
    schema = schemathesis.openapi.from_url(
        fuzzed_server.url + "/openapi.json", config=CONFIG, headers={"Authorization": f"Bearer {KEY}"}
    )
    generation_mode = GenerationMode.POSITIVE if mode == "positive" else GenerationMode.NEGATIVE
    posts = _fuzz(schema.include(method="POST"), generation_mode, examples=30)
    assert len(posts) >= 15 and all(status < 500 for status in posts)
    if mode == "positive":
        assert 200 in posts  # generation itself was reached, not only rejections
        # The GET routes take no input: a few calls check their status, type and body.
        gets = _fuzz(schema.include(method="GET"), generation_mode, examples=8)
        assert len(gets) >= 4 and all(status < 500 for status in gets)
