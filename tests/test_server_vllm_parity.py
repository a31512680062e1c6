"""The server keeps vLLM 0.32's conventions, so one client measures both the same way.

- ``usage.completion_tokens`` counts the EOS that ended the answer (vLLM appends it to the
  output before its stop check: vllm/v1/core/sched/scheduler.py ``_update_request_with_output``,
  vllm/v1/core/sched/utils.py ``check_stop``), and after a stop string the tokens up to the one
  that completed it (vllm/v1/engine/detokenizer.py ``update``);
- the request bodies of ``vllm bench serve --backend openai`` and ``--backend openai-chat``
  (vllm/benchmarks/lib/endpoint_request_func.py) are accepted, sampling parameters at their
  no-op values included, and their streams parse as vLLM's client parses them;
- ``return_token_ids`` returns the ids in vLLM's fields (vllm/entrypoints/openai/completion and
  chat_completion, protocol.py and serving.py).

Each test runs on our engine and on the HF baseline, against transformers' greedy ``generate``.
"""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from infer_lab.server import ServerThread, build_app
from infer_lab.server.schemas import NEUTRAL_ONLY

MODEL = "smollm2-135m"
QUESTION = "What is the capital of France?"
EOS = 2  # SmolLM2's <|im_end|>: the chat answer to QUESTION ends on it
COUNTING = "1, 2, 3, 4,"


@pytest.fixture(scope="module", params=["ours", "hf"])
def server(request, embedded):
    with ServerThread(build_app(embedded, request.param, max_model_len=256)) as srv:
        yield srv


