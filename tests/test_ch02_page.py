"""Notebook 02's page is the experiment: its four ``@app.function`` experiments call the harness
directly, the chapter module only predicts and shows, and the counted effects (KV bytes, waiting
in line, one ITL sample per token) hold at the quick size."""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import SimpleNamespace

import pytest
from page_helpers import Stop, edited_notebook, experiment_calls

from infer_lab.analysis import memory
from infer_lab.analysis.compare import dtype_name, shape_of
from infer_lab.course import ch02_feel_the_pain as ch02
from infer_lab.course.notebook_code import notebook_function

EXPERIMENTS = {"kv_after_prefill": "run_memory", "ttft_by_prompt": "run_ttft",
               "serve_one_by_one_then_batched": "run_serving", "decode_step_times": "run_itl"}


def _part(run):
    """The chapter package's module that defines ``run`` (``kv_memory``, ``ttft``, ...): where it looks up
    the notebook's experiment."""
    return importlib.import_module(run.__module__)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_the_chapter_runs_the_notebooks_experiment_and_it_calls_the_harness(monkeypatch, embedded, name):
    """Each run_<part> calls the notebook's function with the size's knobs, and that function generates
    through the harness's ``timed_generate`` (stubbed where the notebook looks it up: it stops the run)."""
    sizes = ch02.sizes("cpu", "quick")
    reached = []

    def timed_generate(lm, *args, **options):
        reached.append(lm)
        raise Stop

    monkeypatch.setitem(notebook_function("02", name).__globals__, "timed_generate", timed_generate)
    run = getattr(ch02, EXPERIMENTS[name])
    (called, args), = experiment_calls(monkeypatch, _part(run), run, embedded, sizes)
    assert called == name and args["lm"] is embedded and reached == [embedded]
    knobs = {"kv_after_prefill": {"contexts": sizes.contexts, "users": sizes.users},
             "ttft_by_prompt": {"prompt_lens": sizes.ttft_lengths, "repeats": sizes.repeats},
             "serve_one_by_one_then_batched": {"n_requests": sizes.n_requests, "prompt_len": sizes.prompt_len,
                                               "new_tokens": sizes.new_tokens},
             "decode_step_times": {"steps": sizes.itl_steps}}[name]
    assert {k: args[k] for k in knobs} == knobs


def test_kv_bytes_grow_with_tokens_and_users_exactly_as_the_config_predicts(embedded):
    sizes = ch02.sizes("cpu", "quick")
    result = ch02.run_memory(embedded, sizes)
    per_token = memory.kv_bytes_per_token(shape_of(embedded), dtype_name(embedded))
    assert result.predicted_kv_bytes_per_token == per_token == 2 * 30 * 3 * 64 * 4  # SmolLM2, fp32
    by_axis = {axis: [p for p in result.points if p.axis == axis] for axis in ("context", "users")}
    short, long = by_axis["context"][0], by_axis["context"][-1]
    one, many = by_axis["users"][0], by_axis["users"][-1]
    assert long.context >= 4 * short.context and many.users >= 4 * one.users  # the quick size spans 4x
    assert long.kv_bytes * short.context == short.kv_bytes * long.context  # linear in the tokens
    assert many.kv_bytes * one.users == one.kv_bytes * many.users  # linear in the users
    assert all(p.kv_bytes == per_token * p.tokens for p in result.points)
    assert "**4.00×** the KV bytes" in ch02.memory_text(result)


def test_naive_serving_makes_each_request_wait_for_the_ones_before(embedded):
    sizes = replace(ch02.sizes("cpu", "quick"), n_requests=3, prompt_len=8, new_tokens=2)
    serving = ch02.run_serving(embedded, sizes)
    seq = [r for r in serving.requests if r.mode == "sequential"]
    batched = [r for r in serving.requests if r.mode == "batched"]
    assert len(seq) == len(batched) == 3
    assert seq[0].start_s == 0 or seq[0].start_s < seq[0].finish_s
    for before, after in zip(seq, seq[1:], strict=False):  # in line: nobody starts before the one ahead finished
        assert after.start_s >= before.finish_s
    assert all(r.start_s == 0.0 for r in batched)  # together: nobody waits
    assert "measured ÷ predicted" in ch02.serving_compare_text(embedded, serving, 2.0)


def test_every_token_after_the_first_is_one_decode_step_and_kv_grows_with_the_batch(embedded):
    sizes = replace(ch02.sizes("cpu", "quick"), itl_contexts=(8,), itl_batches=(1, 4), itl_steps=3)
    points = {p.batch: p for p in ch02.run_itl(embedded, sizes)}
    assert all(p.steps == 3 for p in points.values())  # steps ITL samples for steps + 1 tokens
    assert points[4].kv_bytes == 4 * points[1].kv_bytes  # each sequence keeps its own KV
    # the prediction on the page: 4x the sequences move far less than 4x the bytes (weights read once)
    assert ch02.decode_bytes(embedded, 4, 8) < 1.2 * ch02.decode_bytes(embedded, 1, 8)


def test_ttft_prediction_is_more_work_than_the_token_ratio(embedded):
    a, b = 32, 256
    assert ch02.prefill_flops(embedded, b) / ch02.prefill_flops(embedded, a) > b / a  # attention grows faster
    sizes = replace(ch02.sizes("cpu", "quick"), ttft_lengths=(4, 8), repeats=1)
    points = ch02.run_ttft(embedded, sizes)
    assert [p.prompt_len for p in points] == [4, 8] and points[0].machine is not None
    assert "your guess **3×**" in ch02.ttft_compare_text(embedded, points, 3.0)


@pytest.mark.slow
def test_changing_the_users_in_the_cell_changes_the_kv_bytes_as_the_chapter_says(embedded, tmp_path):
    pytest.importorskip("marimo")
    import marimo as mo

    from infer_lab.course import nb

    sizes = replace(ch02.sizes("cpu", "quick"), contexts=(16,))
    cell = edited_notebook("02", tmp_path, users=(1, 8)).kv_memory
    _, defs = cell.run(ch02=ch02, lm=embedded, mo=mo, nb=nb, sizes=sizes,
                       memory_button=SimpleNamespace(value=True))
    users = {p.users: p.kv_bytes for p in defs["memory"].points if p.axis == "users"}
    assert set(users) == {1, 8} and users[8] == 8 * users[1]  # 8 users keep 8x the KV