def _greedy(lm, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ids after ``prompt_ids``; it stops on EOS and keeps it, as vLLM does."""
    with torch.inference_mode():
        out = lm.model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False
        )
    return out[0, len(prompt_ids) :].tolist()


def _chat_body(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0, **extra}


def _post(srv, route: str, body: dict) -> dict:
    resp = httpx.post(srv.url + route, json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _stream(srv, route: str, body: dict, headers: dict | None = None) -> list[dict]:
    """The JSON chunks of a streamed request, ending with [DONE] checked."""
    with httpx.stream("POST", srv.url + route, json={**body, "stream": True},
                      headers=headers, timeout=120) as resp:
        assert resp.status_code == 200, resp.read().decode()
        data = [line[5:].strip() for line in resp.iter_lines() if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _generated_tokens(srv) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    line = next(ln for ln in text.splitlines()
                if ln.startswith("infer_lab:generation_tokens_total "))
    return float(line.split()[1])


def test_completion_tokens_count_the_eos_that_ended_the_answer(server, embedded):
    prompt = embedded.chat_ids(QUESTION)[0].tolist()
    ref = _greedy(embedded, prompt, 16)
    assert ref[-1] == EOS and len(ref) < 16  # the precondition: the model stops on EOS
    text = embedded.tokenizer.decode(ref, skip_special_tokens=True)
    usage_each = {"prompt_tokens": len(prompt), "completion_tokens": len(ref),
                  "total_tokens": len(prompt) + len(ref)}
    before = _generated_tokens(server)

    chat = _post(server, "/v1/chat/completions", _chat_body(max_tokens=16))
    assert chat["usage"] == usage_each
    assert chat["choices"][0]["message"]["content"] == text  # the EOS is counted, not sent
    assert chat["choices"][0]["finish_reason"] == "stop"
    chunks = _stream(server, "/v1/chat/completions",
                     _chat_body(max_tokens=16, stream_options={"include_usage": True}))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == text
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == usage_each

    comp_body = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    comp = _post(server, "/v1/completions", comp_body)
    assert comp["usage"] == usage_each and comp["choices"][0]["text"] == text
    chunks = _stream(server, "/v1/completions",
                     {**comp_body, "stream_options": {"include_usage": True}})
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == text
    assert chunks[-1]["usage"] == usage_each
    # The server's own counter counts what usage counts.
    assert _generated_tokens(server) - before == 4 * len(ref)

    # Logprobs: one entry per counted token, the EOS last (as vLLM).
    scored = _post(server, "/v1/chat/completions",
                   _chat_body(max_tokens=16, logprobs=True))["choices"][0]["logprobs"]["content"]
    assert len(scored) == len(ref)
    assert scored[-1]["token"] == embedded.tokenizer.decode([EOS])


def test_ignore_eos_reports_exactly_max_tokens(server):
    for route, body in (
        ("/v1/chat/completions", _chat_body(max_tokens=12, ignore_eos=True)),
        ("/v1/completions", {"model": MODEL, "prompt": QUESTION, "max_tokens": 12,
                             "temperature": 0, "ignore_eos": True}),
    ):
        answer = _post(server, route, body)
        assert answer["usage"]["completion_tokens"] == 12
        assert answer["choices"][0]["finish_reason"] == "length"
        chunks = _stream(server, route, {**body, "stream_options": {"include_usage": True}})
        assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_a_stop_string_counts_the_tokens_up_to_the_one_that_completed_it(server, embedded):
    prompt = embedded.tokenizer(COUNTING, add_special_tokens=False)["input_ids"]
    ref = _greedy(embedded, prompt, 30)
    decode = embedded.tokenizer.decode
    n = next(k for k in range(1, len(ref) + 1) if " 7" in decode(ref[:k]))
    assert n > 1 and decode(ref[n - 1 : n]).strip() == "7"  # " 7" ends within token n
    body = {"model": MODEL, "prompt": COUNTING, "max_tokens": 30, "temperature": 0,
            "stop": [" 7"], "return_token_ids": True}
    answer = _post(server, "/v1/completions", body)
    choice = answer["choices"][0]
    assert choice["text"] == decode(ref[:n]).split(" 7")[0] and choice["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == n and choice["token_ids"] == ref[:n]


def _vllm_bench_client(chunks: list[dict], chat: bool) -> dict:
    """What vllm/benchmarks/lib/endpoint_request_func.py takes from a stream: text from the
    chunks with choices (each one a token arrival for TTFT and ITL), output_tokens from usage."""
    out = {"generated_text": "", "arrivals": 0, "output_tokens": None, "prompt_len": None}
    for data in chunks:
        if choices := data.get("choices"):
            piece = choices[0]["delta"].get("content") if chat else choices[0].get("text")
            out["generated_text"] += piece or ""
            out["arrivals"] += 1
        elif usage := data.get("usage"):
            out["output_tokens"] = usage.get("completion_tokens")
            out["prompt_len"] = usage.get("prompt_tokens")
    return out


# vllm bench serve's sampling flags (--temperature 0 --top-p 1 --top-k -1 --min-p 0
# --frequency-penalty 0 --presence-penalty 0 --repetition-penalty 1) at their no-op values:
# serve.py puts them in the body (extra_body) as they are.
NEUTRAL_FLAGS = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "temperature": 0.0,
                 "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}


@pytest.mark.parametrize("flags", [{}, NEUTRAL_FLAGS], ids=["defaults", "neutral_flags"])
def test_vllm_bench_serve_bodies_are_accepted_and_streamed_with_usage(server, embedded, flags):
    prompt = "The history of the city of Paris began"
    n_prompt = len(embedded.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    headers = {"x-request-id": "bench-0123abcd-0"}  # vLLM's client names every request
    # --backend openai: async_request_openai_completions' payload, with --ignore-eos (the
    # default for the random dataset) and the flags.
    completions = {
        "model": MODEL,
        "prompt": prompt,
        "repetition_penalty": 1.0,
        "max_tokens": 10,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        **flags,
    }
    got = _vllm_bench_client(_stream(server, "/v1/completions", completions, headers), chat=False)
    assert got["output_tokens"] == 10 and got["prompt_len"] == n_prompt
    # Up to 10 token chunks, and the one with finish_reason (here a chunk of its own).
    assert got["generated_text"] and 1 <= got["arrivals"] <= 11
    # --backend openai-chat: async_request_openai_chat_completions' payload.
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
        "max_completion_tokens": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        **flags,
    }
    got = _vllm_bench_client(_stream(server, "/v1/chat/completions", chat, headers), chat=True)
    chat_prompt = embedded.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True,
        return_dict=True)["input_ids"]
    assert got["output_tokens"] == 10 and got["prompt_len"] == len(chat_prompt)
    assert got["generated_text"] and 2 <= got["arrivals"] <= 12  # the role chunk first


@pytest.mark.parametrize(
    "name, value",
    [("repetition_penalty", 1.1), ("presence_penalty", 0.5), ("frequency_penalty", -0.2),
     ("top_k", 40), ("min_p", 0.05), ("min_tokens", 3)],
)
def test_a_sampling_parameter_away_from_its_no_op_value_is_a_clear_400(server, name, value):
    for route, body in (("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
                        ("/v1/chat/completions", _chat_body(max_tokens=2))):
        resp = httpx.post(server.url + route, json={**body, name: value}, timeout=60)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        _accepted, says = NEUTRAL_ONLY[name]
        assert error["param"] == name
        assert f"{name} is not supported" in error["message"] and says in error["message"]
        assert repr(value) in error["message"]
        # The no-op value and null are accepted.
        for ok in (_accepted[0], None):
            assert httpx.post(server.url + route, json={**body, name: ok},
                              timeout=60).status_code == 200


def test_return_token_ids_are_transformers_greedy_ids(server, embedded):
    chat_prompt = embedded.chat_ids(QUESTION)[0].tolist()
    ref = _greedy(embedded, chat_prompt, 16)
    assert ref[-1] == EOS  # the EOS that ended the answer is among the ids, as in vLLM

    chat = _post(server, "/v1/chat/completions", _chat_body(max_tokens=16, return_token_ids=True))
    assert chat["prompt_token_ids"] == chat_prompt  # chat: at the top
    assert chat["choices"][0]["token_ids"] == ref
    assert chat["usage"]["completion_tokens"] == len(ref)
    chunks = _stream(server, "/v1/chat/completions",
                     _chat_body(max_tokens=16, return_token_ids=True))
    assert chunks[0]["prompt_token_ids"] == chat_prompt  # the role chunk
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks[1:] for t in c["choices"][0]["token_ids"]] == ref

    prompt = embedded.tokenizer(COUNTING, add_special_tokens=False)["input_ids"]
    ref = _greedy(embedded, prompt, 6)
    body = {"model": MODEL, "prompt": COUNTING, "max_tokens": 6, "temperature": 0,
            "return_token_ids": True}
    choice = _post(server, "/v1/completions", body)["choices"][0]
    assert choice["prompt_token_ids"] == prompt and choice["token_ids"] == ref  # in the choice
    chunks = _stream(server, "/v1/completions", body)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == ref

    # Not asked for: the responses are as before, without the fields.
    plain = _post(server, "/v1/chat/completions", _chat_body(max_tokens=4))
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
